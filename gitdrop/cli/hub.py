"""The hub: teams, the lifecycle of rooms (each a branch), reaping and verifying."""

import contextlib
import sys
from typing import Annotated, Optional

import typer

from .base import Scope, ago, command, paint, progress, short_id, split_list, sub_app, table
from ..errors import NotFound, UsageError

app = typer.Typer(add_completion=False)
team_app = sub_app("team", "Teams: a lead and members, shared by every room of the hub.")
room_app = sub_app("room", "Rooms: one branch each; create, list, join, archive, pin, destroy.")

RoomArg = Annotated[Optional[str], typer.Argument(
    help="The room (default: --room / GITDROP_ROOM / lobby).", show_default=False)]


# --- teams ------------------------------------------------------------------------

@command(team_app, "create")
def team_create(s: Scope,
                name: Annotated[str, typer.Argument(help="The team's name.")],
                lead: Annotated[str, typer.Option("--lead", help="Its lead (name or team/name).",
                                                  show_default=False)],
                member: Annotated[Optional[list[str]], typer.Option(
                    "--member", "-m", help="A member (repeat, or a comma list).")] = None):
    """Register a team (or update it: its lead only)."""
    by = _registered_as(s)
    if by and "/" not in by:
        raise UsageError(f"--as {by}: no team's lead or member has that name",
                         "say who you are as team/name (--as team/name)")
    t = s.hub.register_team(name, lead, split_list(member), by=by)
    s.emit({"team": t}, f"team {t['name']}: lead {t['lead']}, members {', '.join(t['members'])}"
           + (f"\nits lead in {', '.join(t['handed_over_in'])} is now {t['lead']}"
              if t.get("handed_over_in") else ""))


@command(team_app, "add")
def team_add(s: Scope,
             name: Annotated[str, typer.Argument(help="The team.")],
             agent: Annotated[list[str], typer.Argument(help="Members to add (name or team/name).",
                                                        show_default=False)]):
    """Add members to a team (its lead): a closed room registers its teams' members only."""
    _members(s, name, split_list(agent), ())


@command(team_app, "remove")
def team_remove(s: Scope,
                name: Annotated[str, typer.Argument(help="The team.")],
                agent: Annotated[list[str], typer.Argument(
                    help="Members to take out (name or team/name).", show_default=False)]):
    """Take members out of a team (its lead); those registered in rooms stay there."""
    _members(s, name, (), split_list(agent))


def _members(s: Scope, name: str, add, remove) -> None:
    t = s.hub.team(name)
    t = s.hub.register_team(name, t["lead"], add, by=s.agent_value, remove=remove)
    for m in add:
        m = m if "/" in m else f"{name}/{m}"
        if m in t.get("tokens_held", ()):
            s.note(f"note: {m} has a token already, minted for whoever registered that name "
                   "first (an MCP registration); if that is not your agent, mint it a new one, "
                   f"which ends the old: gitdrop token {m}")
        else:
            s.note(f"next: {m} registers in the team's rooms (gitdrop --room ROOM register "
                   f"{m}); over MCP HTTP it needs its token first: gitdrop token {m}")
    if remove:
        s.note("taken out of the team, not out of the rooms they are registered in: their "
               "lead deregisters them there (gitdrop --room ROOM deregister team/name)")
    s.emit({"team": t}, f"team {t['name']}: lead {t['lead']}, members {', '.join(t['members'])}")


@command(team_app, "list")
def team_list(s: Scope):
    """The hub's teams."""
    teams = s.hub.teams()

    def show():
        if not teams:
            print("no teams yet (gitdrop team create NAME --lead L)")
            return
        table(["team", "lead", "members"],
              [(t["name"], t["lead"], ", ".join(t["members"])) for t in teams])
    s.emit({"teams": teams}, show)


# --- rooms ------------------------------------------------------------------------

@command(room_app, "create")
def room_create(s: Scope,
                name: Annotated[str, typer.Argument(help="The room's name.")],
                team: Annotated[Optional[list[str]], typer.Option(
                    "--team", "-t", help="A member team (repeat). None: open to all.")] = None,
                open_: Annotated[bool, typer.Option("--open", help="Open to every team.")] = False):
    """Create a room (a new branch rooms/NAME)."""
    r = s.hub.create_room(_operator(s), name, split_list(team), open_=open_)
    s.emit(r, f"room {name} created" + (f" for {', '.join(r['teams'])}" if r["teams"] else "")
           + (" (open to all teams)" if r["open"] else "")
           + f"\nnext: {s.again('register team/name', name)}"
           + ("" if r["open"] else " (a member of its teams: a team's lead adds one with "
              "gitdrop team add TEAM NAME)"))


