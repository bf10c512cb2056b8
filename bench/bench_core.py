"""In-process send, task move and inbox read, in rooms with 0, 10k and 100k
commits of history, beside SQLite (WAL) doing the same in the same run.

    python bench/bench_core.py                      # sizes 0,10000,100000
    python bench/bench_core.py --sizes 0,10000 --rounds 40

One round, per target: bench/alice sends 10 messages to bench/bob (10 `send`
samples), bob reads his inbox (one `inbox` sample: 10 new messages, cursor
advanced by a commit) and moves a task (one `move` sample: block/unblock).
Targets (rooms of each size, and SQLite with as many rows) take their turns
round by round in a shuffled order, so a noisy neighbour hits them all alike.

Durable: the hub's default (its write-ahead log, one fdatasync per write)
against SQLite synchronous=FULL; then both with fsync off (synchronous=OFF).
"""

import argparse
import os
import random
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import READER, ROOM, SENDER, Timer, ms, ratio  # noqa: E402

import pygit2  # noqa: E402

from gitdrop import hub as hubmod, rules  # noqa: E402
from gitdrop.store import Store, signature  # noqa: E402
from gitdrop.view import CommitData, RoomView  # noqa: E402

OPS = ("send", "inbox", "move")


class GitTarget:
    def __init__(self, path, size, tasks):
        self.path, self.size, self.tasks = path, size, tasks
        self.moves = {}

    def open(self, fsync: bool) -> None:
        # Store reads gitdrop.fsync when it opens the hub (libgit2 fsync_gitdir).
        h = hubmod.Hub(self.path)
        h.store.repo.config["gitdrop.fsync"] = "true" if fsync else "false"
        self.hub = hubmod.Hub(self.path)
        self.room = self.hub.room(ROOM)

    def round(self, t: Timer, key, per_round: int, n: int) -> None:
        r = self.room
        for i in range(per_round):
            t.time(key("send"), r.send, SENDER, READER, f"round {n} message {i}: hello bob")
        got = t.time(key("inbox"), r.inbox, READER, 20)
        if len(got["messages"]) != per_round or got["remaining"]:
            raise AssertionError(f"inbox saw {len(got['messages'])} messages, "
                                 f"{got['remaining']} left, wanted {per_round}")
        tid = str(n % self.tasks + 1)
        state = self.moves.get(tid, "assigned")
        move = {"assigned": "start", "in_progress": "block", "blocked": "unblock"}[state]
        res = t.time(key("move"), r.move_task, READER, tid, move, note=f"round {n}")
        self.moves[tid] = res["state"]


class SqlTarget:
    def __init__(self, path, size, tasks):
        self.db = common.SqliteRoom(path, size, tasks)
        self.tasks = tasks
        self.moves = {}

    def open(self, fsync: bool) -> None:
        self.db.durable(fsync)

    def round(self, t: Timer, key, per_round: int, n: int) -> None:
        for i in range(per_round):
            t.time(key("send"), self.db.send, SENDER, READER, f"round {n} message {i}: hello bob")
        got = t.time(key("inbox"), self.db.inbox, READER, 20)
        if len(got) != per_round:
            raise AssertionError(f"sqlite inbox saw {len(got)} rows, wanted {per_round}")
        tid = n % self.tasks + 1
        state = self.moves.get(tid, "assigned")
        to = {"assigned": "in_progress", "in_progress": "blocked", "blocked": "in_progress"}[state]
        if not t.time(key("move"), self.db.move, tid, state, to, f"round {n}"):
            raise AssertionError("sqlite task move lost its compare-and-set")
        self.moves[tid] = to


def run_mode(targets, fsync: bool, rounds: int, warmup: int, per_round: int, seed: int):
    t = Timer()
    for tg in targets.values():
        tg.open(fsync)
    rng = random.Random(seed)
    names = list(targets)
    for n in range(warmup + rounds):
        rng.shuffle(names)
        for name in names:
            if n < warmup:
                targets[name].round(Timer(), lambda op: op, per_round, n)
            else:
                targets[name].round(t, lambda op, name=name: (name, op), per_round, n)
    return t


def report(t: Timer, sizes, fsync: bool, method: str) -> dict:
    mode = f"fsync on (hub default; method: {method}) vs SQLite synchronous=FULL" if fsync \
        else "fsync off vs SQLite synchronous=OFF"
    print(f"\n## {mode}")
    print(f"{'op':6} {'history':>8} {'gitdrop med':>12} {'p99':>9} {'sqlite med':>11} "
          f"{'p99':>9} {'git/sqlite':>10} {'vs empty':>9} {'n':>5}   (ms)")
    out = {}
    for op in OPS:
        base = t.med((("git", sizes[0]), op))
        for size in sizes:
            g, s = ("git", size), ("sql", size)
            gm, sm = t.med((g, op)), t.med((s, op))
            out[(op, size)] = (gm, sm, gm / base)
            print(f"{op:6} {size:>8} {ms(gm):>12} {ms(t.p99((g, op))):>9} {ms(sm):>11} "
                  f"{ms(t.p99((s, op))):>9} {ratio(gm, sm):>10} {ratio(gm, base):>9} "
                  f"{t.n((g, op)):>5}")
    return out


