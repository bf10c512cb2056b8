"""Pictures of a room, drawn on the server as SVG from its history.

`flow(events, headers)`: the cumulative flow of task states over time, one
stacked band per state, replayed from the task commits. `activity(events)`: each
agent's commits per time bucket. `graph_svg(g)`: the dependency graph of
deps.graph in layers (a task sits right of everything it waits on), at most
GRAPH_MOST tasks of it. Everything
taken from the repository is escaped.
"""

from html import escape

from .. import machine
from ..fmt import stamp

STATES = ("pending", "assigned", "in_progress", "review", "feedback", "blocked", "failed",
          "completed", "cancelled")
COLOURS = {"pending": "#9aa0a6", "assigned": "#4fc3f7", "in_progress": "#1e88e5",
           "review": "#ab47bc", "feedback": "#fdd835", "blocked": "#e53935",
           "failed": "#b71c1c", "completed": "#43a047", "cancelled": "#616161"}
BUCKETS = 48


def _svg(w: int, h: int, inner: str, label: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
            f'viewBox="0 0 {w} {h}" role="img" aria-label="{escape(label)}">'
            f'<title>{escape(label)}</title>{inner}</svg>')


def _state_after(op: str, before: str, ev: dict) -> str:
    move = op[len("task-"):]
    if move == "create":
        return "assigned" if ev.get("for") else "pending"
    if move not in machine.MOVES:
        return before
    to = machine.MOVES[move][1]
    if to in STATES:
        return to
    if to == "reap":
        return "pending"
    if to == "resume":
        return "assigned"
    return before   # "same"