@command(room_app, "list")
def room_list(s: Scope,
              all_: Annotated[bool, typer.Option("--all", help="Active and archived.")] = False,
              archived: Annotated[bool, typer.Option("--archived", help="Archived only.")] = False,
              team: Annotated[str, typer.Option(
                  "--team", help="Only the rooms of this team.")] = ""):
    """The hub's rooms with their teams, activity and health."""
    if team:
        rooms = s.hub.rooms_of_team(team)
    else:
        rooms = s.hub.rooms("all" if all_ else "archived" if archived else "active")

    def show():
        if not rooms:
            print("no rooms" + (f" for team {team}" if team else ""))
            return
        table(["room", "status", "teams", "pinned", "last activity", "health"],
              [(r["room"], r["status"], "open" if r["open"] else ", ".join(r["teams"]),
                "yes" if r["pinned"] else "", ago(r["last_activity"]), r["health"])
               for r in rooms])
    s.emit({"rooms": rooms}, show)


@command(room_app, "show")
def room_show(s: Scope, name: RoomArg = None,
              limit: Annotated[int, typer.Option(
                  "--limit", "-n", min=0, help="At most this many agents (0: all).")] = 100,
              offset: Annotated[int, typer.Option(
                  "--offset", min=0, help="Skip this many agents (by id).")] = 0):
    """A room's status: teams, leads, agents (a page at a time in a big room), open
    tasks, last activity, size."""
    st = s.hub.room_status(name or s.room_name, offset, limit)

    def show():
        print(f"room {paint(st['room'], 'bold')}"
              + (f" (archived: gitdrop room restore {st['room']} brings it back)"
                 if st["status"] == "archived" else "") + (" (pinned)" if st["pinned"] else ""))
        print(f"  teams:     {'open to all' if st['open'] else ', '.join(st['teams']) or '-'}")
        print(f"  leads:     {', '.join(f'{k}: {v}' for k, v in st['leads'].items()) or '-'}")
        print(f"  agents:    {', '.join(st['agents']) or '-'}")
        if st["agents_more"]:
            print(f"             … {st['agents_more']} more of {st['agents_total']}: gitdrop "
                  f"room show {st['room']} --offset {st['agents_offset'] + len(st['agents'])}")
        print(f"  tasks:     {st['open_tasks']} open of {st['tasks']}")
        print(f"  commits:   {st['commits']}")
        print(f"  last:      {ago(st['last_activity'])}: {st['last']}")
    s.emit({"room": st}, show)


@command(room_app, "settings")
def room_settings(s: Scope, pairs: Annotated[Optional[list[str]], typer.Argument(
        metavar="[KEY VALUE]...",
        help="Settings to change, as KEY VALUE pairs (or KEY=VALUE); none: show them.",
        show_default=False)] = None):
    """Show or change the room's settings (loop guard, limits, clock skew): leads only.

    gitdrop room settings                  # every setting, with the room's overrides
    gitdrop room settings loop_cap 5 loop_window 60
    """
    words = [w for p in (pairs or []) for w in (p.split("=", 1) if "=" in p else [p])]
    if len(words) % 2:
        raise UsageError(f"{words[-1]!r} has no value", "give KEY VALUE pairs, e.g. "
                         "gitdrop room settings loop_cap 5")
    changes = {}
    for key, value in zip(words[::2], words[1::2]):
        try:
            changes[key] = int(value)
        except ValueError:
            raise UsageError(f"{key} = {value!r} is not a whole number",
                             f"e.g. gitdrop room settings {key} 5") from None
    r = s.hub.room_settings(s.room_name, s.agent_value, changes)

    def show():
        wide = max(map(len, r["settings"]), default=0)
        for k, v in r["settings"].items():
            mark = "" if k not in r["overrides"] else paint("  (set here; default "
                                                            f"{r['defaults'][k]})", "dim")
            print(f"{k:<{wide}}  {v:>6}  {SETTING_WORDS.get(k, '')}{mark}")
    s.emit(r, show)


def _team_of(s: Scope, team: str) -> str:
    if team:
        return team
    if "/" in s.agent_value:
        return s.agent_value.split("/", 1)[0]
    raise UsageError("which team?", "give --team T (or act as team/name with --as)")


TeamOpt = Annotated[str, typer.Option("--team", "-t", help="The team (default: yours, from --as).")]


@command(room_app, "join")
def room_join(s: Scope, name: RoomArg = None, team: TeamOpt = ""):
    """Add a team to a room (a lead of the room; in an open room, the team's lead)."""
    room = name or s.room_name
    r = s.hub.join_room(_team_of(s, team), room, s.agent_value)
    s.emit(r, f"team {r['team']}'s lead in {room} is now {r['lead']}" if r.get("lead_changed")
           else f"team {r['team']} {'joined' if r['joined'] else 'was already in'} {room}")


