"""Round trip of the MCP tools `send` and `check_inbox` through the real SDK client,
over stdio (one server process per agent) and streamable HTTP (one server, bearer
tokens), on the current protocol and the legacy one; the same verbs called
in-process on the core in the same run are the baseline. Also the size of
tools/list per profile.

    python bench/bench_mcp.py [--rounds 200] [--fsync on|off|both]

Two agents talk ping-pong (a sends to b, b reads, b sends to a, a reads), so each
read finds one new message and every send passes the unread check, as in a real
conversation. The room's loop guard is off (settings loop_cap = 0). Each face is
measured right after its own core baseline (ratios hold on a noisy machine). The
"raw" row is a minimal JSON-RPC client over the server's stdin/stdout (what a client
pays without the Python SDK client's own validation). The "floor" row is that same
client against a process per agent that runs the same tool bodies (mcp_tools.ToolBox)
with no MCP SDK and no push: the in-process baseline shares one process's caches and
never sleeps between calls, so only this row says what the SDK server itself adds.
"""

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time

import anyio

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import common  # noqa: E402
from gitdrop import hub as hubmod, tokens  # noqa: E402
from gitdrop.mcp import tools as mcp_tools  # noqa: E402
from mcp_helpers import http_agent, http_server, stdio_agent, together  # noqa: E402

COMMAND = "python " + " ".join(shlex.quote(a) for a in sys.argv)
A, B = "core/ada", "core/bob"


MADE: list[str] = []   # work directories, left for the next run to remove


def make_hub(fsync: bool) -> str:
    MADE.append(common.workdir("mcp-"))
    path = os.path.join(MADE[-1], "hub.git")
    h = hubmod.init(path, room="", fsync=fsync)
    h.create_room("hub/admin", "lobby", settings={"loop_cap": 0})
    r = h.room("lobby")
    r.register(A, ["lead"])
    r.register(B, [])
    return path


def stats(samples: list[float]) -> str:
    s = sorted(samples)
    p99 = s[min(len(s) - 1, int(len(s) * 0.99))]
    return f"median {statistics.median(s) * 1e3:6.2f} ms  p99 {p99 * 1e3:6.2f} ms  (n={len(s)})"


def report(label: str, times: dict, base: dict | None = None) -> None:
    for verb in ("send", "check_inbox"):
        ratio = ""
        if base:
            ratio = f"  = {statistics.median(times[verb]) / statistics.median(base[verb]):.1f}x core"
        print(f"  {label:<31} {verb:<12} {stats(times[verb])}{ratio}")
    if "cpu" in times:
        print(f"  {label:<31} CPU per call (send and check_inbox alike): "
              f"{times['cpu'] * 1e3:.2f} ms")


def core_baseline(path: str, rounds: int) -> dict:
    r = hubmod.Hub(path).room("lobby")
    times = {"send": [], "check_inbox": []}
    cpu0 = time.process_time()
    for i in range(rounds):
        for me, other in ((A, B), (B, A)):
            t = time.perf_counter()
            r.send(me, other, f"ping {i}")
            times["send"].append(time.perf_counter() - t)
            t = time.perf_counter()
            got = r.inbox(other, 20)
            times["check_inbox"].append(time.perf_counter() - t)
            assert len(got["messages"]) == 1, got
    times["cpu"] = (time.process_time() - cpu0) / (4 * rounds)
    return times


async def ping_pong(a, b, rounds: int) -> dict:
    times = {"send": [], "check_inbox": []}
    for i in range(rounds):
        for me, other, other_name in ((a, b, B), (b, a, A)):
            t = time.perf_counter()
            await me.ok("send", to_agent=other_name, message=f"ping {i}")
            times["send"].append(time.perf_counter() - t)
            t = time.perf_counter()
            got = await other.ok("check_inbox")
            times["check_inbox"].append(time.perf_counter() - t)
            assert len(got["messages"]) == 1, got
    return times


async def over_stdio(path: str, mode: str, rounds: int) -> dict:
    async with together(stdio_agent(path, A, mode), stdio_agent(path, B, mode)) as (a, b):
        await ping_pong(a, b, 5)  # warm up
        return await ping_pong(a, b, rounds)


async def over_http(url: str, path: str, mode: str, rounds: int) -> dict:
    ta, tb = tokens.mint(path, A), tokens.mint(path, B)
    async with http_agent(url, A, mode, token=ta) as a, http_agent(url, B, mode, token=tb) as b:
        await ping_pong(a, b, 5)
        return await ping_pong(a, b, rounds)


NODE_DIR = os.path.join(os.path.dirname(HERE), "tests", "node")


def node_stdio(path: str, rounds: int) -> dict:
    """The official TypeScript SDK client (what most agent clients are built on),
    over stdio: tests/node/client.mjs in its ping-pong mode."""
    p = subprocess.run(["node", os.path.join(NODE_DIR, "client.mjs"), "pingpong",
                        sys.executable, path, str(rounds)], capture_output=True, text=True,
                       cwd=os.path.dirname(HERE), timeout=600)
    if p.returncode:
        raise RuntimeError(f"node client failed: {p.stderr[-800:]}")
    got = json.loads(p.stdout)
    return {k: [ms / 1e3 for ms in got[k]] for k in ("send", "check_inbox")}


def have_node() -> bool:
    return shutil.which("node") is not None and os.path.isdir(
        os.path.join(NODE_DIR, "node_modules", "@modelcontextprotocol"))


