"""`gitdrop ready` in a room of 10,000 tasks against a room of 100: the target is
that the big room answers within 1.5x of the small one.

    python bench/bench_ready.py [--sizes 100,10000] [--runs 15] [--calls 30] [--dir DIR]
                                [--profile]

- **Rooms.** One hub per size (`gitdrop.hub.init`, the defaults: fsync on, the
  write-ahead log), a room `bench`, its lead `core/lead`, the agent asking
  `core/x` (caps db, ui) and nine workers (each with some of db, ui, gpu), all
  registered through the core. Then the tasks, a mix as a room that has been
  worked in for a while holds them: 60 % completed, 5 % cancelled, 2 % failed,
  5 % review, 8 % in progress, 5 % assigned (a tenth of these to core/x),
  15 % pending; a third wait on one or two earlier tasks (`after`), a fifth
  require a capability (db, ui or gpu: core/x lacks gpu). A task past pending
  whose dependencies are not all completed is put back to pending, so that no
  state contradicts the rules (about a third of the tasks end up pending, many
  of them waiting). Priorities 0-3. Every size draws from the same seeded mix,
  so the rooms differ in size only.
- **Bench setup only:** the tasks go in as **one commit** written by gitdrop's own
  writer with the rules switched off (`Store.write(..., check=False)`), not as
  10,000 `task-create`s and some 30,000 moves: through the core a create takes
  20-30 ms and grows with the room (3,000 took 81 s here), so the 10k room would
  take hours to build that way. `ready` reads only the room's tree at its tip (no
  history walk), so the way the tasks got there does not change what it costs;
  the objects are loose files, as the core writes them. Such a room does not pass
  `gitdrop verify` (a commit of 10,000 files is not one operation).
- **(a) a fresh process**, what a person or an agent feels: `gitdrop --hub H --room
  bench --as core/x ready --json` (the real command; default limit 20). Each room's
  first command is shown alone ("first": it finds none of the caches a command may
  leave for the next, such as the task index), then `--runs` per room, the rooms
  taking turns; median and min.
- **(b) warm, in-process**: `Room.ready("core/x")` on the hub's store (pygit2),
  after one call that parses every task file; median of `--calls` (fewer, at least
  3, once they have taken a minute).
- **Ratio** 10k over 100 for both. `--profile`: cProfile of one `ready` in a fresh
  process in the biggest room (the command's store, LeanStore), top entries.
"""

import argparse
import os
import random
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import common  # noqa: E402
from common import ROOT, median  # noqa: E402

from gitdrop import fmt, hub as hubmod, model  # noqa: E402
from gitdrop.view import render_file  # noqa: E402

ROOM = "bench"
LEAD, ASKER = "core/lead", "core/x"
ASKER_CAPS = ["db", "ui"]
WORKERS = {f"core/w{i}": caps for i, caps in enumerate(
    [["db"], ["ui"], ["gpu"], ["db", "ui"], ["db", "gpu"], [], ["ui", "gpu"], ["db"], ["ui"]], 1)}
BIN = os.path.join(os.path.dirname(sys.executable), "gitdrop")
GITDROP = [BIN] if os.path.exists(BIN) else [sys.executable, "-m", "gitdrop"]

MIX = [("completed", 60), ("cancelled", 5), ("failed", 2), ("review", 5),
       ("in_progress", 8), ("assigned", 5), ("pending", 15)]


def task_docs(n: int, now: int, seed: int = 7) -> list[dict]:
    """`n` task headers in the mix above (see the module's docstring)."""
    rng = random.Random(seed)
    states = [s for s, w in MIX for _ in range(w)]
    people = list(WORKERS)
    out = []
    for i in range(1, n + 1):
        state = rng.choice(states)
        after = []
        if i > 1 and rng.random() < 1 / 3:
            after = sorted({str(rng.randint(max(1, i - 200), i - 1))
                            for _ in range(rng.choice((1, 2)))}, key=int)
        requires = [rng.choice(("db", "ui", "gpu"))] if rng.random() < 0.2 else []
        if state not in ("pending", "cancelled") and \
                any(out[int(d) - 1]["state"] != "completed" for d in after):
            state = "pending"
        assignee = ""
        if state not in ("pending", "cancelled"):
            able = [p for p in people if not set(requires) - set(WORKERS[p])]
            if state == "assigned" and rng.random() < 0.1 and not set(requires) - set(ASKER_CAPS):
                assignee = ASKER
            else:
                assignee = rng.choice(able)
        out.append(model.with_defaults("task", {
            "id": str(i), "title": f"task {i}: part {rng.randint(1, 99)} of the work",
            "state": state, "creator": LEAD, "assignee": assignee,
            "priority": rng.choice((0, 0, 0, 1, 1, 2, 3)),
            "tags": [rng.choice(("api", "db", "ui"))],
            "created": now - 10 * (n - i), "updated": now - 5 * (n - i),
            "after": after, "requires": requires,
            "lease_until": now + 86000 if state in ("assigned", "in_progress") else 0,
            "note": "done" if state in ("completed", "review") else ""}))
    return out


