"""`gitdrop task ...`: create, list, show, and each move of the state machine
(gitdrop/machine.py decides which moves exist and who may make them)."""

from typing import Annotated, Optional

import typer

from .base import Scope, command, paint, read_text, short_id, split_list, sub_app, table
from .. import fmt
from ..errors import UsageError

task_app = sub_app("task", "Tasks: create, list, show, and move them through their states.")
app = typer.Typer(add_completion=False)   # top-level: gitdrop ready

Id = Annotated[str, typer.Argument(help="The task's id.", metavar="ID", show_default=False)]
Reason = Annotated[str, typer.Option("--reason", help="Why (required).", show_default=False)]
Note = Annotated[str, typer.Option("--note", help="A note for the record.")]

STATE_COLOUR = {"completed": "green", "review": "magenta", "in_progress": "cyan",
                "failed": "red", "blocked": "red", "feedback": "yellow", "cancelled": "dim"}


@command(task_app, "create")
def create(s: Scope,
           title: Annotated[str, typer.Argument(help="A short title.")],
           assign: Annotated[str, typer.Option("--assign", "-a", help="The assignee.")] = "",
           priority: Annotated[int, typer.Option("--priority", "-p", help="Higher first.")] = 0,
           tag: Annotated[Optional[list[str]], typer.Option(
               "--tag", help="A tag (repeat, or a comma list).")] = None,
           body: Annotated[Optional[str], typer.Option(
               "--body", help="The instructions.", show_default=False)] = None,
           body_file: Annotated[Optional[str], typer.Option(
               "--body-file", help="Read the instructions from a file ('-': stdin).",
               show_default=False)] = None,
           handshake: Annotated[int, typer.Option(
               "--handshake", min=0, help="Bind it to a handshake: it cannot start before GO.")] = 0,
           max_retries: Annotated[Optional[int], typer.Option(
               "--max-retries", min=0, help="Retries allowed after failure (default: the room's).",
               show_default=False)] = None,
           reviewer: Annotated[str, typer.Option("--reviewer", help="Who reviews it.")] = "",
           project: Annotated[str, typer.Option(
               "--project", help="A project it belongs to (task list --project lists them).")] = "",
           after: Annotated[Optional[list[str]], typer.Option(
               "--after", metavar="ID", help="A task this one waits on: it cannot be claimed "
               "or started before that one completes (repeat, or a comma list).")] = None,
           requires: Annotated[Optional[list[str]], typer.Option(
               "--requires", metavar="CAP", help="A capability its assignee must have "
               "(repeat, or a comma list; agents declare them with register --cap).")] = None,
           parent: Annotated[str, typer.Option("--parent", metavar="ID",
                                               help="The task this one is part of.")] = "",
           brief: Annotated[Optional[str], typer.Option(
               "--brief", metavar="FILE", help="A self-contained brief as the body (checked: "
               "Objective and Acceptance criteria sections; '-': stdin).",
               show_default=False)] = None,
           template: Annotated[Optional[str], typer.Option(
               "--template", metavar="NAME", help="Start the brief from templates/briefs/NAME.md "
               "(task, bugfix) or a file.", show_default=False)] = None,
           no_review: Annotated[bool, typer.Option(
               "--no-review", help="Its assignee completes it (gitdrop task complete) "
               "without a review.")] = False,
           key: Annotated[str, typer.Option(
               "--key", help="Idempotency key: a retry with the same key creates one "
               "task (env GITDROP_KEY).")] = ""):
    """Create a task; prints its id (with --json, {"id": ...})."""
    if sum(x is not None for x in (body, body_file, brief, template)) > 1:
        raise UsageError("give one of --body, --body-file, --brief and --template",
                         "keep one of them")
    if template is not None:
        from ..brief import template as load
        text = load(template)
    elif brief is not None:
        text = read_text(None, brief, "brief")
    else:
        text = read_text(body, body_file, "body")
    r = s.room.create_task(s.agent, title, body=text, assignee=assign, priority=priority,
                           tags=split_list(tag), handshake=handshake, max_retries=max_retries,
                           project=project, reviewer=reviewer, key=key or s.key,
                           after=split_list(after), requires=split_list(requires),
                           parent=parent, review=not no_review,
                           brief=brief is not None or template is not None)
    s.note(f"created task {r['id']}" + (f" for {r['assignee']}" if r["assignee"] else "")
           + f" ({r['state']}) [{short_id(r['commit'])}]")
    s.emit(r, r["id"])


