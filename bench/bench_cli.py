"""Start-up of the CLI: `gitdrop inbox` on a hub with 10k commits, whole process.

Builds a throwaway hub whose lobby holds ~10k commits, then, each round, has the
lead send 5 messages to core/spartan (in process, untimed) and times
`gitdrop inbox --as core/spartan` as a subprocess, interleaved with the
baselines `python -c pass`, `python -c "import pygit2"`, `python -c "import typer"`
(the floor of any Typer CLI: a room's verbs run without pygit2, on the lean store)
and `python -c "import pygit2, typer"`, measured the same way.

    /work/venv/bin/python bench/bench_cli.py [--commits 10000] [--rounds 21]
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import pygit2  # noqa: E402

from gitdrop import fmt, hub as hubmod, model
from gitdrop.store import signature

LEAD, READER, OTHER = "core/juno", "core/spartan", "core/ada"
SENDERS = [f"core/s{i}" for i in range(8)]  # spread the rounds' messages under the loop guard


def build(path: str, commits: int) -> hubmod.Hub:
    """Register three agents, then append `commits` messages from the lead to ada
    straight through pygit2 (the rules allow them: nothing is unread for the lead,
    and they are 2 s apart, under the loop guard's cap)."""
    h = hubmod.init(path, fsync=False)
    room = h.room("lobby")
    room.register(LEAD, ["lead"])
    room.register(READER, ["coder"])
    room.register(OTHER, ["coder"])
    for a in SENDERS:
        room.register(a, ["coder"])
    repo = h.store.repo
    ref = model.ROOM_PREFIX + "lobby"
    tip = repo.references[ref].target
    tree = repo[tip].tree_id
    start = int(time.time()) - 2 * commits - 60
    for i in range(commits):
        sig = signature(LEAD, start + 2 * i)
        msg = fmt.format_message(f"juno → ada: note {i}", f"note {i}: keep going",
                                 [("op", "send"), ("to", OTHER)])
        tip = repo.create_commit(None, sig, sig, msg, tree, [tip])
    repo.references[ref].set_target(tip)
    for a in [READER] + SENDERS:  # everyone is up to date before the rounds start
        room.inbox(a, limit=0)
    return h


def timed(cmd, env) -> float:
    t = time.perf_counter()
    p = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    dt = time.perf_counter() - t
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {p.stderr.decode()}")
    return dt * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--commits", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=21)
    args = ap.parse_args()

    py = sys.executable
    gitdrop = os.path.join(os.path.dirname(py), "gitdrop")
    tmp = common.workdir("cli-")
    try:
        path = os.path.join(tmp, "hub.git")
        t = time.perf_counter()
        h = build(path, args.commits)
        room = h.room("lobby")
        depth = sum(1 for _ in room.store.repo.walk(room.store.repo.references[room.ref].target))
        print(f"hub: {path}, lobby has {depth} commits (built in {time.perf_counter() - t:.1f}s)")

        # Cached bytecode as a normal install has it (this repository's
        # environment may set PYTHONDONTWRITEBYTECODE).
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env.update(GITDROP_HUB=path, GITDROP_ROOM="lobby")
        cmds = {
            "python -c pass": [py, "-c", "pass"],
            'python -c "import pygit2"': [py, "-c", "import pygit2"],
            'python -c "import pygit2, typer"': [py, "-c", "import pygit2, typer"],
            'python -c "import typer"': [py, "-c", "import typer"],
            "gitdrop inbox --as core/spartan": [gitdrop, "inbox", "--as", READER],
        }
        for cmd in cmds.values():  # warm up: page cache, .pyc files
            timed(cmd, env)
        times = {name: [] for name in cmds}
        for i in range(args.rounds):
            for j in range(5):
                sender = SENDERS[(5 * i + j) % len(SENDERS)]
                room.send(sender, READER, f"round {i} message {j}")
            for name, cmd in cmds.items():
                times[name].append(timed(cmd, env))
        left = room.inbox(READER, peek=True)["unread"]
        assert left == 0, f"inbox left {left} unread"

        base = statistics.median(times['python -c "import pygit2"'])
        print(f"{'command':<36}{'median ms':>10}{'min ms':>9}{'× pygit2':>10}")
        for name, ts in times.items():
            med = statistics.median(ts)
            print(f"{name:<36}{med:>10.1f}{min(ts):>9.1f}{med / base:>10.2f}")
        print(f"load average at the end: {os.getloadavg()[0]:.2f}")
        inbox = statistics.median(times["gitdrop inbox --as core/spartan"])
        print(f"gitdrop inbox (5 new messages, {depth} commits): median {inbox:.0f} ms; "
              f"target < 150 ms; {inbox - base:.0f} ms over importing pygit2")
        print(f"made by: {py} {' '.join(sys.argv)} (python {sys.version.split()[0]}, "
              f"pygit2 {pygit2.__version__}, {os.cpu_count()} cpus, {args.rounds} rounds)")
    finally:
        common.leave(tmp)


if __name__ == "__main__":
    main()