class RawStdio:
    """A minimal JSON-RPC client (2025-11-25) over one server process's pipes."""

    def __init__(self, path: str, agent: str):
        self.p = subprocess.Popen([sys.executable, "-m", "gitdrop.mcp.server", path, "lobby",
                                   "--as", agent], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, cwd=os.path.dirname(HERE))
        self.n = 0
        self.rpc("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                "clientInfo": {"name": "bench", "version": "1"}})
        self.p.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')

    def rpc(self, method, params):
        self.n += 1
        self.p.stdin.write((json.dumps({"jsonrpc": "2.0", "id": self.n, "method": method,
                                        "params": params}) + "\n").encode())
        self.p.stdin.flush()
        while True:  # skip notifications (push: this agent's inbox changed)
            reply = json.loads(self.p.stdout.readline())
            if reply.get("id") == self.n:
                break
        assert "error" not in reply and not reply["result"].get("isError"), reply
        return reply["result"]

    def cpu(self) -> float:
        """Seconds of CPU the server process used so far (user + system)."""
        with open(f"/proc/{self.p.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def ok(self, tool, **args):
        return self.rpc("tools/call", {"name": tool, "arguments": args})["structuredContent"]

    def close(self):
        self.p.stdin.close()
        self.p.wait()


def serve_floor(path: str, agent: str) -> None:
    """The floor server: JSON-RPC lines in, the tool bodies called, results out;
    nothing else (no SDK, no validation, no push). Run by FloorStdio."""
    box = mcp_tools.ToolBox(path, "lobby", agent)
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        req = json.loads(line)
        if "id" not in req:
            continue
        result = {}
        if req["method"] == "tools/call":
            p = req["params"]
            data = getattr(box, p["name"])(**p.get("arguments", {}))
            result = {"content": [{"type": "text", "text": json.dumps(data)}],
                      "structuredContent": data}
        out.write(json.dumps({"jsonrpc": "2.0", "id": req["id"], "result": result}).encode()
                  + b"\n")
        out.flush()


class FloorStdio(RawStdio):
    def __init__(self, path: str, agent: str):
        self.p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve-floor",
                                   path, agent], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  cwd=os.path.dirname(HERE))
        self.n = 0
        self.rpc("initialize", {})


def raw_rounds(a, b, rounds: int, times: dict, warm: int = 0) -> None:
    """`rounds` ping-pong rounds between two RawStdio servers' agents; the first
    `warm` are not timed."""
    for i in range(rounds):
        for me, other, other_name in ((a, b, B), (b, a, A)):
            t = time.perf_counter()
            me.ok("send", to_agent=other_name, message=f"ping {i}")
            t1 = time.perf_counter()
            got = other.ok("check_inbox")
            t2 = time.perf_counter()
            assert len(got["messages"]) == 1, got
            if i >= warm:
                times["send"].append(t1 - t)
                times["check_inbox"].append(t2 - t1)


def raw_stdio(path: str, rounds: int, server=RawStdio) -> dict:
    a, b = server(path, A), server(path, B)
    try:
        raw_rounds(a, b, 5, {"send": [], "check_inbox": []})   # warm-up
        times = {"send": [], "check_inbox": []}
        cpu0 = a.cpu() + b.cpu()
        raw_rounds(a, b, rounds, times)
        times["cpu"] = (a.cpu() + b.cpu() - cpu0) / (4 * rounds)  # both servers, push included
        return times
    finally:
        a.close()
        b.close()


def tools_list_sizes() -> None:
    from gitdrop.mcp.server import build
    path = make_hub(False)

    async def sizes():
        for profile in mcp_tools.PROFILES:
            server, _box, _push = build(path, "lobby", None, "http", profile)
            tools = [t.model_dump(by_alias=True, exclude_none=True, mode="json")
                     for t in await server.list_tools()]
            text = json.dumps(tools, separators=(",", ":"))
            print(f"  --tools {profile:<6} {len(tools):2d} tools  {len(text):6,d} characters "
                  "of compact JSON")
    anyio.run(sizes)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--fsync", choices=["on", "off", "both"], default="both")
    p.add_argument("--serve-floor", nargs=2, metavar=("HUB", "AGENT"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.serve_floor:
        return serve_floor(*a.serve_floor)
    print(f"command: {COMMAND}")
    print("tools/list size per profile (limits: agent < 8,000, all < 16,000):")
    tools_list_sizes()
    for fsync in ([True, False] if a.fsync == "both" else [a.fsync == "on"]):
        path = make_hub(fsync)
        print(common.creation_note(os.path.dirname(path)))
        print(f"\nround trips, hub with gitdrop.fsync={'true' if fsync else 'false'} "
              f"({a.rounds} ping-pong rounds: {2 * a.rounds} calls of each tool):")
        faces = [("stdio floor: tool bodies, no SDK",
                  lambda: raw_stdio(path, a.rounds, FloorStdio)),
                 ("stdio raw JSON-RPC 2025-11-25", lambda: raw_stdio(path, a.rounds))]
        for mode in ("auto", "legacy"):
            proto = "2026-07-28" if mode == "auto" else "2025-11-25"
            faces.append((f"stdio SDK client {proto}",
                          lambda m=mode: anyio.run(over_stdio, path, m, a.rounds)))
        if have_node():
            faces.append(("stdio TypeScript SDK client", lambda: node_stdio(path, a.rounds)))
        else:
            print("  (no node or tests/node/node_modules: the TypeScript SDK row is skipped; "
                  "`npm ci --prefix tests/node` installs it)")
        with http_server(path, tools="agent") as url:
            for mode in ("auto", "legacy"):
                proto = "2026-07-28" if mode == "auto" else "2025-11-25"
                faces.append((f"http SDK client {proto}",
                              lambda m=mode: anyio.run(over_http, url, path, m, a.rounds)))
            for label, run in faces:
                base = core_baseline(path, a.rounds)
                report("core in-process", base)
                report(label, run(), base)
    print("\ntarget: a median round trip under 3 ms over stdio")
    for d in MADE:
        common.leave(d)


if __name__ == "__main__":
    main()
