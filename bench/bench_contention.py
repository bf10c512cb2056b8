"""Writers contending for one room on a local hub: N processes × M sends each,
against one writer alone in the same run.

Every send goes through the core as the CLI and the MCP server make it (a
`Room.send`), durable (the hub's write-ahead log). Reported per setting: sends
delivered (counted in the room's history afterwards) and refused, aggregate
sends/s, latency p50/p99, sends that landed twice (each send's text is unique in
its run), and from inside the writers: lost compare-and-swaps
(retries), time waiting for the room's turn, the share of sends written by
another writer's turn (gitdrop.combine), fdatasyncs per send (group commit:
one flush serves the writers that came through meanwhile), and the writers' CPU
per send and in all (cores: their CPU seconds per second of the run).

    python bench/bench_contention.py                    # 8 processes × 1,000 sends
    python bench/bench_contention.py --procs 1,2,4,8 --sends 500 --rounds 3

Settings take turns round by round, so a noisy neighbour hits them alike; the
figures are medians over rounds.
"""

import argparse
import multiprocessing as mp
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

from gitdrop import hub as hubmod, writequeue  # noqa: E402
from gitdrop.errors import GitdropError  # noqa: E402

ROOM = "contention"


def writer(path: str, i: int, n: int, go, out, tag: str) -> None:
    room = hubmod.Hub(path).room(ROOM)
    me = f"load/w{i}"
    syncs = [0]
    real = os.fdatasync

    def counted(fd):
        syncs[0] += 1
        return real(fd)
    os.fdatasync = counted
    lat, refused = [], []
    go.wait()
    cpu = time.process_time()
    for k in range(n):
        t = time.perf_counter()
        try:
            room.send(me, "load/sink", f"w{i} #{k} {tag}")
        except GitdropError as e:
            refused.append(f"{e.rule}: {e.reason}"[:200])
        lat.append(time.perf_counter() - t)
    out.put((lat, refused, syncs[0], dict(writequeue.STATS, cpu=time.process_time() - cpu)))


def run(path: str, procs: int, n: int) -> dict:
    before = tip(path)
    tag = os.urandom(4).hex()   # this run's sends, told apart from the other runs'
    go, out = mp.Event(), mp.Queue()
    ps = [mp.Process(target=writer, args=(path, i, n, go, out, tag)) for i in range(procs)]
    for p in ps:
        p.start()
    time.sleep(0.3)   # every writer imported and opened the hub
    t = time.perf_counter()
    go.set()
    got = [out.get() for _ in ps]
    elapsed = time.perf_counter() - t
    for p in ps:
        p.join()
    lat = sorted(x for g in got for x in g[0])
    refused = [r for g in got for r in g[1]]
    sends = procs * n
    landed = subjects(path, before)
    return {"procs": procs, "sends": sends, "landed": len(landed),
            "doubled": len(landed) - len(set(landed)),
            "refused": len(refused), "why": refused[:3], "per_s": sends / elapsed,
            "p50": common.percentile(lat, 0.50), "p99": common.percentile(lat, 0.99),
            "retries": sum(g[3]["retries"] for g in got),
            "wait": sum(g[3]["waited"] for g in got) / sends,
            "carried": sum(g[3]["carried"] for g in got) / sends,
            "syncs": sum(g[2] for g in got) / sends,
            "cpu": sum(g[3]["cpu"] for g in got) / sends,
            "cores": sum(g[3]["cpu"] for g in got) / elapsed}


def tip(path: str) -> str:
    return subprocess.run(["git", "--git-dir", path, "rev-parse", f"refs/heads/rooms/{ROOM}"],
                          capture_output=True, text=True, check=True).stdout.strip()


def subjects(path: str, since: str) -> list[str]:
    """The subject of every commit on the room since `since` (one per send landed:
    one that landed twice is there twice)."""
    return subprocess.run(["git", "--git-dir", path, "log", "--first-parent", "--format=%s",
                           f"{since}..refs/heads/rooms/{ROOM}"],
                          capture_output=True, text=True, check=True).stdout.splitlines()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--procs", default="1,8", help="writer processes per setting")
    ap.add_argument("--sends", type=int, default=1000, help="sends per process")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default="")
    args = ap.parse_args()
    work = common.begin(args.dir, "contention-",
                        "writers contending for one room: N processes against one alone")
    path = os.path.join(work, "hub.git")
    h = hubmod.init(path, room="")
    h.create_room("hub/admin", ROOM, open_=True, settings={"loop_cap": 0})
    room = h.room(ROOM)
    settings = [int(x) for x in args.procs.split(",")]
    for i in range(max(settings)):
        room.register(f"load/w{i}")
    room.register("load/sink")
    results = {p: [] for p in settings}
    for r in range(args.rounds):
        for p in (settings if r % 2 == 0 else settings[::-1]):
            results[p].append(run(path, p, args.sends))
    base = common.median([x["per_s"] for x in results[settings[0]]])
    print(f"\n{'writers':>7} {'sent':>6} {'landed':>6} {'doubled':>7} {'refused':>7} {'sends/s':>8} "
          f"{'× alone':>7} {'p50 ms':>7} {'p99 ms':>7} {'retries':>7} {'wait ms':>7} "
          f"{'carried':>7} {'syncs/send':>10} {'CPU ms/send':>11} {'cores':>5}")
    for p in settings:
        rs = results[p]
        med = common.median([x["per_s"] for x in rs])
        print(f"{p:>7} {sum(x['sends'] for x in rs):>6} {sum(x['landed'] for x in rs):>6} "
              f"{sum(x['doubled'] for x in rs):>7} "
              f"{sum(x['refused'] for x in rs):>7} {med:>8.0f} {med / base:>7.2f} "
              f"{common.median([x['p50'] for x in rs]) * 1e3:>7.2f} "
              f"{common.median([x['p99'] for x in rs]) * 1e3:>7.1f} "
              f"{sum(x['retries'] for x in rs):>7} "
              f"{common.median([x['wait'] for x in rs]) * 1e3:>7.2f} "
              f"{common.median([x['carried'] for x in rs]):>7.0%} "
              f"{common.median([x['syncs'] for x in rs]):>10.2f} "
              f"{common.median([x['cpu'] for x in rs]) * 1e3:>11.2f} "
              f"{common.median([x['cores'] for x in rs]):>5.2f}")
        for why in sorted({w for x in rs for w in x["why"]}):
            print(f"        refused: {why}")
    print(f"(sends/s and latencies: medians of {args.rounds} rounds; sent/landed/doubled/refused/"
          "retries: totals; landed is counted in the room's history, doubled: sends in it "
          "twice)")
    common.leave(work)


if __name__ == "__main__":
    main()