def flow_series(events: list[dict], headers: list[dict], now: int, buckets: int = BUCKETS):
    """(times, {state: [count at each time]}): the states of every task replayed from
    the task commits (oldest first), sampled at `buckets` times; the last sample is
    the room's actual state (what the headers say)."""
    tevs = [e for e in events if e.get("task") and str(e.get("op", "")).startswith("task-")]
    start = min([e["time"] for e in tevs] or [now])
    end = max(now, start + 1)
    times = [start + (end - start) * i // (buckets - 1) for i in range(buckets)]
    series = {s: [0] * buckets for s in STATES}
    state: dict[str, str] = {}
    i = 0
    for b, t in enumerate(times[:-1]):
        while i < len(tevs) and tevs[i]["time"] <= t:
            e = tevs[i]
            state[e["task"]] = _state_after(e["op"], state.get(e["task"], "pending"), e)
            i += 1
        for st in state.values():
            series[st][b] += 1
    for h in headers:
        st = h["state"]
        if st in series:
            series[st][-1] += 1
    return times, series


def flow(events: list[dict], headers: list[dict], now: int, w: int = 760, h: int = 300) -> str:
    times, series = flow_series(events, headers, now)
    left, right, top, bottom = 40, 130, 10, 30
    pw, ph = w - left - right, h - top - bottom
    n = len(times)
    totals = [sum(series[s][i] for s in STATES) for i in range(n)]
    peak = max(totals + [1])

    def x(i):
        return left + pw * i / max(n - 1, 1)

    def y(v):
        return top + ph - ph * v / peak

    parts, base = [], [0] * n
    # completed at the bottom, the open states above it, as a cumulative flow shows
    order = ("cancelled", "completed", "failed", "review", "feedback", "blocked",
             "in_progress", "assigned", "pending")
    for k, st in enumerate(order):
        vals = series[st]
        upper = [base[i] + vals[i] for i in range(n)]
        pts = [f"{x(i):.1f},{y(upper[i]):.1f}" for i in range(n)]
        pts += [f"{x(i):.1f},{y(base[i]):.1f}" for i in reversed(range(n))]
        parts.append(f'<path class="series" data-state="{st}" fill="{COLOURS[st]}" '
                     f'fill-opacity="0.85" stroke="none" d="M{" L".join(pts)} Z">'
                     f'<title>{st}: {vals[-1]} now</title></path>')
        parts.append(f'<rect x="{w - right + 10}" y="{top + 16 * k}" width="10" height="10" '
                     f'fill="{COLOURS[st]}"/><text x="{w - right + 26}" y="{top + 16 * k + 9}" '
                     f'font-size="11">{st} ({vals[-1]})</text>')
        base = upper
    parts.append(_axes(times, left, top, pw, ph, peak))
    return _svg(w, h, "".join(parts), "cumulative flow of task states")


def _axes(times, left, top, pw, ph, peak, counts: bool = True) -> str:
    out = [f'<line x1="{left}" y1="{top + ph}" x2="{left + pw}" y2="{top + ph}" stroke="#444"/>',
           f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + ph}" stroke="#444"/>']
    if counts:
        out += [f'<text x="{left - 4}" y="{top + 10}" font-size="10" text-anchor="end">{peak}'
                '</text>',
                f'<text x="{left - 4}" y="{top + ph}" font-size="10" text-anchor="end">0</text>']
    fmt = "%m-%d %H:%M" if times[-1] - times[0] > 86400 else "%H:%M:%S"
    for frac, anchor in ((0, "start"), (1, "end")):
        t = times[0] if frac == 0 else times[-1]
        out.append(f'<text x="{left + pw * frac}" y="{top + ph + 16}" font-size="10" '
                   f'text-anchor="{anchor}">{escape(stamp(t, fmt, local=True))}</text>')
    return "".join(out)


def activity_series(events: list[dict], now: int, buckets: int = BUCKETS):
    """(times, {agent: [commits in each bucket]})."""
    start = min([e["time"] for e in events] or [now])
    end = max(now, start + 1)
    size = (end - start) / buckets
    rows: dict[str, list[int]] = {}
    for e in events:
        b = min(int((e["time"] - start) / size), buckets - 1)
        rows.setdefault(e["from"], [0] * buckets)[b] += 1
    times = [int(start + size * i) for i in range(buckets + 1)]
    return times, dict(sorted(rows.items()))


def activity(events: list[dict], now: int, w: int = 760) -> str:
    times, rows = activity_series(events, now)
    left, top, row_h = 170, 10, 18
    cell = (w - left - 10) / BUCKETS
    h = top + row_h * max(len(rows), 1) + 30
    peak = max([max(v) for v in rows.values()] + [1])
    parts = []
    for r, (agent, counts) in enumerate(rows.items()):
        yy = top + r * row_h
        parts.append(f'<g class="agent" data-agent="{escape(agent)}"><text x="{left - 6}" '
                     f'y="{yy + 12}" font-size="11" text-anchor="end">{escape(agent)}</text>')
        for i, c in enumerate(counts):
            if c:
                parts.append(f'<rect x="{left + i * cell:.1f}" y="{yy}" width="{cell:.1f}" '
                             f'height="{row_h - 3}" fill="#1e88e5" '
                             f'fill-opacity="{0.15 + 0.85 * c / peak:.2f}">'
                             f'<title>{escape(agent)}: {c} commits</title></rect>')
        parts.append("</g>")
    if not rows:
        parts.append(f'<text x="{left}" y="{top + 12}" font-size="11">no commits yet</text>')
    parts.append(_axes(times, left, top, w - left - 10, row_h * max(len(rows), 1), peak,
                       counts=False))
    return _svg(w, h, "".join(parts), "each agent's commits over time")


def layers(g: dict) -> dict:
    """Task id -> its layer: 0 for a task that waits on nothing shown, else one more
    than the deepest task it waits on."""
    ids = {n["id"] for n in g["nodes"]}
    deps: dict[str, list[str]] = {i: [] for i in ids}
    for t, d in g["edges"]:
        if t in ids and d in ids:
            deps[t].append(d)
    depth: dict[str, int] = {}

    def of(i, seen=()):
        if i in depth:
            return depth[i]
        if i in seen:   # a cycle cannot be stored, but never loop on one
            return 0
        depth[i] = 1 + max((of(d, seen + (i,)) for d in deps[i]), default=-1)
        return depth[i]
    for i in sorted(ids):
        of(i)
    return depth


GRAPH_MOST = 200   # tasks drawn: a room of 10,000 drew a picture 500,000 pixels tall


def _drawn(g: dict, most: int) -> tuple[dict, int]:
    """The part of `g` worth drawing, and how many tasks were left out: tasks in
    a dependency first, then the open ones, at most `most`."""
    if len(g["nodes"]) <= most:
        return g, 0
    linked = {x for e in g["edges"] for x in e}
    keep = [n for n in g["nodes"] if n["id"] in linked][:most]
    keep += [n for n in g["nodes"] if n["id"] not in linked
             and n["state"] not in machine.TERMINAL][:most - len(keep)]
    ids = {n["id"] for n in keep}
    return ({"nodes": keep, "edges": [[t, d] for t, d in g["edges"] if t in ids and d in ids]},
            len(g["nodes"]) - len(keep))


def graph_svg(g: dict, base: str = "", most: int = GRAPH_MOST) -> str:
    g, left = _drawn(g, most)
    depth = layers(g)
    cols: dict[int, list[dict]] = {}
    for n in g["nodes"]:
        cols.setdefault(depth[n["id"]], []).append(n)
    bw, bh, gx, gy = 180, 40, 60, 16
    pos = {}
    for c, nodes in cols.items():
        for r, n in enumerate(nodes):
            pos[n["id"]] = (10 + c * (bw + gx), 10 + r * (bh + gy))
    w = 20 + (max(cols, default=0) + 1) * (bw + gx)
    h = 20 + max([len(v) for v in cols.values()] + [1]) * (bh + gy)
    parts = ['<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" '
             'markerWidth="6" markerHeight="6" orient="auto"><path d="M0,0 L10,5 L0,10 z" '
             'fill="#666"/></marker></defs>']
    for t, d in g["edges"]:
        if t in pos and d in pos:
            (x1, y1), (x2, y2) = pos[d], pos[t]
            parts.append(f'<line class="edge" x1="{x1 + bw}" y1="{y1 + bh / 2}" x2="{x2}" '
                         f'y2="{y2 + bh / 2}" stroke="#666" marker-end="url(#arrow)"/>')
    for n in g["nodes"]:
        x, y = pos[n["id"]]
        title = n["title"] if len(n["title"]) <= 24 else n["title"][:23] + "…"
        href = escape(f"{base}/t/{n['id']}", quote=True)
        parts.append(f'<a href="{href}"><g class="node" data-task="{escape(n["id"])}">'
                     f'<rect x="{x}" y="{y}" width="{bw}" height="{bh}" rx="5" '
                     f'fill="{COLOURS.get(n["state"], "#ccc")}" fill-opacity="0.3" '
                     f'stroke="{COLOURS.get(n["state"], "#999")}"/>'
                     f'<text x="{x + 6}" y="{y + 16}" font-size="11" font-weight="bold">'
                     f'#{escape(n["id"])} {escape(n["state"])}</text>'
                     f'<text x="{x + 6}" y="{y + 32}" font-size="11">{escape(title)}</text>'
                     f'<title>{escape(n["title"])}</title></g></a>')
    if not g["nodes"]:
        parts.append('<text x="10" y="24" font-size="11">no tasks</text>')
    if left:
        h += 24
        parts.append(f'<text x="10" y="{h - 10}" font-size="11">… {left} more tasks not '
                     'drawn (those in a dependency come first, then open ones): the task '
                     'list has them all</text>')
    return _svg(w, h, "".join(parts), "dependency graph")
