"""What the notifier pays per new commit when many agents of one room are watched
by one process (an MCP server or `gitdrop serve` holds a subscription for every
agent connected to it).

One in-process Notifier; a room with W registered agents, each subscribed;
then M sends, each from one agent to one other, and after each a scan (what the
notifier runs when the ref moves), timed. Baseline in the same run: the same
with 10 watchers. A scan asks only the watchers a commit names (its recipients,
their teams, the room's leads) how it concerns them, so its cost should not
grow with W; a message to `all` reaches every watcher and is timed apart.

    python bench/bench_watchers.py [--watchers 10,2000] [--sends 200] [--dir DIR]
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

from gitdrop import hub as hubmod  # noqa: E402
from gitdrop.notifier import Notifier  # noqa: E402


def measure(work: str, watchers: int, sends: int) -> dict:
    h = hubmod.init(os.path.join(work, f"hub-{watchers}.git"), room="")
    h.create_room("hub/admin", "big", open_=True, settings={"loop_cap": 0})
    room = h.room("big")
    agents = [f"t{k % 20}/a{k}" for k in range(watchers)]
    for a in agents:
        room.register(a)
    n = Notifier(h.store.path)
    delivered = [0]

    def got(evs):
        delivered[0] += len(evs)
    for a in agents:
        n.subscribe("big", a, got)
    n.scan()
    one, everyone = [], []
    for k in range(sends):
        sender, to = agents[k % watchers], agents[(k * 7 + 1) % watchers]
        room.inbox(sender, limit=0)
        room.send(sender, to if to != sender else agents[(k + 1) % watchers], f"m{k}")
        t = time.perf_counter()
        n.scan()
        one.append(time.perf_counter() - t)
    before = delivered[0]
    for k in range(max(5, sends // 20)):
        room.inbox(agents[0], limit=0)
        room.send(agents[0], "all", f"to all {k}")
        t = time.perf_counter()
        n.scan()
        everyone.append(time.perf_counter() - t)
    return {"one": one, "all": everyone, "to_all": delivered[0] - before}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--watchers", default="10,2000")
    ap.add_argument("--sends", type=int, default=200)
    ap.add_argument("--dir", default="")
    args = ap.parse_args()
    work = common.begin(args.dir, "watchers-",
                        "one process watching W agents of a room: a scan per new commit")
    sizes = [int(x) for x in args.watchers.split(",")]
    results = {w: measure(work, w, args.sends) for w in sizes}
    base = common.median(results[sizes[0]]["one"])
    print(f"\n{'watchers':>8} {'scan, to one: p50 ms':>21} {'p99 ms':>7} {'× ' + str(sizes[0]):>7} "
          f"{'scan, to all: p50 ms':>21} {'delivered':>9}")
    for w in sizes:
        r = results[w]
        print(f"{w:>8} {common.median(r['one']) * 1e3:>21.3f} "
              f"{common.percentile(sorted(r['one']), 0.99) * 1e3:>7.3f} "
              f"{common.median(r['one']) / base:>7.2f} "
              f"{common.median(r['all']) * 1e3:>21.2f} {r['to_all']:>9}")
    print(f"(medians of {args.sends} scans after a send to one agent; to all: of "
          f"{max(5, args.sends // 20)} sends, each delivered to every watcher but its sender)")
    common.leave(work)


if __name__ == "__main__":
    main()
