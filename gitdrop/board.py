"""The board: one room at a glance, for the person who runs its agents.

`board_data(room)` gathers what a frame shows from the core's own reads (who,
list_tasks, questions, handshakes, log), so it sees exactly what the commands see:
the agents with their health, the task each is on and its last act (in a big
room only those that matter, busy or recent, with the full count); the tasks in
columns by state, each column capped with its full count; the open questions;
the handshakes still waiting on acks and who owes them; the last events.
`render(data, width, height)` draws that as one rich renderable of the given
size. `task_data`/`render_task` do the same for one task. `gitdrop board`
(gitdrop/cli/board.py) redraws them live.

Nothing here parses a task file: list_tasks reads the task index, so a room of
10,000 tasks costs one pass over its headers.
"""


from . import fmt, model

# The columns, left to right; cancelled tasks are only counted.
COLUMNS = ("pending", "assigned", "in_progress", "review", "feedback", "blocked", "failed",
           "completed")
TITLES = {"pending": "pending", "assigned": "assigned", "in_progress": "in progress",
          "review": "review", "feedback": "feedback", "blocked": "blocked",
          "failed": "failed", "completed": "done"}
STYLES = {"pending": "white", "assigned": "cyan", "in_progress": "blue", "review": "magenta",
          "feedback": "yellow", "blocked": "red", "failed": "red", "completed": "green"}
HEALTH_STYLES = {"healthy": "green", "stale": "yellow", "dead": "red", "unknown": "dim"}
# Which of its tasks an agent is "on", best first.
ON = ("in_progress", "feedback", "review", "blocked", "assigned")
MAIN = ("pending", "in_progress", "review", "completed")   # kept on a narrow screen
PER_COLUMN = 50   # tasks kept per column (the count is always the full one)
EVENTS = 15
AGENTS = 50       # agents kept: who() of 10,000 costs a second a frame (the count is full)
LOG = 200         # commits read for the last events and each shown agent's last act


def _age(ts: int, now: int) -> str:
    if not ts:
        return "-"
    d = max(0, int(now - ts))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if d >= size:
            return f"{d // size}{unit}"
    return f"{d}s"


def _line(text: str, width: int = 80) -> str:
    line = " ".join(str(text or "").strip().split("\n", 1)[0].split())
    return line if len(line) <= width else line[: width - 1] + "…"


def reason(t, waiting_on=(), blocked_by: str = "", owed=()) -> str:
    """Why a task is not moving ("" if nothing holds it): its block reason, its
    question, why it failed, a dependency that failed, what it waits on, or the
    leads whose sign-off it still needs (`owed`) to start."""
    st = t["state"]
    if st == "blocked":
        return t["note"] or "blocked"
    if st == "feedback":
        return "asks: " + (t["question"] or "?")
    if st == "failed":
        return t["note"] or "failed"
    if blocked_by:
        return blocked_by
    if waiting_on and st not in ("completed", "cancelled"):
        return "waits on " + ", ".join("#" + str(d) for d in waiting_on)
    if owed and st == "assigned":
        return "sign-off owed by " + ", ".join(owed)
    return ""


def sign_owed(view, t) -> list[str]:
    """The leads who must still sign an assigned cross-team task before it starts."""
    if t["state"] != "assigned":
        return []
    from .rules import signers_owed
    return signers_owed(view, t)


def _headers(room, view):
    """Every task's header from the room's task index, without list_tasks' full copy
    of each one (0.6 s for 10,000 tasks, where the board shows a few dozen)."""
    if hasattr(room, "task_headers"):
        return room.task_headers(view)
    return room.list_tasks(include_done=True)   # a room without the index reader