@command(task_app, "list")
def list_(s: Scope,
          state: Annotated[str, typer.Option(
              "--state", metavar="STATE[,STATE]",
              help="Only these states (comma list): pending, assigned, in_progress, review, "
              "completed, failed, blocked, feedback, cancelled.")] = "",
          assignee: Annotated[str, typer.Option(
              "--assignee", help="Only this agent's ('none': unassigned).")] = "",
          tag: Annotated[str, typer.Option("--tag")] = "",
          able: Annotated[str, typer.Option(
              "--able", metavar="AGENT", help="Only tasks this agent has the required "
              "capabilities for.")] = "",
          all_: Annotated[bool, typer.Option(
              "--all", help="Include completed and cancelled.")] = False):
    """The room's tasks, highest priority first (done ones hidden unless --all)."""
    from ..machine import STATES
    bad = [x for x in split_list([state]) if x not in STATES]
    if bad:
        raise UsageError(f"unknown state {', '.join(map(repr, bad))}; the states are "
                         + ", ".join(STATES), "e.g. gitdrop task list --state review,blocked")
    tasks = s.room.list_tasks(state=state, assignee=assignee, tag=tag, include_done=all_,
                              able=able)

    def show():
        if not tasks:
            print(f"no tasks in {s.room_name}" + (" match" if state or assignee or tag or able
                                                  else ""))
            return
        _task_table(tasks)
    s.emit({"room": s.room_name, "tasks": tasks}, show)


def _task_table(tasks) -> None:
    waits = any(t.get("waiting_on") or t.get("blocked_by") for t in tasks)
    table(["id", "state", "prio", "assignee", "title", "tags"] + ["waits on"] * waits,
          [(t["id"], (t["state"], STATE_COLOUR.get(t["state"], "bold")), t["priority"],
            t["assignee"] or "-", t["title"],
            ", ".join(t["tags"] + ["needs " + r for r in t["requires"]]))
           + (((f"blocked: {t['blocked_by']}", "red") if t.get("blocked_by") else
               ", ".join(t.get("waiting_on", ())) or "-",) * waits) for t in tasks])


@command(app, "ready")
def ready(s: Scope,
          claim_: Annotated[bool, typer.Option(
              "--claim", help="Claim the best one (exactly one winner per task under a "
              "race; your own assigned or in-progress task comes first).")] = False,
          tag: Annotated[str, typer.Option("--tag", help="Only tasks with this tag.")] = "",
          limit: Annotated[int, typer.Option("--limit", "-n", min=0)] = 20):
    """The tasks you may take now: yours and pending ones whose dependencies are done and
    whose required capabilities you have; by priority, then age."""
    if claim_:
        r = s.room.claim_next(s.agent, tag=tag)
        if not r["task"]:
            s.emit(r, f"nothing is ready for {s.agent} in {s.room_name}")
            return
        tid = r["task"]
        if r["state"] == "in_progress":   # started already: what ends it is next
            from ..machine import hand_in
            step = s.again(f"task {hand_in(s.room.task(tid))} {tid}", s.room_name)
        else:
            step = s.again(f"task start {tid}", s.room_name)
        s.emit(r, (f"claimed task {tid}: {r['title']} [{short_id(r['commit'])}]"
                   if r["claimed"] else f"task {tid} is already yours ({r['state']}): "
                   f"{r['title']}") + f"\nnext: {step}")
        return
    tasks = s.room.ready(s.agent, tag=tag, limit=limit)

    def show():
        if not tasks:
            print(f"nothing is ready for {s.agent} in {s.room_name}")
            return
        _task_table(tasks)
    s.emit({"room": s.room_name, "agent": s.agent, "tasks": tasks}, show)


@command(task_app, "graph")
def graph(s: Scope, task_id: Annotated[Optional[str], typer.Argument(
        help="Only what this task waits on and what waits on it.", metavar="[ID]",
        show_default=False)] = None,
          dot: Annotated[bool, typer.Option("--dot", help="Graphviz dot.")] = False):
    """The dependency graph: each task under the tasks it waits on."""
    from ..deps import graph_dot, graph_text
    g = s.room.graph(task_id or "")
    if dot and not s.json:
        print(graph_dot(g))
        return
    s.emit(dict(g, room=s.room_name), graph_text(g) or f"no tasks in {s.room_name}")