@command(room_app, "leave")
def room_leave(s: Scope, name: RoomArg = None, team: TeamOpt = ""):
    """Take a team out of a room (a lead)."""
    room = name or s.room_name
    r = s.hub.leave_room(_team_of(s, team), room, s.agent_value)
    s.emit(r, f"team {r['team']} left {room}")


# What each setting means, beside its value (docs/PROTOCOL.md says the rest).
SETTING_WORDS = {
    "loop_cap": "messages one agent may send per window (0: off)",
    "loop_window": "seconds: the loop guard's window",
    "max_message": "bytes of a message's text", "max_file": "bytes of any file",
    "max_title": "characters of a task's title", "max_tags": "tags on a task",
    "max_retries": "retries a new task allows", "task_lease": "seconds a claim is held "
    "after its assignee's last act", "max_task_lease": "seconds a renew may hold a task",
    "clock_skew": "seconds a pushed commit may be dated off the hub's clock",
    "max_lease_ttl": "seconds a path lease may run",
    "max_leases": "path leases one agent may hold at once",
}


def _operator(s: Scope) -> str:
    """Who runs a room's lifecycle: the agent given, else the hub's operator, as room
    create and room settings do on the hub's machine (archive said 'this command acts
    as an agent' where create, beside it, needed no --as)."""
    from ..hub import OPERATOR
    return _registered_as(s) or OPERATOR


def _registered_as(s: Scope) -> str:
    """--as, a short name made team/name where one of the registry's leads and members
    has it (room create --as ana was refused as nobody); else as given."""
    by = s.agent_value
    if by and "/" not in by:
        from ..core import by_short_name
        known = {m for t in s.hub.teams() for m in [t["lead"], *t["members"]]}
        by = by_short_name(by, known) or by
    return by


@command(room_app, "archive")
def room_archive(s: Scope, name: RoomArg = None):
    """Archive a room: its branch leaves the active rooms, its history stays (a lead)."""
    room = name or s.room_name
    r = s.hub.archive_room(room, _operator(s))
    n = r.get("open_tasks", 0)
    s.emit(r, f"room {room} archived (tip {short_id(r['tip'])})"
              + (f"; {n} task{'s' if n != 1 else ''} not done go{'es' if n == 1 else ''} "
                 "with it" if n else "")
              + f"; gitdrop room restore {room} brings it back")


@command(room_app, "restore")
def room_restore(s: Scope, name: RoomArg = None):
    """Bring an archived room back (a lead)."""
    room = name or s.room_name
    r = s.hub.restore_room(room, _operator(s))
    s.emit(r, f"room {room} restored")


@command(room_app, "pin")
def room_pin(s: Scope, name: RoomArg = None,
             unpin: Annotated[bool, typer.Option("--unpin", help="Remove the pin.")] = False):
    """Pin a room: it is never archived for idleness nor expired (a lead)."""
    room = name or s.room_name
    r = s.hub.pin_room(room, _operator(s), pinned=not unpin)
    s.emit(r, f"room {room} {'pinned' if r['pinned'] else 'unpinned'}")


@command(room_app, "destroy")
def room_destroy(s: Scope, name: Annotated[str, typer.Argument(help="The room.")],
                 yes: Annotated[bool, typer.Option("--yes", help="Yes, destroy it.")] = False):
    """Delete a room and its history for good (asks twice: --yes and a prompt).

    Every member team's lead must agree; each call records one consent."""
    if not yes:
        raise UsageError(f"destroying {name} deletes its whole history",
                         f"if you mean it: gitdrop room destroy {name} --yes (then confirm)")
    # Who may destroy is checked before asking: a non-lead is refused at once, not
    # after typing the name (destroy_room checks again, under its own read).
    h = s.hub
    try:
        _ref, _tip, view = h._locate(name)
    except NotFound:   # gone: a destroy stopped before its records went is finished
        r = h.destroy_room(name, _operator(s))
        return s.emit(r, f"room {name} was destroyed already; the records a destroy that "
                      "was stopped left are taken away")
    by = h.may_destroy(view, _operator(s))
    if getattr(h, "url", ""):   # refused there anyway: said before the name is typed
        h.destroy_room(name, by)
    # The prompt goes to stderr so stdout keeps only the result (one JSON document).
    print(f"Type the room's name ({name}) to destroy it: ", end="", file=sys.stderr, flush=True)
    answer = sys.stdin.readline() if sys.stdin is not None else ""
    if answer.strip() != name:
        raise UsageError("not confirmed; nothing was destroyed", "type the room's exact name")
    r = s.hub.destroy_room(name, by)
    if r.get("destroyed"):
        s.emit(r, f"room {name} destroyed (its last tip was {short_id(r['tip'])})")
    else:
        s.emit(r, f"your consent to destroy {name} is recorded; waiting for "
                  f"{', '.join(r.get('waiting_for', []))}")