def _agents(room, view, held: dict, log: list, limit: int) -> tuple[list[dict], int]:
    """who() of the agents a frame shows, and how many agents the room has. A room
    of at most `limit` shows all; a bigger one the agents that matter, at most
    `limit`: the latest authors, then those on a task (the latest moved first), then
    the leads. Only their files are read."""
    ids = view.agent_ids()
    if len(ids) <= limit:
        return room.who_page()["agents"], len(ids)
    here = set(ids)
    busy = sorted(held, key=lambda a: -max(t["updated"] for t in held[a]))
    pick = []
    for a in [e["author"] for e in reversed(log)] + busy + sorted(
            view.room.get("leads", {}).values()):
        if a in here and a not in pick:
            pick.append(a)
            if len(pick) == limit:
                break
    # A picked agent that never wrote made the walk for last acts go 5,000 commits
    # back (0.7 s through git cat-file): a frame looks as far back as its log.
    return room.who_page(only=pick, walk=LOG)["agents"], len(ids)


def board_data(room, per_column: int = PER_COLUMN, events: int = EVENTS,
               per_agents: int = AGENTS) -> dict:
    """Everything one frame of the board shows, as plain data (the JSON of
    `gitdrop board --json`): `agents` are at most `per_agents` of `agents_total`
    (`agents_more` left out, gitdrop who lists them all)."""
    import heapq

    from . import deps
    now = int(room.clock())
    view = room.view()
    headers = _headers(room, view)
    lookup = {str(h["id"]): h for h in headers}.get
    log = room.log(n=LOG)          # newest last
    handshakes = [h for h in room.handshakes() if h["status"] != "go"]

    by_state = {s: [] for s in COLUMNS}
    counts = {s: 0 for s in COLUMNS + ("cancelled",)}
    held, questions = {}, []
    for t in headers:
        st = t["state"]
        counts[st] = counts.get(st, 0) + 1
        if st in by_state:
            by_state[st].append(t)
        if st in ON and t["assignee"]:
            held.setdefault(t["assignee"], []).append(t)
        if st == "feedback":   # as Room.questions words them, from the same pass
            questions.append({"task": str(t["id"]), "title": t["title"],
                              "question": t["question"], "asked_by": t["assignee"],
                              "for": t["creator"], "since": t["updated"]})
    questions.sort(key=lambda q: (q["since"], deps._num(q["task"])))

    agents, agents_total = _agents(room, view, held, log, per_agents)

    columns = []
    for st in COLUMNS:
        ts = by_state[st]
        if st == "completed":   # the latest first
            top = heapq.nsmallest(per_column, ts, key=lambda t: (-t["updated"],))
        else:                   # the most urgent first: priority, then the oldest
            top = heapq.nsmallest(per_column, ts, key=lambda t: (-t["priority"], t["updated"]))
        rows = []
        for t in top:
            waiting, blocked = deps.waiting_on(lookup, t), deps.blocked_by(lookup, t)
            rows.append({"id": str(t["id"]), "title": t["title"], "priority": t["priority"],
                         "assignee": t["assignee"], "updated": t["updated"],
                         "age": _age(t["updated"], now),
                         "reason": reason(t, waiting, blocked, sign_owed(view, t)),
                         "waiting_on": waiting, "blocked_by": blocked})
        columns.append({"state": st, "count": len(ts), "tasks": rows})

    last = {}
    for e in log:
        last[e["author"]] = e
    out_agents = []
    for a in agents:
        mine = sorted(held.get(a["agent"], []), key=lambda t: (ON.index(t["state"]),
                                                                -t["priority"]))
        cur = mine[0] if mine else None
        act = last.get(a["agent"])
        out_agents.append({
            "agent": a["agent"], "name": a["name"], "team": a["team"], "roles": a["roles"],
            "lead": a["lead"], "human": a["human"], "health": a["health"],
            "status": a["status"], "last_act": a["last_act"],
            "last_act_age": _age(a["last_act"], now),
            "last_act_subject": act["subject"] if act else "",
            "tasks": len(mine),
            "current": {"id": str(cur["id"]), "title": cur["title"], "state": cur["state"]}
            if cur else None})
    order = {"healthy": 0, "stale": 1, "unknown": 2, "dead": 3}
    out_agents.sort(key=lambda a: (order.get(a["health"], 4), a["current"] is None,
                                   -a["last_act"], a["agent"]))

    return {
        "room": room.name, "now": now, "tip": view.commit, "tasks_total": len(headers),
        "counts": counts, "agents": out_agents, "agents_total": agents_total,
        "agents_more": agents_total - len(out_agents), "columns": columns,
        "questions": [dict(q, age=_age(q["since"], now)) for q in questions],
        "handshakes": [{"id": h["id"], "initiator": h["initiator"], "plan": _line(h["plan"]),
                        "targets": h["targets"], "acked": h["acked"], "owed_by": h["pending"],
                        "created": h["created"], "age": _age(h["created"], now)}
                       for h in handshakes],
        "events": [{"id": e["id"], "time": e["time"], "age": _age(e["time"], now),
                    "author": e["author"], "op": e["op"], "subject": e["subject"]}
                   for e in log[-events:]],
    }


