"""gitdrop sync: send the writes a remote hub could not take when they were made."""

from typing import Annotated, Optional

import typer

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
        line += f"\n   or drop it: gitdrop sync --drop {e['id']}"
    return line


@command(app, "sync")
def sync(s: Scope, drop: Annotated[Optional[int], typer.Option(
        "--drop", metavar="ID", help="Remove queued write ID instead (it is never sent).",
        show_default=False)] = None):
    """Send the writes queued while a remote hub was unreachable, in order, each
    rebased onto the hub's newest state and checked again. One refused is reported
    with its rule and left in the queue (fix it, or drop it with --drop ID); the
    others go through. Exit 3 when one was refused."""
    store = s.hub.store
    if not hasattr(store, "sync"):
        s.emit({"synced": [], "refused": [], "queued": []},
               "nothing to sync: this hub is on this machine, writes go straight to it")
        return
    r = store.sync(drop)
    if drop is not None:
        s.emit(r, f"dropped #{drop} ({r['dropped']['subject']}); it will not be sent; "
                  f"{len(r['queued'])} still queued")
        return

    def show():
        if not (r["synced"] or r["refused"]):
            print("nothing queued: every write is on the hub")
        for e in r["synced"]:
            print(f"sent #{e['id']} {e['ref'].removeprefix('refs/heads/')}: {e['subject']}"
                  + (f" (as {short_id(e['pushing'])})" if e.get("pushing") else ""))
        for e in r["refused"]:
            print(entry_line(e))
        if r["refused"]:
            print(f"{len(r['refused'])} refused and left in the queue (gitdrop status shows it)")
    s.emit(r, show)
    if r["refused"]:
        raise typer.Exit(3)
