"""`gitdrop board` in a room of 10,000 tasks and 100 agents against a room of 100
tasks and 10 agents: how long a person waits for the first frame, and for a write
to show on a board that is already up.

    python bench/bench_board.py [--sizes 100:10,10000:100] [--runs 9] [--writes 20]
                                [--dir DIR]

- **Rooms.** One hub per size (`gitdrop.hub.init`, the defaults), a room `bench`
  with its lead and N-1 other agents registered through the core; the tasks are
  bench_ready's seeded mix (60 % completed, a third pending, many waiting on
  others), assigned among the room's agents, with 1 % turned blocked (with a
  reason) and 1 % in feedback (with a question), and one handshake waiting on
  two acks. **Bench setup only**, as in bench_ready.py: the tasks go in as one
  commit written with the rules off (through the core a room of 10,000 tasks
  would take hours to build); the board reads the tree at the tip and the last
  few hundred commits, so how the tasks got there does not change its cost.
- **(a) first frame**: `gitdrop --hub H --room bench board --once` as a fresh
  process with COLUMNS=160 LINES=50 (the frame a 160x50 terminal shows; the live
  board builds the same frame before it draws). Each room's first run alone (it
  finds no task index yet), then `--runs` per room, the rooms taking turns.
- **(b) write to redraw**, in one process as the live board does it: a Notifier
  (inotify) subscribed to the room with every=True; a lead's `send` through the
  core; timed from the moment the write returns until the frame is rendered:
  the notifier's callback, `board.board_data` and `board.render` printed to a
  160x50 console in memory. The board waits 0.08 s more to gather a burst of
  events into one redraw (cli/board.py DEBOUNCE); that wait is not counted.
"""

import argparse
import io
import os
import random
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import common  # noqa: E402
from common import median  # noqa: E402
import bench_ready  # noqa: E402

from gitdrop import board, fmt, hub as hubmod, model  # noqa: E402
from gitdrop.notifier import Notifier  # noqa: E402
from gitdrop.view import render_file  # noqa: E402

ROOM = "bench"
LEAD = "core/lead"
GITDROP = bench_ready.GITDROP
SIZE = (160, 50)


def make_hub(path: str, n: int, agents: int) -> "hubmod.Hub":
    h = hubmod.init(path, room="")
    h.create_room("hub/admin", ROOM, open_=True)
    r = h.room(ROOM)
    r.register(LEAD, ["lead"])
    people = [f"core/a{i:03d}" for i in range(1, agents)]
    for a in people:
        r.register(a, ["coder"], caps=["db", "ui", "gpu"])
    rng = random.Random(11)
    now = int(time.time())
    docs = bench_ready.task_docs(n, now)
    for d in docs:
        if d["assignee"]:
            d["assignee"] = people[int(d["id"]) % len(people)]
        if d["state"] == "in_progress" and rng.random() < 0.12:
            d.update(state="blocked", resume="in_progress", note="waiting for the staging database")
        elif d["state"] == "in_progress" and rng.random() < 0.12:
            d.update(state="feedback", question=f"which schema for part {d['id']}?")
    files = {model.task_path(d["id"]): render_file("task", d, f"Do part {d['id']}.\n")
             for d in docs}

    # Bench setup only: every task file in one commit, the rules off (see the docstring).
    def build(view, tip):
        return files, fmt.format_message(f"bench setup: {n} tasks written at once", "", []), {}
    h.store.write(h.store.room_ref(ROOM), build, LEAD, check=False)
    r.start_handshake(LEAD, "part 1 first, then the rest", targets=people[:2])
    for i in range(10):
        r.send(LEAD, "all", f"status round {i}")
    return h


def first_frame(hub_path: str) -> float:
    env = dict(os.environ, COLUMNS=str(SIZE[0]), LINES=str(SIZE[1]))
    env.pop("GITDROP_ROOM", None)
    t = time.perf_counter()
    p = subprocess.run([*GITDROP, "--hub", hub_path, "--room", ROOM, "board", "--once"],
                       capture_output=True, text=True, stdin=subprocess.DEVNULL, env=env)
    took = time.perf_counter() - t
    if p.returncode or "Agents" not in p.stdout:
        raise RuntimeError(p.stderr or p.stdout[-500:])
    return took


