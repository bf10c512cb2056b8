"""Many agents at once through one MCP server over streamable HTTP: 30 agents ×
150 messages through one `gitdrop serve --transport http`, each agent with its
own bearer token and its own session of the official MCP SDK client.

Each agent, 150 times: sends a message to the next agent in a ring, then reads its
inbox. A send refused because the sender has unread mail (the rule
unread-before-send: a message arrived between its read and its send) is followed
by a read and sent again, as an agent would; those are counted. Afterwards every
message is counted in the room's history and in what the agents read.

The clients run in several processes (--clients), so that the SDK client's own
work does not sit on one core. By default every agent calls again the moment it
has its answer (a closed loop: the machine is saturated and the figures are its
throughput and queueing). An agent waits on its model between calls: --think S
makes each wait S seconds on average (uniform from S/2 to 3S/2) after each call,
and the latencies are then what an agent feels at that rate. Baseline in the same run: the same calls made on
the core in one process, one agent after another (no HTTP, no MCP, no waiting).

    python bench/bench_mcp_load.py                        # 30 agents × 150 messages
    python bench/bench_mcp_load.py --agents 10 --messages 50
    python bench/bench_mcp_load.py --think 0.5            # agents that think between calls
"""

import argparse
import multiprocessing as mp
import os
import random
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import common  # noqa: E402
from gitdrop import hub as hubmod, tokens  # noqa: E402

ROOM = "lobby"


def agent_name(i: int) -> str:
    return f"load/a{i:02d}"


