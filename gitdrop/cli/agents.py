"""Commands for agents and their messages: init, register, who, send, inbox, log..."""

import sys
from typing import Annotated, Optional

import typer

from .base import Scope, ago, command, paint, progress, short_id, split_list, table
from .. import fmt, model
from ..errors import GitdropError, UsageError

app = typer.Typer(add_completion=False)


@command(app, "init")
def init(s: Scope, path: Annotated[Optional[str], typer.Argument(
        help="Where to create the hub (a bare git repository). Default: --hub, "
             "GITDROP_HUB or ~/.gitdrop/hub.git.", show_default=False)] = None):
    """Create a hub (a bare git repository with gitdrop's hooks) with a first room, lobby.

    On an existing hub it reinstalls the hooks and settings; nothing is lost."""
    from ..hub import init as init_hub
    from ..transports.remote import is_url
    where = path or s.hub_value
    if is_url(where):
        raise UsageError(f"{where} is a git URL; init makes a hub on this machine",
                         "run gitdrop init PATH where the hub lives, then use --hub URL")
    h = init_hub(where)
    rooms = h.store.rooms()
    s.emit({"hub": h.path, "rooms": rooms},
           f"hub ready at {h.path} (rooms: {', '.join(rooms) or 'none'})\n"
           f"next: export GITDROP_HUB={h.path}; gitdrop register team/name")


@command(app, "register")
def register(s: Scope,
             name: Annotated[str, typer.Argument(help="team/name, or a name with --team.")],
             role: Annotated[Optional[list[str]], typer.Option(
                 "--role", "-r", help="A role (repeat, or a comma list): lead, coder, ...")] = None,
             team: Annotated[Optional[str], typer.Option(
                 "--team", "-t", help="The agent's team.")] = None,
             description: Annotated[str, typer.Option("--description", "-d")] = "",
             cap: Annotated[Optional[list[str]], typer.Option(
                 "--cap", help="A capability (repeat, or a comma list): tasks that require it "
                 "can go to you; re-registering with --cap replaces the list.")] = None,
             human: Annotated[Optional[bool], typer.Option(
                 "--human/--not-human", help="A person, not a program: tasks can be assigned "
                 "to it and nothing answers for it automatically.", show_default=False)] = None):
    """Join the room as an agent (or update your roles, description and capabilities)."""
    if "/" in name:
        if team and name.split("/", 1)[0] != team:
            raise UsageError(f"{name} is not in team {team}", "give team/name or --team, not both")
        agent = name
    else:
        from ..model import DEFAULT_TEAM
        agent = f"{team or DEFAULT_TEAM}/{name}"
        if not team:   # say so: a name without a team is easy to miss
            s.note(f"no team given: registering as {agent} (give team/name or --team)")
    roles = split_list(role)
    # The lead role is the team registry's to give: that needs the hub, not the
    # lean store of a short command.
    room = s.hub.room(s.room_name) if "lead" in roles else s.room
    r = room.register(agent, roles, description,
                      caps=split_list(cap) if cap is not None else None, human=human)
    line = (f"{agent} updated in {s.room_name}" if r.get("updated") else
            f"{agent} joined {s.room_name}" + (f" as {', '.join(roles)}" if roles else ""))
    if s.agent_value != agent:
        line += f"\nnext: export GITDROP_AGENT={agent}"
    s.emit(dict(r, room=s.room_name, roles=roles), line)


@command(app, "deregister")
def deregister(s: Scope, name: Annotated[Optional[str], typer.Argument(
        help="Who leaves (a lead may remove others). Default: you.", show_default=False)] = None):
    """Leave the room (your messages stay in its history)."""
    r = s.room.deregister(s.agent, name or "")
    held = r.get("held") or []
    s.emit(r, f"{r['agent']} left {s.room_name}" + (
        f"\nit still holds task{'s' * (len(held) > 1)} {', '.join(held)}: anyone may reap "
        f"{'them' if len(held) > 1 else 'it'} now, back to pending ({s.again('task reap ' + held[0])})"
        if held else ""))


PAGE = 100   # agents `who` and `room show` list at a time