@command(task_app, "edit")
def edit(s: Scope, task_id: Id,
         title: Annotated[Optional[str], typer.Option("--title", show_default=False)] = None,
         priority: Annotated[Optional[int], typer.Option("--priority", "-p",
                                                         show_default=False)] = None,
         tag: Annotated[Optional[list[str]], typer.Option(
             "--tag", help="The tags (replaces them; '' for none).", show_default=False)] = None,
         after: Annotated[Optional[list[str]], typer.Option(
             "--after", metavar="ID", help="What it waits on (replaces the list; '' for "
             "nothing).", show_default=False)] = None,
         requires: Annotated[Optional[list[str]], typer.Option(
             "--requires", metavar="CAP", help="Required capabilities (replaces them).",
             show_default=False)] = None,
         parent: Annotated[Optional[str], typer.Option("--parent", metavar="ID",
                                                       show_default=False)] = None,
         reviewer: Annotated[Optional[str], typer.Option("--reviewer",
                                                         show_default=False)] = None,
         handshake: Annotated[Optional[int], typer.Option(
             "--handshake", metavar="ID", help="Bind it to another handshake (0: none); "
             "creator or lead, before work starts.", show_default=False)] = None):
    """Change a task's title, priority, tags, dependencies, required capabilities, parent,
    reviewer (creator, lead or assignee) or handshake (creator or lead)."""
    edits = {k: v for k, v in {"title": title, "priority": priority, "parent": parent,
                               "reviewer": reviewer, "handshake": handshake}.items()
             if v is not None}
    for k, v in (("tags", tag), ("after", after), ("requires", requires)):
        if v is not None:
            edits[k] = [x.lstrip("#") for x in split_list(v)]
    if not edits:
        raise UsageError("nothing to change", "give --title, --priority, --tag, --after, "
                         "--requires, --parent, --reviewer or --handshake")
    _move(s, task_id, "edit", **edits)


@command(task_app, "show")
def show(s: Scope, task_id: Id):
    """One task: its header, then its instructions."""
    t = s.room.task(task_id)
    lease = s.room.lease(task_id)
    t["lease"] = lease

    def human():
        print(f"task {t['id']}: {paint(fmt.shown(t['title']), 'bold')}")
        for k in ("state", "assignee", "reviewer", "creator", "priority", "tags", "requires",
                  "after", "waiting_on", "blocked_by", "parent", "handshake", "retries",
                  "max_retries", "signoffs", "question", "answer", "note", "project"):
            v = t.get(k)
            if v not in ("", [], 0, None) or k in ("state", "priority"):
                v = ', '.join(v) if isinstance(v, list) else v
                print(f"  {k + ':':<12} {fmt.shown(v) if isinstance(v, str) else v}")
        if lease["until"]:
            print(f"  {'lease:':<12} {'expired' if lease['expired'] else 'held'} "
                  f"{'at' if lease['expired'] else 'until'} {fmt.stamp(lease['until'])}"
                  + (" (anyone may reap it: gitdrop task reap " + str(t["id"]) + ")"
                     if lease["expired"] else ""))
        if t["brief"]:
            from ..brief import render
            print()
            print(fmt.shown(render(t["body"])))
        elif t["body"].strip():
            print()
            print(fmt.shown(t["body"]).rstrip("\n"))
    s.emit({"task": t}, human)


def _move(s: Scope, task_id: str, move: str, **kw) -> None:
    r = s.room.move_task(s.agent, task_id, move, key=s.key, **kw)
    state = paint(r["state"], STATE_COLOUR.get(r["state"], "bold"))
    line = (f"task {r['id']}: {r['from']} → {state}" if r["from"] != r["state"]
            else f"task {r['id']}: {move} ({r['state']})")
    s.emit(r, line + f" [{short_id(r['commit'])}]")


@command(task_app, "assign")
def assign(s: Scope, task_id: Id, agent: Annotated[str, typer.Argument(help="The assignee.")]):
    """Assign a task (lead or creator)."""
    _move(s, task_id, "assign", assignee=agent)


@command(task_app, "claim")
def claim(s: Scope, task_id: Id):
    """Take a pending task for yourself (exactly one of two claimers wins)."""
    _move(s, task_id, "claim")


@command(task_app, "start")
def start(s: Scope, task_id: Id):
    """Start your assigned task (waits for GO if it is bound to a handshake)."""
    _move(s, task_id, "start")


@command(task_app, "submit")
def submit(s: Scope, task_id: Id, note: Note = ""):
    """Hand your work in for review."""
    _move(s, task_id, "submit", note=note)


@command(task_app, "complete")
def complete(s: Scope, task_id: Id, note: Note = ""):
    """Finish your in_progress task that needs no review (created with --no-review)."""
    _move(s, task_id, "complete", note=note)


