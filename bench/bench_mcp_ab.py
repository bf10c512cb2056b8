"""Two versions of the MCP server side by side: the stdio round trip of `send` and
`check_inbox` for a git revision against the working tree, in alternating blocks of
one run, so that a change is judged by a ratio measured under the same noise.

    python bench/bench_mcp_ab.py [--base REV] [--blocks 8] [--rounds 40]

REV (default HEAD) is checked out with `git worktree` into a temporary directory.
Each side gets its own hub (one side's notifier must not wake on the other's commits)
and its own two server processes (`python -m gitdrop.mcp.server`, run from that
side's tree), driven by bench_mcp's minimal JSON-RPC client in ping-pong. Printed:
medians per side, their ratio, and the servers' CPU per call (push included).
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

import bench_mcp  # noqa: E402
import common  # noqa: E402


class Server(bench_mcp.RawStdio):
    """bench_mcp's minimal client, against a server run from `tree`."""

    def __init__(self, path: str, agent: str, tree: str):
        self.p = subprocess.Popen([sys.executable, "-m", "gitdrop.mcp.server", path, "lobby",
                                   "--as", agent], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, cwd=tree)
        self.n = 0
        self.rpc("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                "clientInfo": {"name": "bench-ab", "version": "1"}})
        self.p.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')


def block(pair, rounds: int, times: dict) -> float:
    """`rounds` ping-pong rounds (the first 3 warm the block up, untimed); returns
    the servers' CPU seconds they took."""
    a, b = pair
    cpu = a.cpu() + b.cpu()
    bench_mcp.raw_rounds(a, b, rounds, times, warm=3)
    return a.cpu() + b.cpu() - cpu


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--base", default="HEAD", help="the revision to compare with (git)")
    p.add_argument("--blocks", type=int, default=8)
    p.add_argument("--rounds", type=int, default=40)
    a = p.parse_args()
    print(f"command: python {' '.join(sys.argv)}")
    rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", a.base], check=True,
                         capture_output=True, text=True).stdout.strip()
    base_tree = tempfile.mkdtemp(prefix="gitdrop-ab-")
    subprocess.run(["git", "-C", ROOT, "worktree", "add", "-q", "--detach", base_tree, rev],
                   check=True)
    sides = {rev: base_tree, "working tree": ROOT}
    pairs, times, cpu = {}, {}, {}
    try:
        for name, tree in sides.items():
            hub = bench_mcp.make_hub(True)
            pairs[name] = (Server(hub, bench_mcp.A, tree), Server(hub, bench_mcp.B, tree))
            times[name], cpu[name] = {"send": [], "check_inbox": []}, 0.0
        order = list(sides)
        for i in range(a.blocks):
            for name in order if i % 2 == 0 else order[::-1]:
                cpu[name] += block(pairs[name], a.rounds, times[name])
        calls = a.blocks * a.rounds * 4
        for name in order:
            print(f"  {name:14} send {statistics.median(times[name]['send']) * 1e3:6.2f} ms  "
                  f"check_inbox {statistics.median(times[name]['check_inbox']) * 1e3:6.2f} ms"
                  f"  server CPU per call {cpu[name] / calls * 1e3:5.2f} ms")
        new, old = times["working tree"], times[rev]
        print("  working tree / " + rev + ": " + "  ".join(
            f"{op} {statistics.median(new[op]) / statistics.median(old[op]):.2f}x"
            for op in ("send", "check_inbox")))
    finally:
        for pair in pairs.values():
            for server in pair:
                server.close()
        subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", base_tree])
        shutil.rmtree(base_tree, ignore_errors=True)
        for d in bench_mcp.MADE:
            common.leave(d)
    return 0


if __name__ == "__main__":
    sys.exit(main())