def _more_line(r: dict, command: str) -> str:
    """The line after a page: how many follow, and how to see them."""
    if not r["more"]:
        return ""
    nxt = r["offset"] + len(r["agents"])
    return f"… {r['more']} more of {r['total']}: {command} --offset {nxt}"


Offset = Annotated[int, typer.Option("--offset", min=0, help="Skip this many agents (by id).")]
Limit = Annotated[int, typer.Option("--limit", "-n", min=0, help="At most this many agents (0: all).")]


@command(app, "who")
def who(s: Scope, limit: Limit = PAGE, offset: Offset = 0):
    """The agents in the room, with roles, status and health (from their last act);
    a page at a time in a big room (--offset, --limit)."""
    r = s.room.who_page(offset, limit)
    agents = r["agents"]

    def show():
        if not agents:
            print(f"nobody is registered in {s.room_name} yet (gitdrop register team/name)"
                  if not r["total"] else f"no agents past {offset} (there are {r['total']})")
            return
        caps = any(a.get("caps") for a in agents)   # a column only when someone has some
        rows = [(a["agent"], ", ".join(a["roles"])) + ((", ".join(a["caps"]) or "-",) * caps)
                + (a["status"][:40],
                   (a["health"], {"healthy": "green", "stale": "yellow"}.get(a["health"], "red")),
                   ago(a["last_act"]), ", ".join(a["tasks"]) or "-",
                   f"#{a['last_claimed']}" if a["last_claimed"] else "-",
                   f"#{a['last_completed']}" if a["last_completed"] else "-") for a in agents]
        table(["agent", "roles"] + ["caps"] * caps + ["status", "health", "last act", "holds",
                                                      "claimed", "done"], rows)
        more = _more_line(r, "gitdrop who")
        if more:
            print(more)
    s.emit({"room": s.room_name, "agents": agents, "total": r["total"], "offset": r["offset"],
            "more": r["more"]}, show)


@command(app, "status")
def status(s: Scope, text: Annotated[Optional[str], typer.Argument(
        help="What you are doing. None: show your status and the offline queue.",
        show_default=False)] = None):
    """Set your status line (others see it in gitdrop who); without TEXT, show it and
    the writes queued for a remote hub that was unreachable (gitdrop sync sends them)."""
    if text is not None:
        r = s.room.set_status(s.agent, text)
        s.emit(r, f"{r['agent']} is {text}")
        return
    from .sync import entry_line
    store = s.hub.store
    me = None
    if s.agent_value:
        try:   # a short name, as every other command takes it
            full = s.room.resolve(s.agent_value)
        except GitdropError:
            full = s.agent_value
        me = next((a for a in s.room.who() if a["agent"] == full), None)
    queue = store.queue.entries() if hasattr(store, "queue") else None
    oldest = min((e["queued"] for e in queue or []), default=0)
    from ..transports.remote import public_url
    doc = {"agent": s.agent_value, "status": me,
           "hub": public_url(getattr(s.hub, "url", "")) or s.hub.path,
           "offline": bool(getattr(store, "unreachable", False)), "queue": queue or [],
           "oldest": oldest}

    def show():
        if me is not None:
            print(f"{me['agent']}: {me.get('status') or '(no status)'} ({me.get('health', '')})")
        elif s.agent_value:
            print(f"{s.agent_value} is not registered in {s.room_name}")
        if queue is None:
            print("no offline queue: this hub is on this machine")
        elif not queue:
            print(f"offline queue for {doc['hub']}: empty (every write is on the hub)")
        else:
            print(f"offline queue for {doc['hub']}: {len(queue)} write(s), oldest queued "
                  f"{ago(oldest)}" + (" (the hub is unreachable now)" if doc["offline"] else ""))
            for e in queue:
                print("  " + entry_line(e))
            print(f"next: {s.again('sync')}")
    s.emit(doc, show)


@command(app, "ping")
def ping(s: Scope):
    """Say you are alive (a heartbeat for gitdrop who)."""
    r = s.room.ping(s.agent)
    s.emit(r, f"{r['agent']} pinged")


