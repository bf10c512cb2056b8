"""How fast a waiting agent hears about a commit, and what waiting costs.

Latency: from a send's ref update in this process to the moment this process
reads the line the other process printed: the `gitdrop watch` stream line, or
the alert of a `gitdrop wait`. The new tip becomes visible somewhere inside the
ref update (lock file, rename; fsyncs too with --fsync, off by default because
their noisy milliseconds are the disk's, not the notifier's), so it is counted
from the update's start (an upper bound) and from its end (a lower bound).
Baseline in the same run: a bare watchdog process that prints a line per ref
rename (the floor for any inotify-driven watcher in Python).

Idle CPU: utime+stime (+ children's, for the git processes a poller spawns) of a
waiting process over a quiet window, from /proc/<pid>/stat; baseline: the shell
poll loop people write by hand (`while sleep 1; do git rev-parse ...; done`).

    python bench/bench_notify.py [--sends 300] [--rounds 100] [--idle 10]
"""

import argparse
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from gitdrop import hub as hubmod
from gitdrop.store import Store

PY = sys.executable
TICK = os.sysconf("SC_CLK_TCK")

FLOOR = r"""
import os, sys
from watchdog.observers import Observer
from watchdog.events import FileMovedEvent
git = sys.argv[1]
class H:
    def dispatch(self, e):
        if isinstance(e, FileMovedEvent) and not e.dest_path.endswith(".lock"):
            print("ref moved", flush=True)
o = Observer()
o.schedule(H(), os.path.join(git, "refs"), recursive=True)
o.schedule(H(), git, recursive=False)
o.start()
print("ready", file=sys.stderr, flush=True)
o.join()
"""

LANDED: list[tuple[float, float]] = []


def stamp_cas():
    """Record when each CAS started and finished moving a ref. The rename that
    makes the new tip visible happens in between, so latency is counted from the
    start: an upper bound by the update's own cost (printed)."""
    orig = Store._cas

    def _cas(self, *args, **kw):
        t0 = time.monotonic()
        ok = orig(self, *args, **kw)
        if ok:
            LANDED.append((t0, time.monotonic()))
        return ok
    Store._cas = _cas


class Proc:
    def __init__(self, args, ready):
        self.p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env=dict(os.environ, GITDROP_AGENT=""))
        STARTED.append(self.p)
        self.lines = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        for line in self.p.stderr:
            if ready in line:
                break
        else:
            raise SystemExit(f"{args} exited before it was ready")
        threading.Thread(target=lambda: [None for _ in self.p.stderr], daemon=True).start()

    def _pump(self):
        for line in self.p.stdout:
            self.lines.put(time.monotonic())

    def next_line(self, timeout=10.0) -> float:
        return self.lines.get(timeout=timeout)

    def stop(self):
        if self.p.poll() is None:
            self.p.terminate()
            self.p.wait(5)


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def report(name, cmd, lat, floor=None):
    """`lat`: (from the start of the ref update, from its end) per send, in ms."""
    up = [a for a, _ in lat]
    low = [b for _, b in lat]
    p50, p99 = pct(up, 50), pct(up, 99)
    line = (f"{name:<30} n={len(up):<4} median {p50:6.2f} ms  p99 {p99:6.2f} ms  "
            f"max {max(up):6.2f} ms")
    if floor:
        line += f"  ({p50 / floor[0]:.1f}× / {p99 / floor[1]:.1f}× the floor)"
    print(line)
    print(f"{'':<30} counted from the end of the ref update instead: median "
          f"{pct(low, 50):6.2f} ms  p99 {pct(low, 99):6.2f} ms")
    print(f"    command: {cmd}")
    return p50, p99


CAS_MS: list[float] = []


def stream_latency(proc, room, n, to="core/spartan"):
    out = []
    for i in range(n):
        LANDED.clear()
        room.send("core/juno", to, f"bench {i}")
        t = proc.next_line()
        t0, t1 = LANDED[-1]
        out.append(((t - t0) * 1000, (t - t1) * 1000))
        CAS_MS.append((t1 - t0) * 1000)
    return out


def cpu_ticks(pid) -> int:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # fields[11..14] = utime, stime, cutime, cstime (stat fields 14-17)
    return sum(int(x) for x in fields[11:15])


def sched(pid) -> tuple[int, int]:
    """(ns on a CPU, times scheduled) summed over the process's threads."""
    ns = runs = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                a, _, c = f.read().split()
        except OSError:
            continue
        ns, runs = ns + int(a), runs + int(c)
    return ns, runs


def idle_cpu(args, ready, seconds, shell=False):
    """CPU % and ms from /proc/<pid>/stat (with children), plus the process's own
    ns-precise CPU and wake-ups per second from schedstat."""
    if shell:
        p = subprocess.Popen(args, shell=True, start_new_session=True)
        STARTED.append(p)
        time.sleep(0.5)
    else:
        p = Proc(args, ready).p
    time.sleep(1.0)  # let start-up settle
    before, s0, t0 = cpu_ticks(p.pid), sched(p.pid), time.monotonic()
    time.sleep(seconds)
    after, s1, t1 = cpu_ticks(p.pid), sched(p.pid), time.monotonic()
    p.terminate()
    p.wait(5)
    dt = t1 - t0
    return {"pct": (after - before) / TICK / dt * 100, "ms": (after - before) / TICK * 1000,
            "own_ms": (s1[0] - s0[0]) / 1e6, "wakeups": (s1[1] - s0[1]) / dt}


