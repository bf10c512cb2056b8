"""What a commit means to people: who it is for, and a line that tells it.

Used by the inbox, the notifier and the log, so every face tells the same story.
Messages come from `send` commits; notices are derived from the files a task or
handshake commit leaves behind, so a commit pushed by hand notifies like any other.
"""

from . import fmt, model, rules
from .view import CommitData, RoomView, parse_file

NOTICE_OPS = {
    "task-create": "assignee", "task-assign": "assignee", "task-retry": "assignee",
    "task-reject": "assignee", "task-answer": "assignee", "task-unblock": "assignee",
    "task-approve": "assignee", "task-cancel": "assignee", "task-submit": "reviewer",
    "task-ask": "creator", "task-fail": "creator", "task-sign": "assignee",
    "task-reap": "reaped", "handshake-start": "targets", "handshake-ack": "go",
    "task-complete": "creator", "task-release": "creator", "task-claim": "assignee",
}
# Moves that give a task an assignee: across teams, the leads who must sign it
# before it starts are told too (nothing told them; a worker waited on them unknown).
_SIGN_OWED = ("task-create", "task-assign", "task-claim", "task-retry")
LEADS = "@leads"
ABLE = "@able:"   # + required capabilities: every agent that has them


def op_of(reader, c: CommitData) -> tuple[str, str]:
    """(op, path of the file it touched): from trailers, or inferred from the diff."""
    op = c.op
    task = fmt.trailer(c.trailers, "task")
    hs = fmt.trailer(c.trailers, "handshake")
    if rules.is_message(reader, c):
        return "send", ""
    if op and not op.startswith(("task-", "handshake-")):
        return op, ""
    if op and op.startswith("task-") and task:
        return op, RoomView(reader, c.tree, c.oid).task_path(task)
    if op and op.startswith("handshake-") and hs:
        return op, model.handshake_path(hs)
    parent_tree = reader.commit(c.parent).tree if c.parent else None
    diff = reader.diff(parent_tree, c.tree)
    if not diff:
        return op or "send", ""
    if op:
        return op, diff[0][0]
    from .view import changes_between  # only for commits made by hand
    try:
        view = RoomView(reader, parent_tree, c.parent)
        return rules.infer(view, c, changes_between(reader, parent_tree, c.tree)), diff[0][0]
    except Exception:
        return "unknown", diff[0][0]


def targets(reader, c: CommitData, op: str, path: str) -> list[str]:
    """Who a notice is for; LEADS stands for every lead of the room."""
    who = NOTICE_OPS.get(op)
    if not who or not path:
        return []
    data = reader.read_path(c.tree, path)
    if data is None:
        return []
    kind = "task" if path.startswith("tasks/") else "handshake"
    try:
        doc = parse_file(kind, data.decode("utf-8", "replace"))[0]
    except ValueError:
        return []
    if who == "targets":
        return list(doc["targets"])
    if who == "go":
        return list(doc["targets"]) + [doc["initiator"]] if doc["status"] == "go" else []
    if who == "reaped":  # the former assignee (from the parent's file) and the creator
        prev = reader.read_path(reader.commit(c.parent).tree, path) if c.parent else None
        try:
            was = parse_file("task", prev.decode("utf-8", "replace"))[0]["assignee"] \
                if prev is not None else ""
        except ValueError:
            was = ""
        return [x for x in dict.fromkeys((was, doc["creator"])) if x]
    if op in ("task-approve", "task-complete"):
        mine = [doc[who]] if doc.get(who) else []
        return list(dict.fromkeys(mine + _dependents(reader, c, str(doc["id"]))))
    if who == "reviewer":
        if doc["reviewer"]:
            return [doc["reviewer"]]
        return [LEADS]
    mine = [doc[who]] if doc.get(who) else []
    if op in _SIGN_OWED and doc["assignee"]:
        owed = rules.signers_owed(RoomView(reader, c.tree, c.oid, ""), doc)
        mine += [x for x in owed if x not in mine]
    return mine


def _dependents(reader, c: CommitData, tid: str) -> list[str]:
    """Who to wake when task `tid` completes: the assignees of the tasks waiting on
    it that are now ready, and for an unassigned one everyone able to take it. Read
    from the task index: a room of 10,000 tasks is not parsed again per completion."""
    from . import deps, taskindex
    from .view import RoomView
    headers = taskindex.headers(RoomView(reader, c.tree, c.oid))
    byid = {str(h["id"]): h for h in headers}
    out = []
    for t in deps.dependents(headers, tid):
        if t["state"] in ("pending", "assigned") and not deps.waiting_on(byid.get, t):
            out.append(t["assignee"] if t["assignee"] else ABLE + ",".join(t["requires"]))
    return list(dict.fromkeys(out))


_MEMO: dict[str, dict] = {}
_KEPT = [0]   # about how many bytes of text _MEMO holds
# What the memo may hold: a watcher of a flooded room (16 KB messages) kept 1.2 GB.
MEMO_MOST, MEMO_BYTES = 50000, 64 << 20


def event(reader, c: CommitData, copy: bool = True) -> dict:
    """A commit as a plain dict, for the log and the notifier (a fresh copy:
    callers add keys; copy=False: the one kept, to read only, as whether it
    concerns an agent is asked of every commit for every one watching). A
    commit's meaning depends only on its content, so it is worked out once per
    process: a waiter re-reads the same unread commits on every wake-up."""
    ev = _MEMO.get(c.oid) if c.oid else None
    if ev is None:
        ev = _event(reader, c)
        if c.oid:
            size = 200 + len(ev["text"] or "") + len(ev["subject"] or "")
            if len(_MEMO) >= MEMO_MOST or _KEPT[0] + size > MEMO_BYTES:
                _MEMO.clear()
                _KEPT[0] = 0
            _MEMO[c.oid] = ev
            _KEPT[0] += size
    return dict(ev) if copy else ev


def _event(reader, c: CommitData) -> dict:
    op, path = op_of(reader, c)
    to, cc = rules.recipients(c) if op == "send" else ([], [])
    ev = {"id": c.oid, "op": op, "from": c.author, "time": c.time, "subject": c.subject,
          "to": to, "cc": cc, "text": (c.body or c.subject) if op == "send" else c.body,
          "task": fmt.trailer(c.trailers, "task") or _key(path, "task"),
          "handshake": fmt.trailer(c.trailers, "handshake") or _key(path, "handshake")}
    if op != "send":
        ev["for"] = targets(reader, c, op, path)
    return ev


def _key(path: str, kind: str) -> str:
    got = model.kind_of(path)
    return got[1] if got[0] == kind else ""


def concerns(ev: dict, agent_id: str, lead, caps=()) -> str:
    """How an event reaches an agent ("to", "cc", "team", "all", "lead", "notice") or "".
    `lead` and `caps` (the agent's capabilities) may be functions, asked only where
    the answer depends on them."""
    if ev["from"] == agent_id:
        return ""
    if ev["op"] == "send":
        return rules.reaches(ev["from"], ev["to"], ev["cc"], agent_id, lead)
    targets_ = ev.get("for", [])
    if agent_id in targets_ or (LEADS in targets_ and (lead() if callable(lead) else lead)):
        return "notice"
    for t in targets_:
        if t.startswith(ABLE):
            have = set(caps() if callable(caps) else caps)
            if all(x in have for x in t[len(ABLE):].split(",") if x):
                return "notice"
    return ""


def summary(ev: dict) -> str:
    if ev["op"] == "send":
        return f"{model.short(ev['from'])}: {ev['text'][:200]}"
    return ev["subject"]