@command(app, "send")
def send(s: Scope,
         to: Annotated[list[str], typer.Argument(
             help="Recipients: team/name, a short name, @team or all.", show_default=False)],
         message: Annotated[Optional[str], typer.Option(
             "--message", "-m", help="The text (default: read stdin).", show_default=False)] = None,
         cc: Annotated[Optional[list[str]], typer.Option("--cc", help="Copy to (repeat).")] = None,
         task: Annotated[str, typer.Option("--task", help="The task it is about.")] = "",
         reply_to: Annotated[str, typer.Option("--reply-to", help="Commit it answers.")] = "",
         key: Annotated[str, typer.Option(
             "--key", help="Idempotency key: a retry with the same key is sent once "
             "(env GITDROP_KEY).")] = ""):
    """Send a message (refused while you have unread messages: run gitdrop inbox)."""
    agent = s.agent
    more = [x for flag, vals in (("--cc", cc or ()), ("--task", [task] if task else ()),
                                 ("--reply-to", [reply_to] if reply_to else ()))
            for v in vals for x in (flag, v)]
    if message is None:
        if len(to) > 1 and not to[-1].split() == [to[-1]]:   # `send kai "the text"`
            raise UsageError(f"{to[-1]!r} is no recipient: the text goes after -m",
                             _text_after_m(s, to, more))
        if sys.stdin is None or sys.stdin.isatty():
            raise UsageError("no message text", "give it with -m TEXT or on stdin"
                             + (f" ({_text_after_m(s, to, more)}?)" if len(to) > 1 else ""))
        message = sys.stdin.read()
    if not message.strip():
        raise UsageError("the message is empty", "write some text (-m TEXT)"
                         + (f"; or {_text_after_m(s, to, more)}" if len(to) > 1 else ""))
    r = s.room.send(agent, to, message, cc=cc or (), task=task, reply_to=reply_to,
                    key=key or s.key)
    # a remote hub that could not take it: queued, not sent (said so below, too)
    queued = getattr(getattr(s._hub, "store", None), "taken", lambda: [])()
    s.emit(r, f"{'queued for' if queued else 'sent to'} {', '.join(r['to'])}"
           + (f" (cc {', '.join(r['cc'])})" if r["cc"] else "") + f" [{short_id(r['commit'])}]")
    for hint in r.get("hints", []):
        s.note(f"note: {hint}")


def _text_after_m(s, to, more) -> str:
    """The send a person who wrote the text last meant (the CLI reads it as one
    more recipient), with the other options it was given."""
    import shlex
    return s.again(" ".join(["send", *map(shlex.quote, to[:-1]), *map(shlex.quote, more),
                             "-m", shlex.quote(to[-1])]))


@command(app, "sent")
def sent(s: Scope,
         message: Annotated[Optional[str], typer.Argument(
             help="One message (its id): who it reached and who has read it.",
             metavar="[MESSAGE]", show_default=False)] = None,
         n: Annotated[int, typer.Option("-n", min=1, help="How many of your last messages.")] = 10):
    """Your recent messages, each with its recipients and whether each has read it
    (from their read cursors)."""
    msgs = s.room.sent(s.agent, n=n, message=message or "")

    def show():
        if not msgs:
            print(f"{s.agent} has sent nothing in {s.room_name} lately")
            return
        for m in msgs:
            who = ", ".join(f"{model.short(g['agent'])} {'read' if g['read'] else 'UNREAD'}"
                            for g in m["recipients"]) or "nobody"
            print(f"{short_id(m['id'])} {ago(m['time'])} → {', '.join(m['to'])}: "
                  f"{' '.join(m['text'].split())[:60]}")
            print(f"    {m['read']}/{len(m['recipients'])} read: {who}")
    s.emit({"room": s.room_name, "agent": s.agent, "messages": msgs}, show)


VIA = {"to": "you", "cc": "cc", "team": "your team", "all": "all", "lead": "lead copy",
       "notice": ""}