def make_hub(path: str, n: int) -> "hubmod.Hub":
    h = hubmod.init(path, room="")
    h.create_room("hub/admin", ROOM, open_=True)
    r = h.room(ROOM)
    r.register(LEAD, ["lead"])
    r.register(ASKER, ["coder"], caps=ASKER_CAPS)
    for a, caps in WORKERS.items():
        r.register(a, ["coder"], caps=caps)
    docs = task_docs(n, int(time.time()))
    files = {model.task_path(d["id"]): render_file("task", d, f"Do part {d['id']}.\n")
             for d in docs}

    # Bench setup only: every task file in one commit, the rules off (see the docstring).
    def build(view, tip):
        return files, fmt.format_message(f"bench setup: {n} tasks written at once", "", []), {}
    h.store.write(h.store.room_ref(ROOM), build, LEAD, check=False)
    return h


def cli_ready(hub_path: str) -> tuple[float, int]:
    t = time.perf_counter()
    p = subprocess.run([*GITDROP, "--hub", hub_path, "--room", ROOM, "--as", ASKER, "ready",
                        "--json"], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    took = time.perf_counter() - t
    if p.returncode:
        raise RuntimeError(p.stderr)
    import json
    return took, len(json.loads(p.stdout)["tasks"])


PROFILE = """
import cProfile, pstats, sys
sys.path.insert(0, {root!r})
from gitdrop.core import Room
from gitdrop.leanstore import LeanStore
pr = cProfile.Profile()
pr.enable()
room = Room(LeanStore({hub!r}), {room!r})   # as the command makes it
got = room.ready({agent!r})
pr.disable()
print(f"{{len(got)}} ready")
st = pstats.Stats(pr)
st.sort_stats("tottime").print_stats(18)
st.sort_stats("cumulative").print_stats(22)
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="100,10000")
    ap.add_argument("--runs", type=int, default=15, help="fresh processes per room")
    ap.add_argument("--calls", type=int, default=30, help="warm in-process calls per room")
    ap.add_argument("--dir", default="", help="where the hubs go (kept)")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    work = args.dir or common.workdir("ready-")
    os.makedirs(work, exist_ok=True)
    common.header("gitdrop ready: a room of 10,000 tasks against one of 100", work)

    hubs, counts = {}, {}
    for n in sizes:
        t = time.perf_counter()
        hubs[n] = make_hub(os.path.join(work, f"hub-{n}-{time.time_ns()}.git"), n)
        docs = task_docs(n, 0)
        counts[n] = {s: sum(1 for d in docs if d["state"] == s) for s, _w in MIX}
        print(f"room of {n} tasks built in {time.perf_counter() - t:.1f} s: "
              + ", ".join(f"{k} {v}" for k, v in counts[n].items()))

    # (a) fresh processes: each room's first command alone (it finds no cache a
    # command may keep, such as the task index), then the rooms taking turns
    print("CLI: " + " ".join(GITDROP + ["--hub", "HUB", "--room", ROOM, "--as", ASKER,
                                        "ready", "--json"]))
    cold, first_cli, shown = {n: [] for n in sizes}, {}, {}
    for n in sizes:
        first_cli[n] = cli_ready(hubs[n].path)[0]
    for _ in range(args.runs):
        for n in sizes:
            took, shown[n] = cli_ready(hubs[n].path)
            cold[n].append(took)

    # (b) warm, in-process
    warm, nready = {}, {}
    for n in sizes:
        room = hubs[n].room(ROOM)
        t = time.perf_counter()
        nready[n] = len(room.ready(ASKER, limit=0))
        first = time.perf_counter() - t
        samples, spent = [], 0.0
        for _ in range(args.calls):   # at least 3 calls; at most a minute's worth
            t = time.perf_counter()
            room.ready(ASKER)
            samples.append(time.perf_counter() - t)
            spent += samples[-1]
            if len(samples) >= 3 and spent > 60:
                break
        warm[n] = (median(samples), min(samples), first)

    small, big = sizes[0], sizes[-1]
    print()
    print(f"{'tasks':>6} {'ready':>6} | {'CLI median':>10} {'min':>8} {'first':>8} | "
          f"{'warm median':>11} {'min':>8} {'first call':>10}   (ms)")
    for n in sizes:
        print(f"{n:>6} {nready[n]:>6} | {common.ms(median(cold[n]))}   {common.ms(min(cold[n]))}"
              f" {common.ms(first_cli[n])} | {common.ms(warm[n][0])}    "
              f"{common.ms(warm[n][1])}   {common.ms(warm[n][2])}")
    print(f"ratio {big}/{small}: CLI {median(cold[big]) / median(cold[small]):.2f}x "
          f"(min {min(cold[big]) / min(cold[small]):.2f}x), warm in-process "
          f"{warm[big][0] / warm[small][0]:.2f}x; target: within 1.5x")
    print(f"(`ready` lists {nready[big]} tasks in the big room, {nready[small]} in the small "
          f"one; the command shows the first {shown[big]})")
    print(common.creation_note(work))

    if args.profile:
        print(f"\n# cProfile: one `ready` in a fresh process, room of {big} tasks")
        subprocess.run([sys.executable, "-c", PROFILE.format(
            root=ROOT, hub=hubs[big].path, room=ROOM, agent=ASKER)])
    common.leave(work)


if __name__ == "__main__":
    main()