def task_data(room, task_id, moves: int = 30) -> dict:
    """One task for the detail view: its header and body, and its last moves
    (every commit that names it, oldest first)."""
    t = room.task(task_id)
    now = int(room.clock())
    hist = room.history(n=moves, task=str(t["id"]), messages_only=False)
    held = reason(t, t["waiting_on"], t["blocked_by"], sign_owed(room.view(), t))
    return {"room": room.name, "now": now, "task": dict(t, reason=held),
            "history": [{"id": e["id"], "time": e["time"], "age": _age(e["time"], now),
                         "author": e["from"], "op": e["op"], "subject": e["subject"],
                         "text": _line(e.get("text", ""), 200)} for e in hist]}


# --- drawing ---------------------------------------------------------------------

def _who(agent: str) -> str:
    return model.short(agent) if agent else ""


def _header(data, note: str = ""):
    from rich.text import Text
    c = data["counts"]
    head = Text()
    head.append(f" board · {data['room']} ", style="bold reverse")
    head.append(f"  {fmt.stamp(data['now'], '%H:%M:%S', local=True)} · "
                f"{data['agents_total']} agents · {data['tasks_total']} tasks"
                + (f" ({c['cancelled']} cancelled)" if c.get("cancelled") else "")
                + f" · {len(data['questions'])} questions · "
                f"{len(data['handshakes'])} handshakes")   # 80 columns hold it whole
    if note:
        head.append("  " + note, style="yellow")
    return head


def _agents_table(data, rows: int):
    from rich.table import Table
    from rich.text import Text
    t = Table(box=None, expand=True, pad_edge=False, header_style="bold", show_edge=False)
    t.add_column("agent", no_wrap=True)
    t.add_column("health", no_wrap=True, width=8)
    t.add_column("on", no_wrap=True, ratio=1)
    t.add_column("last act", no_wrap=True, ratio=1)
    agents = data["agents"]
    cut = len(agents) > rows or data["agents_more"]   # a row kept for "… N more"
    shown = agents[:max(rows - 1, 0)] if cut else agents
    for a in shown:
        name = a["agent"] + (" ★" if a["lead"] else "")
        cur = a["current"]
        on = Text(f"#{cur['id']} {cur['title']}", style=STYLES.get(cur["state"], "")) \
            if cur else Text(a["status"] or "idle", style="dim")
        if cur and a["tasks"] > 1:
            on.append(f" (+{a['tasks'] - 1})", style="dim")
        last = Text(f"{a['last_act_age']:>4} ", style="dim")
        last.append(a["last_act_subject"] or "")
        t.add_row(Text(name), Text(a["health"], style=HEALTH_STYLES.get(a["health"], "")),
                  on, last)
    more = len(agents) - len(shown) + data["agents_more"]
    if more:
        t.add_row(Text(f"… {more} more" + (" (gitdrop who)" if data["agents_more"] else ""),
                       style="dim"), "", "", "")
    return t


def _fits(tasks, lines: int, count: int) -> int:
    """How many of `tasks` fit in `lines`: two lines each (three with a reason),
    keeping one for "… N more" while some are left out."""
    used = 0
    for i, t in enumerate(tasks):
        need = 2 + (1 if t["reason"] else 0)
        if used + need > lines - (1 if count - i > 1 else 0):
            return i
        used += need
    return len(tasks)