@command(room_app, "export")
def room_export(s: Scope, name: Annotated[str, typer.Argument(help="The room.")],
                file: Annotated[str, typer.Argument(
                    help="The bundle to write (a directory: NAME.bundle in it; -: stdout).")]):
    """Write a room to one file (a git bundle): its whole history and the team
    registry entries its teams need, for gitdrop room import on another hub."""
    from ..bundle import STDOUT, export
    store = s.hub.store
    if hasattr(store, "refresh"):
        store.refresh(force=True)   # a remote hub: its newest state
        if any(e["ref"] == store.room_ref(name) for e in store.queue.pending()):
            raise UsageError(f"room {name} has writes queued here that the hub has not "
                             "taken yet", "send them first (gitdrop sync), then export")
    r = export(store, name, file)
    to_stdout = file == STDOUT
    where = "standard output" if to_stdout else r["file"]
    with contextlib.redirect_stdout(sys.stderr) if to_stdout else contextlib.nullcontext():
        # "-": stdout holds the bundle, so what is said about it goes to stderr
        s.emit(r, f"room {name} (tip {short_id(r['tip'])}, teams: "
                  f"{', '.join(r['teams']) or 'none'}) written to {where}\n"
                  f"next: gitdrop --hub OTHER room import {'FILE' if to_stdout else file}")


@command(room_app, "import")
def room_import(s: Scope, file: Annotated[str, typer.Argument(
        help="A bundle written by gitdrop room export.")],
        name: Annotated[Optional[str], typer.Option(
            "--name", metavar="ROOM", help="Import the room under this name (a copy "
            "beside the original, or on another hub): every commit is rewritten.",
            show_default=False)] = None):
    """Bring a room from a bundle into this hub: its commits are judged by the rules
    first, and nothing is written unless all are accepted; then the room's ref moves
    and its missing teams are registered (a run cut short is finished by running it
    again). Over an existing room only a history that extends it is taken."""
    from ..bundle import import_room
    r = import_room(s.hub, file, name or "")
    teams = f"; teams registered: {', '.join(r['teams'])}" if r["teams"] else ""
    if r["up_to_date"]:
        s.emit(r, f"room {r['room']} already holds this history{teams}; nothing else "
                  "to import")
        return
    s.emit(r, f"room {r['room']} imported"
              + (f" from room {r['from']} (renamed)" if r["from"] != r["room"] else "")
              + f": {r['commits']} commits "
              + ("added to its history" if r["extended"] else "checked and accepted")
              + (f", moved to the current layout ({short_id(r['layout_moved'])})"
                 if r["layout_moved"] else "")
              + f"{teams}\nnext: {s.again('verify ' + r['room'])}")


# --- upkeep -----------------------------------------------------------------------

@command(app, "reap")
def reap(s: Scope, now: Annotated[Optional[int], typer.Option(
        "--now", metavar="EPOCH",
        help="Judge ages as of this time (epoch seconds): a time ahead of the hub's clock "
             "only shows what would be done then (a dry run).",
        show_default=False)] = None):
    """Return tasks whose claim lease expired to pending (in every room, by the hub's
    clock), archive idle rooms (if gitdrop.idleArchiveDays is set) and expire old
    archives (gitdrop.archiveExpiryDays, default 90) unless pinned; each act is committed."""
    with progress("reaping: judging rooms", quiet=s.json, unit="rooms") as step:
        r = s.hub.reap(now, progress=step)
    if r["dry_run"]:
        s.emit(r, f"dry run (--now is ahead of the hub's clock; nothing was done): by then "
                  f"it would archive: {', '.join(r['archived']) or 'none'}; destroy: "
                  f"{', '.join(r['destroyed']) or 'none'}")
        return
    tasks = [f"{t['room']}#{t['id']} ({t['state']})" for t in r["reaped"]]
    s.emit(r, f"reaped tasks: {', '.join(tasks) or 'none'}; "
              f"archived: {', '.join(r['archived']) or 'none'}; "
              f"destroyed: {', '.join(r['destroyed']) or 'none'}"
              + (f"; packed about {r['packed']:,} loose objects" if r["packed"] else ""))


@command(app, "verify")
def verify(s: Scope, name: RoomArg = None,
           archived: Annotated[bool, typer.Option("--archived", help="An archived room.")] = False):
    """Re-check a whole room from its first commit with the rules (same verdicts as the hook)."""
    room = name or s.room_name
    with progress(f"verifying {room}", quiet=s.json, unit="commits") as step:
        ops = s.hub.verify(room, archived=archived, progress=step)
    s.emit({"room": room, "commits": len(ops), "verified": True,
            "tip": ops[-1][0] if ops else ""},
           f"room {room}: {len(ops)} commits re-checked from the first; every one is accepted")
