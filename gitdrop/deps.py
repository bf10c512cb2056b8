"""Tasks that wait on tasks, and who may take what.

A task's `after` lists the tasks it waits on; `requires` the capabilities an
agent needs to hold it (an agent declares its `caps` when it registers). Blocked
by a dependency is worked out, not stored: a task whose dependency failed or was
cancelled shows as blocked with that task's reason, and frees itself the moment
the dependency is retried and completes. Pure functions over a lookup
`tasks(id) -> header | None`, read by the rules, the core and the faces alike.
"""

from . import model

MAX_AFTER = 64   # dependencies one task may list
# Tasks a change of dependencies may reach, walking up them (each is read): every
# edit walked a whole chain, and one push of 1,000 edits on a chain of 5,000 held
# the hook 71 s. A task made new walks nothing (nothing can wait on it yet).
MAX_REACH = 1000
INDENT_MOST = 40   # levels task graph indents (each one two spaces: 25 MB for 5,000)


def lookup(view):
    """`tasks(id) -> header | None` over a RoomView."""
    return lambda tid: (view.task(tid) or (None,))[0]


def problem(tasks, tid: str, after, requires, new: bool = False) -> str:
    """What is wrong with a task's `after` and `requires` ("" if nothing). `new`: a
    task being made, which nothing can wait on yet, so it closes no cycle (the walk
    up a chain of 2,000 took a second a task: a push of a chain, hours)."""
    if len(after) > MAX_AFTER:
        return f"{len(after)} dependencies; a task may wait on at most {MAX_AFTER}"
    if len(set(after)) != len(after):
        return "a dependency is listed twice"
    for d in after:
        if d == tid:
            return f"task {tid} cannot wait on itself"
        if tasks(d) is None:
            return f"task {tid} waits on task {d}, which does not exist"
    for cap in requires:
        why = model.NAME_RE.problem(cap)
        if why:
            return f"required capability {cap!r}: {why}"
    try:
        loop = [] if new else cycle(tasks, tid, after)
    except TooFar:
        return (f"task {tid}'s dependencies, and theirs, would reach more than {MAX_REACH} "
                "tasks; a change of them is judged only below that")
    if loop:
        return "the dependencies would make a cycle: " + " → ".join(loop)
    return ""


class TooFar(Exception):
    """A walk up the dependencies reached more than MAX_REACH tasks."""


def cycle(tasks, tid: str, after) -> list[str]:
    """The ids of a cycle that `tid` waiting on `after` would close, or []. Each task
    is visited once, and where it was reached from kept (not a copy of the path
    so far for each: that was quadratic in a chain's length)."""
    came = {d: tid for d in after}
    stack = list(came)
    while stack:
        cur = stack.pop()
        if cur == tid:
            path, at = [tid], came[tid]
            while at != tid:
                path.append(at)
                at = came[at]
            return [tid] + path[::-1]
        for d in (tasks(cur) or {}).get("after", ()):
            if d not in came:
                came[d] = cur
                stack.append(d)
        if len(came) > MAX_REACH:
            raise TooFar
    return []


def waiting_on(tasks, task: dict) -> list[str]:
    """The dependencies of `task` not yet completed."""
    out = []
    for d in task.get("after", ()):
        t = tasks(d)
        if t is None or t["state"] != "completed":
            out.append(d)
    return out


def lease_waits_on(tasks, task: dict) -> list[str]:
    """The dependencies a held task waits on, whose lease runs only from when they
    complete (the reaper leaves it); none once one of them, or one they wait on in
    turn, failed, was cancelled or is gone: it will never complete, so the task is
    stuck, not waiting (an assignee that pointed its task at a cancelled one, or at
    one waiting on a cancelled one, held it past every reap)."""
    return [] if stuck_on(tasks, task) else waiting_on(tasks, task)


def stuck_on(tasks, task: dict) -> str:
    """Why `task` can never start ("" if it may): a dependency not completed, or
    one of theirs however far up, failed, was cancelled or is gone. Past MAX_REACH
    tasks walked, stuck too: a lease is not held on more than the rules judge."""
    seen, todo = set(), [task]
    while todo:
        t = todo.pop()
        why = blocked_by(tasks, t)
        if why:
            return why
        for d in t.get("after", ()):
            dt = tasks(d)
            if d not in seen and dt is not None and dt["state"] != "completed":
                seen.add(d)
                todo.append(dt)
        if len(seen) > MAX_REACH:
            return f"its dependencies reach more than {MAX_REACH} tasks"
    return ""


def blocked_by(tasks, task: dict) -> str:
    """Why `task` cannot go on because of a dependency ("" when none failed): a
    dependency that failed or was cancelled, with its reason."""
    for d in task.get("after", ()):
        t = tasks(d)
        if t is None:
            return f"task {d} is gone"
        if t["state"] in ("failed", "cancelled"):
            return f"task {d} {t['state']}" + (f": {t['note']}" if t.get("note") else "")
    return ""


def missing_caps(caps, task: dict) -> list[str]:
    """The capabilities `task` requires that `caps` lacks."""
    have = set(caps or ())
    return [c for c in task.get("requires", ()) if c not in have]


