"""Path leases on the work repository (gitdrop lease) and the git hooks that honour
them there (gitdrop guard)."""

import os
from typing import Annotated, Optional

import typer

from .base import command, paint, short_id, sub_app, table
from ..errors import UsageError

lease_app = sub_app("lease", "Path leases: reserve paths or globs of the work repository, "
                    "exclusive or shared, for a time.")
guard_app = sub_app("guard", "The lease guard: git hooks in the work repository that refuse "
                    "commits touching another agent's exclusive lease.")

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_ttl(text: str) -> int:
    """'90', '90s', '30m', '2h', '1d' -> seconds."""
    t = (text or "").strip().lower()
    unit = _UNITS.get(t[-1:], None) if t else None
    digits = t[:-1] if unit else t
    if not digits.isdigit() or int(digits) <= 0:
        raise UsageError(f"bad ttl {text!r}", "give a time to live such as 600, 30m, 2h or 1d")
    return int(digits) * (unit or 1)


def _left(seconds: int) -> str:
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


@command(lease_app, "take")
def lease_take(s, glob: Annotated[str, typer.Argument(
                   help="A path or glob of the work repository ('**' spans directories).")],
               shared: Annotated[bool, typer.Option(
                   "--shared", help="Share it with other shared leases.")] = False,
               ttl: Annotated[str, typer.Option(
                   "--ttl", help="Time to live: 600, 30m, 2h, 1d (the room caps it).")] = "30m"):
    """Reserve a path or glob; refused, naming the holder, where another agent's live
    lease conflicts."""
    r = s.room.take_lease(s.agent, glob, shared, parse_ttl(ttl))
    s.emit({"lease": r}, f"lease {r['id']} on {r['glob']} ({r['mode']}) for "
           f"{_left(r['until'] - r['taken'])} [{short_id(r['commit'])}]")


@command(lease_app, "list")
def lease_list(s, all_: Annotated[bool, typer.Option(
        "--all", help="Include expired leases.")] = False):
    """The room's live leases (--all: expired ones too)."""
    leases = s.room.leases(live=not all_)

    def show():
        if not leases:
            print(f"no {'' if all_ else 'live '}leases in {s.room_name}")
            return
        table(["id", "glob", "mode", "holder", "left"],
              [(x["id"], x["glob"], (x["mode"], "yellow" if x["mode"] == "exclusive" else "cyan"),
                x["holder"], _left(x["left"]) if x["live"] else ("expired", "dim"))
               for x in leases])
    s.emit({"room": s.room_name, "leases": leases}, show)


@command(lease_app, "release")
def lease_release(s, which: Annotated[str, typer.Argument(
        help="The lease's id, or the glob of one of your leases.", metavar="ID|GLOB")]):
    """Release a lease (its holder, or a lead)."""
    r = s.room.release_lease(s.agent, which)
    s.emit({"lease": r}, f"lease {r['id']} on {r['glob']} released [{short_id(r['commit'])}]")


@command(guard_app, "install")
def guard_install(s, repo: Annotated[Optional[str], typer.Option(
                      "--repo", help="The work repository (default: the current directory).",
                      show_default=False)] = None,
                  force: Annotated[bool, typer.Option(
                      "--force", help="Replace pre-commit/pre-push hooks that are not "
                      "gitdrop's.")] = False):
    """Install pre-commit and pre-push hooks in the work repository that refuse work on
    paths another agent holds exclusively (bypass: GITDROP_GUARD=off or --no-verify)."""
    from .. import guard
    from ..core import default_hub
    r = guard.install(repo or os.getcwd(), s.hub_value or default_hub(), s.room_name,
                      s.agent_value, force)

    def show():
        who = r["agent"] or paint("the agent GITDROP_AGENT names at each commit (none is "
                                  "set here now: set it, or install again with --as "
                                  "team/name)", "yellow")
        print(f"guard installed in {r['repo']} for room {r['room']} as {who}")
        if not r["fetched"]:
            print(paint(f"could not fetch the room from {r['hub']}; the hooks will try again",
                        "yellow"))
    s.emit(r, show)


@command(guard_app, "check")
def guard_check(s, repo: Annotated[Optional[str], typer.Option(
        "--repo", help="The work repository (default: the current directory).",
        show_default=False)] = None):
    """Judge the staged changes as the pre-commit hook does (exit 1 if refused)."""
    from .. import guard
    path = repo or os.getcwd()
    paths, links = guard.staged_paths(path)
    code = guard.judge(path, paths, "commit", links)
    if code:
        raise typer.Exit(1)
    s.emit({"ok": True}, "no staged path is held by another agent")