def client(url: str, names: list, tokens_: dict, n: int, peers: int, think: float, go,
           out) -> None:
    import anyio
    from mcp_helpers import http_agent

    async def one(name: str, i: int, res: dict) -> None:
        to = agent_name((i + 1) % peers)
        lat = {"send": [], "check_inbox": []}
        retried, read = 0, 0
        async def pause():
            if think:
                await anyio.sleep(random.uniform(think / 2, think * 1.5))

        async with http_agent(url, name, "auto", token=tokens_[name]) as a:
            await a.ok("check_inbox")
            go.wait()
            for k in range(n):
                while True:
                    await pause()
                    t = time.perf_counter()
                    r = await a.call("send", to_agent=to, message=f"{name} #{k}")
                    lat["send"].append(time.perf_counter() - t)
                    if not r.is_error:
                        break
                    text = r.content[0].text if r.content else ""
                    if "unread-before-send" not in text:
                        raise AssertionError(f"{name}: send refused: {text[:300]}")
                    retried += 1
                    await pause()
                    t = time.perf_counter()
                    got = await a.ok("check_inbox")
                    lat["check_inbox"].append(time.perf_counter() - t)
                    read += len(got["messages"])
                await pause()
                t = time.perf_counter()
                got = await a.ok("check_inbox")
                lat["check_inbox"].append(time.perf_counter() - t)
                read += len(got["messages"])
            # what is still in flight to this agent arrives once its sender is done
            for _ in range(600):
                got = await a.ok("check_inbox")
                read += len(got["messages"])
                if read >= n:
                    break
                await anyio.sleep(0.05)
        res[name] = (lat, retried, read)

    async def main() -> dict:
        res: dict = {}
        async with anyio.create_task_group() as tg:
            for name in names:
                tg.start_soon(one, name, int(name[-2:]), res)
        return res

    got = anyio.run(main)
    import resource
    ru = resource.getrusage(resource.RUSAGE_SELF)
    got["_cpu"] = ru.ru_utime + ru.ru_stime
    out.put(got)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(path: str, port: int) -> subprocess.Popen:
    gitdrop = os.path.join(os.path.dirname(sys.executable), "gitdrop")
    cmd = [gitdrop] if os.path.exists(gitdrop) else [sys.executable, "-m", "gitdrop"]
    if os.environ.get("BENCH_PROFILE"):   # where the server's cProfile goes
        cmd = [sys.executable, "-m", "cProfile", "-o", os.environ["BENCH_PROFILE"],
               "-m", "gitdrop"]
    p = subprocess.Popen(cmd + ["--hub", path, "--room", ROOM, "serve", "--transport", "http",
                                "--port", str(port), "--tools", "agent"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return p
        except OSError:
            if p.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the server did not start: " + p.stderr.read().decode()[-2000:])
            time.sleep(0.05)


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc (Linux)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def core_baseline(path: str, agents: int, n: int) -> dict:
    room = hubmod.Hub(path).room(ROOM)
    lat = {"send": [], "check_inbox": []}
    for k in range(n):
        for i in range(agents):
            t = time.perf_counter()
            room.send(agent_name(i), agent_name((i + 1) % agents), f"core #{k}")
            lat["send"].append(time.perf_counter() - t)
            t = time.perf_counter()
            room.inbox(agent_name((i + 1) % agents))
            lat["check_inbox"].append(time.perf_counter() - t)
    return lat


def sends_in_history(path: str) -> int:
    out = subprocess.run(["git", "--git-dir", path, "log", "--first-parent", "--format=%(trailers:key=Gitdrop-Op,valueonly)",
                          f"refs/heads/rooms/{ROOM}"], capture_output=True, text=True, check=True)
    return sum(1 for line in out.stdout.splitlines() if line.strip() == "send")


def line(label: str, xs: list, base: list | None = None) -> str:
    p50, p99 = common.percentile(xs, 0.5), common.percentile(xs, 0.99)
    out = f"  {label:<26} n={len(xs):>5}  p50 {p50 * 1e3:7.2f} ms  p99 {p99 * 1e3:7.2f} ms  " \
          f"max {max(xs) * 1e3:7.1f} ms"
    if base:
        out += f"  (p50 {p50 / common.percentile(base, 0.5):5.1f}x the core's)"
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--agents", type=int, default=30)
    ap.add_argument("--messages", type=int, default=150, help="messages each agent sends")
    ap.add_argument("--clients", type=int, default=3, help="client processes")
    ap.add_argument("--think", type=float, default=0.0,
                    help="seconds each agent waits between calls, on average (0: none)")
    ap.add_argument("--dir", default="")
    args = ap.parse_args()
    work = common.begin(args.dir, "mcpload-", f"{args.agents} agents x {args.messages} "
                        "messages through one MCP server over HTTP"
                        + (f", {args.think} s between calls" if args.think
                           else ", no wait between calls"))
    path = os.path.join(work, "hub.git")
    h = hubmod.init(path, room="")
    h.create_room("hub/admin", ROOM, open_=True, settings={"loop_cap": 0})
    room = h.room(ROOM)
    names = [agent_name(i) for i in range(args.agents)]
    for name in names:
        room.register(name)
    toks = {name: tokens.mint(path, name) for name in names}

    port = free_port()
    server = serve(path, port)
    try:
        go, out = mp.Event(), mp.Queue()
        groups = [names[i::args.clients] for i in range(args.clients)]
        ps = [mp.Process(target=client, args=(f"http://127.0.0.1:{port}/mcp", g, toks,
                                              args.messages, args.agents, args.think, go, out))
              for g in groups if g]
        for p in ps:
            p.start()
        time.sleep(3)    # sessions open (each agent read its inbox once)
        server_cpu = cpu_seconds(server.pid)
        t = time.perf_counter()
        go.set()
        res, client_cpu_all = {}, 0.0
        for _ in ps:
            got = out.get()
            client_cpu_all += got.pop("_cpu")
            res.update(got)
        elapsed = time.perf_counter() - t
        server_cpu = cpu_seconds(server.pid) - server_cpu
        for p in ps:
            p.join()
    finally:
        server.send_signal(2)   # as Ctrl-C: the server ends cleanly
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
    sent = sends_in_history(path)
    want = args.agents * args.messages
    read = sum(r[2] for r in res.values())
    retried = sum(r[1] for r in res.values())
    sends = [x for r in res.values() for x in r[0]["send"]]
    reads = [x for r in res.values() for x in r[0]["check_inbox"]]
    calls = len(sends) + len(reads)
    base = core_baseline(path, args.agents, min(args.messages, 20))
    print(f"\ndelivered: {sent}/{want} sends in the room's history; {read}/{want} read by "
          f"their recipients; {retried} sends refused for unread mail and sent again")
    print(f"{calls} calls in {elapsed:.1f} s: {calls / elapsed:.0f} calls/s, "
          f"{want / elapsed:.0f} messages/s")
    print(f"CPU per call: the server {server_cpu / calls * 1e3:.2f} ms, the SDK clients "
          f"{client_cpu_all / calls * 1e3:.2f} ms (whole client processes); 2 cores are "
          f"{2 * elapsed / calls * 1e3:.2f} ms per call")
    print(line("send (MCP over HTTP)", sends, base["send"]))
    print(line("check_inbox (MCP over HTTP)", reads, base["check_inbox"]))
    print(line("all calls", sends + reads))
    print(line("send (core, one process)", base["send"]))
    print(line("check_inbox (core)", base["check_inbox"]))
    common.leave(work)


if __name__ == "__main__":
    main()