@command(task_app, "release")
def release(s: Scope, task_id: Id, note: Note = "",
            failed: Annotated[bool, typer.Option(
                "--failed", help="It failed: count a retry (refused past max_retries).")] = False,
            retry_in: Annotated[int, typer.Option(
                "--retry-in", metavar="SECONDS", min=0, help="Not offered by ready before then "
                "(a backoff).")] = 0):
    """Give your task back (to pending, unassigned) for someone else to take."""
    _move(s, task_id, "release", note=note, failed=failed, retry_in=retry_in)


@command(task_app, "approve")
def approve(s: Scope, task_id: Id, note: Note = ""):
    """Approve reviewed work (the reviewer: the lead of the assignee's team)."""
    _move(s, task_id, "approve", note=note)


@command(task_app, "reject")
def reject(s: Scope, task_id: Id, reason: Reason):
    """Send reviewed work back for rework (the reviewer)."""
    _move(s, task_id, "reject", note=reason)


@command(task_app, "fail")
def fail(s: Scope, task_id: Id, reason: Reason):
    """Give up on a task (it can be retried by a lead)."""
    _move(s, task_id, "fail", note=reason)


@command(task_app, "retry")
def retry(s: Scope, task_id: Id, agent: Annotated[Optional[str], typer.Argument(
        help="A new assignee (default: the same).", show_default=False)] = None):
    """Retry a failed task (lead or creator; counts against max_retries)."""
    _move(s, task_id, "retry", assignee=agent or "")


@command(task_app, "block")
def block(s: Scope, task_id: Id, reason: Reason):
    """Mark a task blocked (unblock returns it to where it was)."""
    _move(s, task_id, "block", note=reason)


@command(task_app, "unblock")
def unblock(s: Scope, task_id: Id, note: Note = ""):
    """Unblock a task."""
    _move(s, task_id, "unblock", note=note)


@command(task_app, "ask")
def ask(s: Scope, task_id: Id, question: Annotated[str, typer.Option(
        "--question", "-q", help="What you need to know.", show_default=False)],
        wait: Annotated[bool, typer.Option(
            "--wait", help="Wait for the answer and print it (for scripts and workers).")] = False,
        timeout: Annotated[Optional[float], typer.Option(
            "--timeout", metavar="SECONDS", min=0, help="With --wait: give up after this long "
            "(exit 124).", show_default=False)] = None):
    """Ask the task's creator a question (the task waits in feedback; gitdrop feedback
    list shows it to people)."""
    if not wait:
        _move(s, task_id, "ask", question=question, note=question)
        return
    from ..worker import wait_for_answer
    r = s.room.move_task(s.agent, task_id, "ask", question=question, note=question, key=s.key)
    hub = s.hub_value if s.hub_value else s.hub.path
    try:
        answer_ = wait_for_answer(hub, s.room, r["id"], timeout)
    except TimeoutError as e:
        s.note(f"{e} (the question stays open: gitdrop feedback list)")
        raise typer.Exit(124)
    s.emit({"id": r["id"], "task": r["id"], "answer": answer_}, answer_)


@command(task_app, "answer")
def answer(s: Scope, task_id: Id, text: Annotated[str, typer.Argument(help="The answer.")]):
    """Answer a question on a task (creator or lead); work resumes."""
    _move(s, task_id, "answer", answer=text, note=text)


@command(task_app, "cancel")
def cancel(s: Scope, task_id: Id, reason: Annotated[str, typer.Option("--reason")] = ""):
    """Cancel a task (creator or lead)."""
    _move(s, task_id, "cancel", note=reason)


@command(task_app, "renew")
def renew(s: Scope, task_id: Id, for_: Annotated[Optional[int], typer.Option(
        "--for", metavar="SECONDS", min=1, help="Hold it this long from now (default: the room's "
        "task_lease; at most its max_task_lease).", show_default=False)] = None):
    """Renew the lease on your task (any act of yours in the room renews it too)."""
    _move(s, task_id, "renew", lease=for_ or 0)


@command(task_app, "reap")
def reap(s: Scope, task_id: Id, reason: Annotated[str, typer.Option("--reason")] = ""):
    """Return a task whose lease has expired to pending (anyone; counts as a retry,
    and past max_retries it fails)."""
    _move(s, task_id, "reap", note=reason)


@command(task_app, "sign")
def sign(s: Scope, task_id: Id):
    """Sign off a cross-team task (each team's lead signs before it starts)."""
    _move(s, task_id, "sign")
