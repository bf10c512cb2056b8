"""The task state machine: one table that the rules, the verbs, the docs and the
tests all read.

Each move: the states it leaves from, the state it goes to, who may make it and
which header fields it may change besides `state`, `updated` and `note`.
Who: assignee, reviewer (the task's reviewer, else a lead of the assignee's
team, else any lead), lead, creator, member (any registered agent; for reap also
the hub's reaper, hub/reaper).

A task created with review = false is done by its assignee (complete) instead of
going through review. The assignee may release a task back to pending (a worker
that stops, or that failed and retries later: then it counts a retry and may set
not_before, a backoff that `ready` respects).

A task in assigned or in_progress is held on a lease (`lease_until`, set by the
moves that hand it over and by renew; and renewed by every act of the assignee
in the room, see rules.lease_expiry). Once it has expired anyone may reap the
task: back to pending, counted as a retry, or to failed past max_retries.
"""

STATES = ("pending", "assigned", "in_progress", "review", "completed", "failed",
          "blocked", "feedback", "cancelled")
TERMINAL = ("completed", "cancelled")
OPEN = tuple(s for s in STATES if s not in TERMINAL)

# move: (from states, to state, who may, fields it may change)
MOVES = {
    "assign":  (("pending", "assigned"), "assigned", ("lead", "creator"),
                ("assignee", "reviewer", "signoffs", "resume", "lease_until")),
    "claim":   (("pending",), "assigned", ("member",), ("assignee", "lease_until")),
    "start":   (("assigned",), "in_progress", ("assignee",), ("lease_until",)),
    "submit":  (("in_progress",), "review", ("assignee",), ()),
    "approve": (("review",), "completed", ("reviewer",), ()),
    "reject":  (("review",), "in_progress", ("reviewer",), ()),
    "fail":    (("assigned", "in_progress"), "failed", ("assignee", "lead"), ()),
    "retry":   (("failed",), "assigned", ("lead", "creator"),
                ("assignee", "retries", "signoffs", "lease_until")),
    "reap":    (("assigned", "in_progress"), "reap", ("member",),
                ("assignee", "retries", "signoffs", "lease_until")),
    "block":   (("assigned", "in_progress"), "blocked", ("assignee", "lead"), ("resume",)),
    "unblock": (("blocked",), "resume", ("assignee", "lead"), ("resume",)),
    "ask":     (("assigned", "in_progress"), "feedback", ("assignee",),
                ("question", "answer", "resume")),
    "answer":  (("feedback",), "resume", ("creator", "lead"), ("answer", "resume")),
    "cancel":  (OPEN, "cancelled", ("creator", "lead"), ()),
    "sign":    (("assigned",), "assigned", ("lead",), ("signoffs",)),
    "edit":    (OPEN, "same", ("creator", "lead", "assignee"),
                ("title", "priority", "tags", "project", "reviewer", "max_retries", "body",
                 "after", "requires", "parent", "review", "brief", "handshake")),
    "renew":   (("assigned", "in_progress"), "same", ("assignee",), ("lease_until",)),
    "complete": (("in_progress",), "completed", ("assignee",), ()),
    "release": (("assigned", "in_progress"), "pending", ("assignee",),
                ("assignee", "retries", "signoffs", "lease_until", "not_before")),
}

# Moves the hub's own identities make without registering: hub/reaper reaps, and
# the operator reviews what no lead may (a lead's own work, in an open room).
HUB_MOVES = ("reap", "approve", "reject")

# Moves that need a note (the reason) in the commit.
NEEDS_NOTE = ("reject", "fail", "block", "ask", "answer", "reap")


def target(move: str, task: dict) -> str:
    to = MOVES[move][1]
    if to == "resume":
        return task.get("resume") or "assigned"
    if to == "same":
        return task["state"]
    if to == "reap":  # counted as a retry: past max_retries the task fails
        return "failed" if task.get("retries", 0) >= task.get("max_retries", 0) else "pending"
    return to


def moves_between(old_state: str, new_state: str) -> list[str]:
    """Candidate moves for a hand-edited state change, in table order."""
    out = []
    for move, (frm, to, _who, _fields) in MOVES.items():
        if old_state in frm and (to == new_state or to in ("resume",) or
                                 (to == "reap" and new_state in ("pending", "failed")) or
                                 (to == "same" and old_state == new_state)):
            out.append(move)
    return out


def move_to(task: dict, status: str) -> str:
    """The move that takes a task from its state to `status`, or "" (for tools that
    speak in target states, like the reference's update_task)."""
    for move in moves_between(task["state"], status):
        if MOVES[move][1] != "same" and move not in ("sign", "reap") and target(move, task) == status:
            return move
    return ""


def hand_in(task: dict) -> str:
    """The move that hands in a task's work: submit (to review), or complete when it
    was made without review."""
    return "submit" if task.get("review", True) else "complete"


def legal_moves(state: str, task: dict | None = None, roles=None) -> str:
    """What may happen next to a task in `state`, in words (for refusals): with the
    task, only the ends its review setting allows; with `roles` (what the caller is
    to it: assignee, creator, lead, reviewer, member), only the moves it may make."""
    legal = []
    for m, (frm, to, who, _f) in MOVES.items():
        if state not in frm or to == "same" or m == "sign":
            continue   # edit, renew, sign: no change of state
        if task is not None and m in ("submit", "complete") and m != hand_in(task):
            continue
        if roles is not None and (not set(who) & set(roles) or
                                  (m == "reap" and "assignee" in roles)):
            continue   # (its assignee gives a task back by release, not reap)
        legal.append(f"{m} (→ {_SAID.get(to, to)})")
    if not legal:
        return f"{state} is final; create a new task instead" if state in TERMINAL else \
            f"nothing you may do moves it from {state}: ask its assignee, creator or a lead"
    return f"from {state} you may: " + ", ".join(legal)


_SAID = {"reap": "pending, or failed past max_retries", "resume": "where it was"}


def table_markdown() -> str:
    rows = ["| move | from | to | who | may also change |", "|---|---|---|---|---|"]
    for move, (frm, to, who, fields) in MOVES.items():
        to_s = {"resume": "the state in resume (where it was)", "same": "(unchanged)",
                "reap": "pending (failed past max_retries)"}.get(to, to)
        rows.append(f"| {move} | {', '.join(frm)} | {to_s} | {', '.join(who)} | "
                    f"{', '.join(fields) or '-'} |")
    return "\n".join(rows)
