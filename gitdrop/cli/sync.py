"""gitdrop sync: send the writes a remote hub could not take when they were made."""

from typing import Annotated, Optional

import typer

from ..errors import UsageError
from .base import Scope, ago, command, paint, short_id

app = typer.Typer(add_completion=False)


def entry_line(e: dict) -> str:
    """One queued write for people: id, room, what, age, and a refusal if any."""
    where = e["ref"].removeprefix("refs/heads/")
    line = f"#{e['id']} {where}: {e['subject']} ({e['author']}, queued {ago(e['queued'])})"
    r = e.get("refused")
    if r:
        line += paint(f"\n   refused by rule {r['rule']}: {r['reason']}", "red")
        if r.get("fix"):
            line += f"\n   fix: {r['fix']}"
        line += (f"\n   not sent again until you say: gitdrop sync --retry {e['id']} (it "
                 f"lands after the writes sent since), or drop it: gitdrop sync --drop {e['id']}")
    return line


@command(app, "sync")
def sync(s: Scope, drop: Annotated[Optional[int], typer.Option(
        "--drop", metavar="ID", help="Remove queued write ID instead (it is never sent).",
        show_default=False)] = None,
        retry: Annotated[Optional[int], typer.Option(
            "--retry", metavar="ID", help="Send refused write ID again, after the others "
            "(it lands after the writes queued behind it).", show_default=False)] = None):
    """Send the writes queued while a remote hub was unreachable, in order, each
    rebased onto the hub's newest state and checked again. One a rule refuses is
    reported and left in the queue, and later syncs skip it until you retry it
    (--retry ID) or drop it (--drop ID); the others go through. Exit 3 while a
    refused write waits in the queue. A push the hub neither takes nor refuses by
    a rule (no answer, no permission, a hook that fails) stops the sync with exit 7:
    that write and those after it stay queued, in order. A hub that serves a file
    the rules refuse (it runs without gitdrop's hook) stops it with exit 8, naming
    the hub and the file: the queue is left as it is, for once the hub is mended."""
    if drop is not None and retry is not None:
        raise UsageError("--drop and --retry name what to do with one write: give one",
                         "gitdrop sync --retry ID, or gitdrop sync --drop ID")
    store = s.hub.store
    if not hasattr(store, "sync"):
        s.emit({"synced": [], "refused": [], "skipped": [], "queued": []},
               "nothing to sync: this hub is on this machine, writes go straight to it")
        return
    r = store.sync(drop, retry)
    if drop is not None:
        what = {True: "it was on the hub already (a sync sent it, and stopped before it "
                      "could say so): only the queue forgot it",
                None: "a sync was sending it when it stopped, and the hub cannot be "
                      "reached to tell whether it landed: read it back once it can",
                False: "it will not be sent"}[r["landed"]]
        s.emit(r, f"dropped #{drop} ({r['dropped']['subject']}); {what}; "
                  f"{len(r['queued'])} still queued")
        return

    def show():
        if not (r["synced"] or r["refused"] or r["skipped"]):
            print("nothing queued: every write is on the hub")
        for e in r["synced"]:
            print(f"sent #{e['id']} {e['ref'].removeprefix('refs/heads/')}: {e['subject']}"
                  + (f" (as {short_id(e['pushing'])})" if e.get("pushing") else "")
                  + (" (retried: after the writes queued behind it)"
                     if e["id"] == r["retried"] else ""))
        for e in r["refused"]:
            print(entry_line(e))
        if r["refused"]:
            print(f"{len(r['refused'])} refused and left in the queue (gitdrop status shows it)")
        if r["skipped"]:
            print(f"{len(r['skipped'])} refused at an earlier sync, not sent again:")
            for e in r["skipped"]:
                print(entry_line(e))
    s.emit(r, show)
    if r["refused"] or r["skipped"]:
        raise typer.Exit(3)
