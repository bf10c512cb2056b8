"""`gitdrop autorespond`: answers an agent's messages while it is away
(gitdrop/autorespond.py does the work; docs/AUTORESPOND.md has the rules file)."""

import sys
from typing import Annotated

import typer

from .base import Scope, command, paint
from .. import fmt

app = typer.Typer(add_completion=False)


def _line(ev: dict) -> str | None:
    what, sender = ev["event"], ev.get("from", "")
    mid = (ev.get("message") or "")[:10]
    if what == "ack":
        return f"{paint('ack', 'green')} {sender} ({ev.get('kind', 'message')} {mid})" \
            + (" (answered before)" if ev.get("replayed") else "")
    if what == "escalated":
        where = f"task {ev['task']}" if ev.get("task") else "a message"
        return f"{paint('escalated', 'cyan')} {ev.get('kind')} from {sender} ({mid}) " \
               f"to {ev.get('to')} as {where}"
    if what == "skipped":
        why = ev.get("reason", "")
        if why == "capped":
            why = f"capped: {ev.get('cap')} answers per {ev.get('window')} s"
        return f"{paint('skipped', 'dim')} {sender} ({mid}): {why}"
    if what == "refused":
        return f"{paint('refused', 'red')} {ev.get('action')} to {sender} ({mid}) by rule " \
               f"{ev.get('rule')}: {ev.get('reason')}"
    if what == "error":
        return f"{paint('error', 'red')} {ev.get('rule')}: {ev.get('reason')}"
    return None


@command(app, "autorespond")
def autorespond(s: Scope,
                rules: Annotated[str, typer.Option(
                    "--rules", metavar="FILE", help="The rules file (TOML): the away "
                    "text, whom to escalate questions and decisions to, the cap per "
                    "sender (see docs/AUTORESPOND.md).", show_default=False)],
                once: Annotated[bool, typer.Option(
                    "--once", help="Answer what is unread now, then exit.")] = False):
    """Answer messages for an agent who is away: acknowledge plain messages, pass
    questions and decision requests on to its lead or a named agent (a task or a
    message), at most a few answers per sender and window, never an answer to an
    automatic message. Runs until Ctrl-C or SIGTERM, woken by the notifier; refuses
    to answer for a person (register --human)."""
    from ..autorespond import Responder, load_rules
    agent = s.agent
    hub = s.hub_value if s.hub_value else s.hub.path
    got = load_rules(rules)

    def show(ev):
        if s.json:
            print(fmt.json_line(ev, default=str), flush=True)
            return
        line = _line(ev)
        if line:
            print(line, flush=True)

    r = Responder(hub, s.room_name, agent, got, on_event=show)
    if once:
        evs = r.run_once()
        if not s.json and not evs:
            print(f"nothing unread for {r.agent} in {s.room_name}")
        return
    if not s.json:
        print(f"answering for {r.agent} in {s.room_name} ({got['away']}); Ctrl-C stops",
              file=sys.stderr, flush=True)
    handled = r.run()
    if not s.json:
        print(f"{r.agent}: {handled} message(s) answered; stopped", file=sys.stderr, flush=True)