def frame_text(room) -> str:
    from rich.console import Console
    out = io.StringIO()
    con = Console(file=out, width=SIZE[0], height=SIZE[1], color_system="truecolor",
                  force_terminal=True)
    con.print(board.render(board.board_data(room), *SIZE))
    return out.getvalue()


def live_redraws(h, writes: int) -> dict:
    """Write-to-frame times in one process: notify, data, render, total (seconds)."""
    room = h.room(ROOM)
    frame_text(room)   # the live board's first frame (task index, caches)
    landed = threading.Event()
    n = Notifier(h.path)
    unsub = n.subscribe(ROOM, "", lambda evs: landed.set(), every=True)
    n.start()
    out = {"notify": [], "data": [], "render": [], "total": []}
    try:
        time.sleep(0.2)
        for i in range(writes):
            landed.clear()
            room.send(LEAD, "all", f"redraw {i}")
            t0 = time.perf_counter()
            if not landed.wait(5):
                raise RuntimeError("the notifier said nothing")
            t1 = time.perf_counter()
            data = board.board_data(room)
            t2 = time.perf_counter()
            from rich.console import Console
            con = Console(file=io.StringIO(), width=SIZE[0], height=SIZE[1],
                          color_system="truecolor", force_terminal=True)
            con.print(board.render(data, *SIZE))
            t3 = time.perf_counter()
            out["notify"].append(t1 - t0)
            out["data"].append(t2 - t1)
            out["render"].append(t3 - t2)
            out["total"].append(t3 - t0)
            time.sleep(0.05)
    finally:
        unsub()
        n.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="100:10,10000:100", help="tasks:agents,...")
    ap.add_argument("--runs", type=int, default=9, help="fresh processes per room")
    ap.add_argument("--writes", type=int, default=20, help="writes per room (live)")
    ap.add_argument("--dir", default="", help="where the hubs go (kept)")
    args = ap.parse_args()
    sizes = [tuple(int(x) for x in s.split(":")) for s in args.sizes.split(",")]
    work = common.begin(args.dir, "board-", "gitdrop board: first frame and live redraw, "
                        "10,000 tasks and 100 agents against 100 and 10")

    hubs = {}
    for n, a in sizes:
        t = time.perf_counter()
        hubs[n] = make_hub(os.path.join(work, f"hub-{n}-{time.time_ns()}.git"), n, a)
        print(f"room of {n} tasks and {a} agents built in {time.perf_counter() - t:.1f} s")

    print("first frame: COLUMNS=160 LINES=50 " + " ".join(
        GITDROP + ["--hub", "HUB", "--room", ROOM, "board", "--once"]))
    first, cold = {}, {n: [] for n, _a in sizes}
    for n, _a in sizes:
        first[n] = first_frame(hubs[n].path)
    for _ in range(args.runs):
        for n, _a in sizes:
            cold[n].append(first_frame(hubs[n].path))

    live = {n: live_redraws(hubs[n], args.writes) for n, _a in sizes}

    print()
    print(f"{'tasks':>6} {'agents':>6} | {'first frame: median':>19} {'min':>8} "
          f"{'first run':>9} | {'write→frame: median':>19} {'max':>8} | "
          f"{'notify':>8} {'data':>8} {'render':>8}   (ms)")
    for n, a in sizes:
        lv = live[n]
        print(f"{n:>6} {a:>6} | {common.ms(median(cold[n])):>19} {common.ms(min(cold[n]))} "
              f"{common.ms(first[n]):>9} | {common.ms(median(lv['total'])):>19} "
              f"{common.ms(max(lv['total']))} | {common.ms(median(lv['notify']))} "
              f"{common.ms(median(lv['data']))} {common.ms(median(lv['render']))}")
    (small, _), (big, _) = sizes[0], sizes[-1]
    print(f"ratio {big}/{small}: first frame {median(cold[big]) / median(cold[small]):.2f}x, "
          f"write→frame {median(live[big]['total']) / median(live[small]['total']):.2f}x")
    print(common.creation_note(work))
    common.leave(work)


if __name__ == "__main__":
    main()