def show_idle(label, r, cmd):
    print(f"  {label:<34} {r['pct']:6.3f} % of a CPU ({r['ms']:.0f} ms with children; "
          f"own threads {r['own_ms']:.2f} ms, {r['wakeups']:.1f} wake-ups/s)")
    print(f"    command: {cmd}")


STARTED: list[subprocess.Popen] = []


def main():
    try:
        run()
    finally:  # no watcher outlives the bench, even when it fails
        for p in STARTED:
            if p.poll() is None:
                p.kill()


def run():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sends", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--idle", type=float, default=10.0)
    ap.add_argument("--dir", default="")
    ap.add_argument("--settle", type=float, default=0.2,
                    help="seconds between a waiter's ready line and the send")
    ap.add_argument("--fsync", action="store_true",
                    help="durable ref updates (the default of a real hub); their fsyncs then "
                         "dominate the numbers, which are about the notifier")
    a = ap.parse_args()
    base = tempfile.mkdtemp(prefix="notify-", dir=a.dir) if a.dir else common.workdir("notify-")
    path = os.path.join(base, "hub.git")
    h = hubmod.init(path, fsync=a.fsync)
    h.create_room("hub/admin", "bench", open_=True, settings={"loop_cap": 0})
    room = h.room("bench")
    room.register("core/juno", ["lead"])
    room.register("core/spartan", ["coder"])
    stamp_cas()
    me = (f"python bench/bench_notify.py --sends {a.sends} --rounds {a.rounds} --idle {a.idle:g}"
          f" --settle {a.settle:g}"
          + (" --fsync" if a.fsync else ""))
    print(f"# {me}")
    print(f"# load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} before the run")
    gitv = subprocess.run(["git", "--version"], capture_output=True, text=True).stdout.split()[-1]
    print(f"# hub {path}; {os.cpu_count()} CPUs; git {gitv}")

    mod = [PY, "-m", "gitdrop.notifier"]
    who = ["--hub", path, "--room", "bench", "--as", "spartan"]

    floor_p = Proc([PY, "-c", FLOOR, path], "ready")
    stream_latency(floor_p, room, 20)  # warm up
    floor = report("floor: bare watchdog process", f"python -c '<watchdog: print per ref "
                   f"rename>' {path}", stream_latency(floor_p, room, a.sends))
    floor_p.stop()

    watch = Proc(mod + ["watch"] + who, "streaming events")
    stream_latency(watch, room, 20)
    room.inbox("spartan", limit=0)
    report("gitdrop watch (stream line)", "python -m gitdrop.notifier watch " + " ".join(who),
           stream_latency(watch, room, a.sends), floor)
    watch.stop()

    lat = []
    for i in range(a.rounds):
        room.inbox("spartan", limit=0)
        w = Proc(mod + ["wait"] + who + ["--timeout", "30"], "waiting for")
        time.sleep(a.settle)  # a waiter waits: let its start-up finish first
        LANDED.clear()
        room.send("core/juno", "spartan", f"wake {i}")
        t = w.next_line()
        t0, t1 = LANDED[-1]
        lat.append(((t - t0) * 1000, (t - t1) * 1000))
        CAS_MS.append((t1 - t0) * 1000)
        w.p.wait(10)
        assert w.p.returncode == 0, w.p.returncode
    report("gitdrop wait (alert line)",
           f"python -m gitdrop.notifier wait {' '.join(who)} --timeout 30  "
           f"(one process per round, send {a.settle:g} s after it is ready)", lat, floor)

    print(f"(the new tip becomes visible somewhere inside the ref update (lock file, rename"
          f"{', fsyncs' if a.fsync else ''}), which took median {pct(CAS_MS, 50):.2f} ms, p99 "
          f"{pct(CAS_MS, 99):.2f} ms: the two countings bound the latency from both sides)")
    room.inbox("spartan", limit=0)
    print(f"idle CPU over ~{a.idle:g} s (utime+stime+children, /proc/<pid>/stat):")
    cmd = mod + ["wait"] + who + ["--timeout", "600"]
    local = idle_cpu(cmd, "waiting for", a.idle)
    show_idle("gitdrop wait, local (inotify)", local,
              f"python -m gitdrop.notifier wait {' '.join(who)} --timeout 600")
    cache = os.path.join(base, "cache")
    os.environ["GITDROP_CACHE"] = cache
    rcmd = mod + ["wait", "--hub", "file://" + path, "--room", "bench", "--as", "spartan",
                  "--timeout", "600"]
    remote = idle_cpu(rcmd, "waiting for", a.idle)
    show_idle("gitdrop wait, remote (ls-remote)", remote,
              f"GITDROP_CACHE={cache} python -m gitdrop.notifier wait --hub file://{path} "
              f"--room bench --as spartan --timeout 600")
    sh = (f"while sleep 1; do git --git-dir={path} rev-parse -q --verify "
          f"refs/heads/rooms/bench >/dev/null; done")
    loop = idle_cpu(sh, "", a.idle, shell=True)
    show_idle("baseline: shell poll loop, 1 s", loop, f"sh -c '{sh}'")
    if loop["ms"]:
        print(f"  ratio to the baseline (ms with children): local {local['ms'] / loop['ms']:.2f}, "
              f"remote {remote['ms'] / loop['ms']:.2f}")
    if a.dir:
        shutil.rmtree(base, ignore_errors=True)
    else:
        common.leave(base)


if __name__ == "__main__":
    main()