def ready(tasks, headers, agent: str, caps, tag: str = "", now: int = 0) -> list[dict]:
    """The tasks `agent` may take now, best first: its own assigned or in-progress
    tasks (work to resume: after a question was answered, after a restart), then
    pending unassigned ones, whose dependencies are completed and whose required
    capabilities it has (and carrying `tag`, if given; a comma list: any of them),
    not held back by a retry's backoff (not_before, against `now`); by priority,
    then age."""
    tags = set(tag.split(",")) - {""} if tag else set()
    out = []
    have = set(caps or ())
    for t in headers:
        state = t["state"]
        if state == "pending":
            if t["assignee"]:
                continue
        elif state not in ("assigned", "in_progress") or t["assignee"] != agent:
            continue
        if tags and tags.isdisjoint(t["tags"]):
            continue
        if now and t["not_before"] > now:
            continue
        if t["requires"] and not have.issuperset(t["requires"]):
            continue
        if t["after"] and waiting_on(tasks, t):
            continue
        out.append(t)
    out.sort(key=lambda t: (t["assignee"] != agent, -t["priority"], t["created"], _num(t["id"])))
    return out


def dependents(headers, tid: str) -> list[dict]:
    """The tasks that wait on `tid`."""
    return [t for t in headers if tid in t.get("after", ())]


def _num(tid) -> int:
    return int(tid) if str(tid).isdigit() else 0


# --- the graph, for people and tools ----------------------------------------

def graph(tasks, headers, root: str = "") -> dict:
    """{"nodes": [...], "edges": [[task, waits_on], ...]}: the whole room's graph, or
    the part connected to `root` (what it waits on and what waits on it)."""
    headers = list(headers)
    if root:
        keep, todo = set(), [root]
        while todo:   # upstream
            cur = todo.pop()
            if cur in keep or tasks(cur) is None:
                continue
            keep.add(cur)
            todo.extend(tasks(cur).get("after", ()))
        waiting = {}   # task -> the tasks that wait on it, built once (a scan per task
        for t in headers:   # was quadratic in a wide graph)
            for d in t.get("after", ()):
                waiting.setdefault(d, []).append(str(t["id"]))
        todo = [root]
        down = set()
        while todo:   # downstream
            cur = todo.pop()
            if cur in down:
                continue
            down.add(cur)
            todo.extend(waiting.get(cur, ()))
        keep |= down
        headers = [t for t in headers if str(t["id"]) in keep]
    headers.sort(key=lambda t: _num(t["id"]))
    nodes, edges = [], []
    for t in headers:
        tid = str(t["id"])
        nodes.append({"id": tid, "title": t["title"], "state": t["state"],
                      "assignee": t["assignee"], "waiting_on": waiting_on(tasks, t),
                      "blocked_by": blocked_by(tasks, t)})
        edges.extend([tid, d] for d in t.get("after", ()))
    return {"nodes": nodes, "edges": edges}


def graph_text(g: dict) -> str:
    """One line per task, indented under what it waits on (a task waiting on two
    shows under each, marked ^ after the first)."""
    byid = {n["id"]: n for n in g["nodes"]}
    kids: dict[str, list[str]] = {}
    for tid, dep in g["edges"]:
        if dep in byid:
            kids.setdefault(dep, []).append(tid)
    waits = {t for t, dep in g["edges"] if dep in byid}
    roots = [n["id"] for n in g["nodes"] if n["id"] not in waits]
    lines, shown = [], set()
    # A stack, not recursion: a chain deeper than Python's recursion limit (about
    # 1,000 tasks) ended the command in a RecursionError.
    todo = [(r, 0) for r in reversed(roots)]
    while todo:
        tid, depth = todo.pop()
        n = byid[tid]
        mark = " ^" if tid in shown else ""
        extra = f" (blocked: {n['blocked_by']})" if n["blocked_by"] else \
            (f" (waits on {', '.join(n['waiting_on'])})" if n["waiting_on"] else "")
        who = f" @{n['assignee']}" if n["assignee"] else ""
        lines.append(f"{'  ' * min(depth, INDENT_MOST)}{'… ' * (depth > INDENT_MOST)}#{tid} [{n['state']}]{who} {n['title']}{extra}{mark}")
        if not mark:
            shown.add(tid)
            todo.extend((k, depth + 1) for k in reversed(kids.get(tid, ())))
    return "\n".join(lines)


def graph_dot(g: dict) -> str:
    colour = {"completed": "palegreen", "failed": "lightpink", "cancelled": "grey",
              "in_progress": "lightblue", "review": "khaki", "blocked": "orange"}
    out = ["digraph tasks {", "  rankdir=LR;", "  node [shape=box, style=filled];"]
    for n in g["nodes"]:
        title = " ".join(n["title"][:40].split()).replace("\\", "/").replace('"', "'")
        out.append(f'  "t{n["id"]}" [label="#{n["id"]} {title}\\n{n["state"]}", '
                   f'fillcolor={colour.get(n["state"], "white")}];')
    for tid, dep in g["edges"]:
        out.append(f'  "t{dep}" -> "t{tid}";')
    out.append("}")
    return "\n".join(out)