def anatomy(path: str, size: int, fsync: bool, n: int = 200) -> None:
    """Where one send's time goes, step by step, as Store.write does it."""
    h = hubmod.Hub(path)
    h.store.repo.config["gitdrop.fsync"] = "true" if fsync else "false"
    store = Store(path)
    ref = store.room_ref(ROOM)
    room = h.room(ROOM)
    t = Timer()
    for i in range(n):
        agent = t.time("resolve sender (view, agent file)", room.resolve, SENDER)
        tip = t.time("read tip", store.tip, ref)
        tc = store.reader.commit(tip)
        view = RoomView(store.reader, tc.tree, tip, ROOM)
        now = int(time.time())
        msg = room._msg(f"alice → bob: anatomy {i}", f"anatomy {i}", "send", to=READER)
        c = CommitData("", None, [tip], agent, "", now, msg)
        t.time("rules.check (incl. unread walk)", rules.check, view, c, [],
               rules.Ctx(store.reader, now))
        sig = signature(agent, now)
        if store.method != "fsync":  # as Store.write does it: gitdrop's own writer
            from gitdrop import durable
            w = durable.Writer(store.path, store.method)
            oid = t.time("write commit object", w.commit, tc.tree, [tip], sig.name, sig.email,
                         now, msg)
            ok = t.time("move ref (CAS" + (", log + fdatasync)" if store.method == "wal" else ")"),
                        store._cas, ref, tip, oid, "send", w)
        else:
            oid = t.time("write commit object", store.repo.create_commit, None, sig, sig, msg,
                         pygit2.Oid(hex=tc.tree), [pygit2.Oid(hex=tip)])
            ok = t.time("move ref (CAS)", store._cas, ref, tip, oid, "send")
        assert ok
    total = sum(t.med(k) for k in t.samples)
    how = "off" if not fsync else f"on, {store.method} method"
    print(f"\n## anatomy of a send, fsync {how}, history {size}, n={n}")
    for k in t.samples:
        print(f"  {k:36} med {ms(t.med(k))} ms  p99 {ms(t.p99(k))} ms  "
              f"{100 * t.med(k) / total:5.1f}%")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="0,10000,100000",
                    help="commits of history in each room (comma separated)")
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--per-round", type=int, default=10, help="messages per inbox read")
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--modes", default="on,off", help="fsync modes to run: on,off")
    ap.add_argument("--no-anatomy", action="store_true")
    ap.add_argument("--dir", default="", help="work in this directory (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the hubs afterwards")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--verify", action="store_true",
                    help="re-validate each built room from its first commit (slow for 100k)")
    a = ap.parse_args(argv)
    sizes = [int(x) for x in a.sizes.split(",")]
    work = a.dir or common.workdir("core-")
    os.makedirs(work, exist_ok=True)
    if a.dir:
        common.settle(work)
    common.header("gitdrop core: send, inbox, task move vs SQLite", work)
    print(common.creation_note(work))
    print("room settings: loop_cap = 0 (the default loop guard, 60 messages per 60 s, "
          "would refuse a benchmark that sends thousands from one agent)")
    targets = {}
    try:
        for size in sizes:
            t0 = time.perf_counter()
            p = os.path.join(work, f"hub-{size}.git")
            shutil.rmtree(p, ignore_errors=True)
            h = common.make_room(p, size, tasks=a.tasks)
            if a.verify:
                t1 = time.perf_counter()
                n = len(h.verify(ROOM))
                print(f"verified: all {n} commits of the {size}-commit room pass the rules "
                      f"({time.perf_counter() - t1:.1f}s)")
            targets[("git", size)] = GitTarget(p, size, a.tasks)
            db = os.path.join(work, f"sqlite-{size}.db")
            for suffix in ("", "-wal", "-shm"):
                if os.path.exists(db + suffix):
                    os.remove(db + suffix)
            targets[("sql", size)] = SqlTarget(db, size, a.tasks)
            print(f"built: room with {size} commits of history (+{10 + a.tasks + 3} setup "
                  f"commits) and SQLite with {size} rows in {time.perf_counter() - t0:.1f}s")
        # Building wrote hundreds of MB; let writeback finish so that it does not
        # compete with the first target's syncs and not the others'.
        t0 = time.perf_counter()
        os.sync()
        print(f"synced the build ({time.perf_counter() - t0:.1f}s)")
        print(f"rounds: {a.rounds} (+{a.warmup} warm-up) x (send x{a.per_round}, inbox, move) "
              "per target, targets shuffled each round")
        results = {}
        for mode in a.modes.split(","):
            fsync = mode == "on"
            t = run_mode(targets, fsync, a.rounds, a.warmup, a.per_round, a.seed)
            store = targets[("git", sizes[0])].hub.store
            method = {"wal": "write-ahead log (one fdatasync per write)",
                      "fsync": "libgit2 fsync of every file and directory"}.get(
                store.method, store.method)
            results[fsync] = report(t, sizes, fsync, method)
        if not a.no_anatomy:
            for mode in a.modes.split(","):
                anatomy(targets[("git", sizes[-1])].path, sizes[-1], mode == "on")
        if True in results:
            r = results[True]
            big = sizes[-1]
            print("\n## targets (fsync on vs SQLite synchronous=FULL)")
            print(f"  send within 5x SQLite insert:       {r[('send', sizes[0])][0] / r[('send', sizes[0])][1]:.2f}x"
                  f" (history {sizes[0]}), {r[('send', big)][0] / r[('send', big)][1]:.2f}x (history {big})")
            print(f"  send at {big} within 1.5x of empty:  {r[('send', big)][2]:.2f}x")
            print(f"  inbox at {big} within 1.5x of empty: {r[('inbox', big)][2]:.2f}x")
            print(f"  move at {big} vs empty (no target):  {r[('move', big)][2]:.2f}x")
        print(common.creation_note(work))
        print(f"\nfinished: {time.strftime('%Y-%m-%d %H:%M:%S')}; command: {common.command()}")
    finally:
        if not a.keep and not a.dir:
            common.leave(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