def _event_line(ev: dict, name=model.short) -> str:
    when = ago(ev["time"])
    who = name(ev["from"])
    if ev["op"] == "send":
        head = (f"{paint(who, 'bold')}{' (person)' if ev.get('person') else ''} → "
                f"{VIA.get(ev.get('via'), ev.get('via', ''))}")
        text = fmt.shown(ev["text"]).rstrip("\n").replace("\n", "\n    ")
        return f"{head}  {paint(when, 'dim')}\n    {text}"
    line = f"{paint('•', 'cyan')} {fmt.shown(ev['subject'])}  {paint(when, 'dim')}"
    text = fmt.shown(ev.get("text") or "").rstrip("\n")
    if text:   # a reason, a note, a question or an answer: what the reader must see
        line += "\n    " + text.replace("\n", "\n    ")
    return line


@command(app, "inbox")
def inbox(s: Scope,
          peek: Annotated[bool, typer.Option("--peek", help="Show, but do not mark read.")] = False,
          limit: Annotated[int, typer.Option(
              "--limit", "-n", min=0, help="At most this many (0: all).")] = 20,
          again: Annotated[bool, typer.Option(
              "--again", help="What your last read marked read, once more.")] = False):
    """What is waiting for you (messages and notices), oldest first; marks it read."""
    said = []

    def say(r):
        def show():
            msgs = r["messages"]
            if again:
                print(f"{len(msgs)} read by {r['agent']} in {s.room_name}"
                      + (f" at {fmt.stamp(r['read_at'])}" if r["read_at"] else "")
                      + (f" ({r['unread']} unread since)" if r["unread"] else "")
                      + (":" if msgs else ""))
            elif not msgs:
                print(f"nothing new for {r['agent']} in {s.room_name}")
                return
            else:
                print(f"{len(msgs)} new for {r['agent']} in {s.room_name}"
                      + (" (peek: still unread)" if peek else "") + ":")
            name = model.namer(s.room.view().agent_ids() + [ev["from"] for ev in msgs])
            for ev in msgs:
                print(_event_line(ev, name))
            if r["remaining"]:
                print(f"{r['remaining']} more: run gitdrop inbox again")
        s.emit(dict(r, room=s.room_name), show)
        sys.stdout.flush()   # out before the read cursor moves
        said.append(True)
    r = s.room.inbox(s.agent, limit=limit, peek=peek, shown_first=say, again=again)
    if not said:   # peek, again, or nothing new: no cursor moves
        say(r)


@command(app, "history")
def history(s: Scope,
            n: Annotated[int, typer.Option("-n", min=1, help="How many messages.")] = 10,
            task: Annotated[str, typer.Option("--task", help="Only about this task.")] = ""):
    """The room's last N messages, oldest first (marks nothing read)."""
    # a long room with few messages (or few about the task) is read back a long way
    with progress(f"reading {s.room_name}'s history", quiet=s.json, after=0.3):
        msgs = s.room.history(n, task)

    def show():
        if not msgs:
            print(f"no messages about task {task} in {s.room_name}" if task else
                  f"no messages in {s.room_name} yet")
        name = model.namer(s.room.view().agent_ids() + [x for ev in msgs
                                                        for x in [ev["from"], *ev["to"]]])
        for ev in msgs:
            to = ", ".join(name(x) for x in ev["to"])
            text = fmt.shown(ev["text"]).rstrip("\n").replace("\n", "\n    ")
            print(f"{paint(name(ev['from']), 'bold')} → {to}  {paint(ago(ev['time']), 'dim')}")
            print(f"    {text}")
    s.emit({"room": s.room_name, "messages": msgs}, show)


@command(app, "log")
def log(s: Scope,
        n: Annotated[int, typer.Option("-n", min=1, help="How many acts.")] = 20,
        at: Annotated[str, typer.Option("--at", help="As of this commit.")] = ""):
    """The room's audit history, one line per act (each act is a commit)."""
    acts = s.room.log(n, at)

    def show():
        for a in acts:
            when = f"{ago(a['time']):>8}"
            print(f"{paint(short_id(a['id']), 'yellow')} {paint(when, 'dim')} "
                  f"{a['author']:<20} {fmt.shown(a['subject'])}")
    s.emit({"room": s.room_name, "log": acts}, show)