def _column(col, lines: int):
    """One state's tasks in `lines` lines, then how many did not fit."""
    from rich.text import Text
    out = Text(no_wrap=True, overflow="ellipsis")
    shown = _fits(col["tasks"], lines, col["count"])
    for i, t in enumerate(col["tasks"][:shown]):
        if i:
            out.append("\n")
        out.append(f"#{t['id']}", style="bold")
        if t["priority"]:
            out.append(f" P{t['priority']}",
                       style="yellow" + (" bold" if t["priority"] >= 2 else ""))
        out.append(" " + _line(t["title"], 200))
        out.append("\n  " + (("@" + _who(t["assignee"])) if t["assignee"] else "unassigned")
                   + f" · {t['age']}", style="dim")
        if t["reason"]:
            out.append("\n  " + _line(t["reason"], 200), style="red")
    if col["count"] > shown:
        out.append(("\n" if shown else "") + f"… {col['count'] - shown} more", style="dim")
    return out


def _entries(out, items, budget: int, draw) -> None:
    """As many two-line items as fit in `budget` lines (one kept for "… N more")."""
    from rich.text import Text
    if not items:
        out.append(Text("none\n", style="dim"))
        return
    fit = len(items) if 2 * len(items) <= budget else max((budget - 1) // 2, 0)
    for it in items[:fit]:
        draw(it)
    if fit < len(items):
        out.append(Text(f"… {len(items) - fit} more\n", style="dim"))


def _side(data, lines: int):
    """Open questions, then handshakes waiting on acks."""
    from rich.text import Text
    out = Text(no_wrap=True, overflow="ellipsis")
    qs, hs = data["questions"], data["handshakes"]
    avail = max(lines - 2, 2)
    q_need, h_need = max(2 * len(qs), 1), max(2 * len(hs), 1)
    q_budget = q_need if q_need + h_need <= avail else \
        max(min(q_need, avail - min(h_need, avail // 2)), 1)

    def question(q):
        out.append(f"#{q['task']} ", style="bold")
        out.append(f"{_who(q['asked_by'])} asks {_who(q['for'])} · {q['age']}\n", style="dim")
        out.append("  " + _line(q["question"], 200) + "\n")

    def handshake(h):
        out.append(f"#{h['id']} ", style="bold")
        out.append(_line(h["plan"], 200) + "\n")
        out.append("  owed by " + ", ".join(_who(x) for x in h["owed_by"])
                   + f" ({len(h['acked'])}/{len(h['targets'])}) · {h['age']}\n", style="red")
    out.append(f"Questions for people ({len(qs)})\n", style="bold yellow")
    _entries(out, qs, q_budget, question)
    out.append(f"Handshakes waiting on acks ({len(hs)})\n", style="bold cyan")
    _entries(out, hs, avail - q_budget, handshake)
    out.rstrip()
    return out


def _events(data, lines: int):
    from rich.text import Text
    out = Text(no_wrap=True, overflow="ellipsis")
    evs = data["events"][-max(lines, 1):]
    for i, e in enumerate(evs):
        if i:
            out.append("\n")
        out.append(f"{fmt.stamp(e['time'], '%H:%M:%S', local=True)} ", style="dim")
        out.append(f"{_who(e['author'])}: ", style="bold")
        out.append(e["subject"])
    if not evs:
        out.append("nothing yet", style="dim")
    return out


def render(data: dict, width: int = 160, height: int = 50, note: str = "",
           footer: str = ""):
    """One frame of the board, `width` x `height` cells."""
    from rich.layout import Layout
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    height = max(height, 16)
    agents_rows = min(len(data["agents"]) + 1 + bool(data["agents_more"]),
                      max(3, (height - 6) // 4))
    bottom = max(6, min(EVENTS + 2, (height - 6) // 3))
    middle = height - 2 - (agents_rows + 3) - bottom
    layout = Layout()
    layout.split_column(
        Layout(_header(data, note), name="head", size=1),
        Layout(Panel(_agents_table(data, agents_rows), title=f"Agents ({data['agents_total']})",
                     title_align="left", border_style="dim"), name="agents",
               size=agents_rows + 3),
        Layout(name="tasks", size=max(middle, 5)),
        Layout(name="bottom", size=bottom),
        Layout(Text(footer or " q quit · r next room · t ID Enter open a task", style="dim"),
               name="foot", size=1))

    cols = data["columns"]
    if width // len(cols) < 24:   # narrow: the empty columns go first, then the quiet ones
        cols = [c for c in cols if c["count"] or c["state"] in MAIN]
        if width // len(cols) < 16:
            cols = [c for c in cols if c["count"]] or cols[:1]
    lines = max(middle - 3, 2)
    grid = Table.grid(expand=True, padding=(0, 1))
    for _ in cols:
        grid.add_column(ratio=1, no_wrap=True)
    heads = [Text(f"{TITLES[c['state']]} {c['count']}", style="bold " + STYLES[c["state"]])
             for c in cols]
    grid.add_row(*heads)
    grid.add_row(*[_column(c, lines) for c in cols])
    layout["tasks"].update(Panel(grid, title="Tasks", title_align="left", border_style="dim"))

    layout["bottom"].split_row(
        Layout(Panel(_side(data, bottom - 2), title="Waiting for people",
                     title_align="left", border_style="dim"), name="side"),
        Layout(Panel(_events(data, bottom - 2), title="Last events", title_align="left",
                     border_style="dim"), name="events"))
    return layout


def render_task(detail: dict, width: int = 160, height: int = 50, footer: str = ""):
    """One task: its header, its body (the brief) and its moves."""
    from rich.layout import Layout
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    t, now = detail["task"], detail["now"]
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold", no_wrap=True)
    head.add_column()
    rows = [("state", Text(t["state"], style=STYLES.get(t["state"], ""))),
            ("priority", str(t["priority"])),
            ("assignee", t["assignee"] or "unassigned"), ("creator", t["creator"]),
            ("reviewer", t["reviewer"] or "-"),
            ("updated", f"{_age(t['updated'], now)} ago"),
            ("created", f"{_age(t['created'], now)} ago")]
    if t.get("tags"):
        rows.append(("tags", ", ".join(t["tags"])))
    if t.get("after"):
        rows.append(("after", ", ".join("#" + str(a) for a in t["after"])))
    if t.get("requires"):
        rows.append(("requires", ", ".join(t["requires"])))
    if t.get("reason"):
        rows.append(("held by", Text(t["reason"], style="red")))
    if t.get("answer"):
        rows.append(("answer", t["answer"]))
    if t.get("retries"):
        rows.append(("retries", f"{t['retries']} of {t['max_retries']}"))
    for k, v in rows:
        head.add_row(k, v if isinstance(v, Text) else Text(str(v)))

    hist = Text(no_wrap=True, overflow="ellipsis")
    for i, e in enumerate(detail["history"]):
        if i:
            hist.append("\n")
        hist.append(fmt.stamp(e["time"], "%m-%d %H:%M:%S ", local=True), style="dim")
        hist.append(e["subject"])
        if e["text"] and e["text"] != e["subject"]:
            hist.append(f"  {e['text']}", style="dim")
    if not detail["history"]:
        hist.append("no moves found", style="dim")

    height = max(height, 16)
    hsize = len(rows) + 2
    moves = min(len(detail["history"]) + 2, max((height - hsize - 2) // 2, 4))
    layout = Layout()
    layout.split_column(
        Layout(Text(f" task #{t['id']} · {t['title']} ", style="bold reverse", no_wrap=True,
                    overflow="ellipsis"), size=1),
        Layout(Panel(head, title="Task", title_align="left", border_style="dim"), size=hsize),
        Layout(Panel(Text(t.get("body") or "(no body)"), title="Brief", title_align="left",
                     border_style="dim")),
        Layout(Panel(hist, title="History", title_align="left", border_style="dim"),
               size=moves),
        Layout(Text(footer or " Esc/b back · q quit", style="dim"), size=1))
    return layout
