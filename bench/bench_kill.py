"""kill -9 at random moments, then the next command: writers through the core, the
command line, the MCP server and the MCP tools' bodies, all writing into one room of
one hub at once.

    python bench/bench_kill.py            # 200 core, 150 CLI, 50 MCP server, 100 tools kills
    python bench/bench_kill.py --core 100 --cli 100 --mcp 20 --tools 50 --grace 0.3

- **core**: a Python process that sends in a loop through the core (Room.send), at
  most one send every 0-10 ms, and writes each commit id once the call returned;
  forked from one that imported gitdrop, so a kill costs no start-up; killed 0-80
  ms after its first acknowledged write. Every fourth kill is at a chosen line
  instead: the writer kills itself in its second write while it holds the room's
  lock, its log record written and the ref not yet moved (the ref's lock is held
  only for a moment now, so random kills may miss it on a busy machine).
- **tools**: the same, calling the MCP tools' bodies (mcp_tools.ToolBox.send) as
  the server does.
- **cli**: `gitdrop --hub H --room r --as t/cli send t/sink -m ... --json`, killed at
  a random moment of its life (0-350 ms), then the next such command, run to the end.
- **mcp**: `gitdrop serve` over stdio, sent the JSON-RPC lines an MCP client sends
  (initialize, then `tools/call send`, two calls in flight); killed 0-300 ms after
  its first answer.

A write is acknowledged when the writer wrote or answered its commit id, or the
command exited 0. After every kill the lane's next write must go through without a
person (a lock the dead writer left is cleared: docs/DURABILITY.md). At the end:
every acknowledged write is on the room's first-parent history, `git fsck --full`
is clean, no lock file is left, and `gitdrop repair` finds the hub healthy.

Printed: kills per lane (and how many left the room's lock behind: found unheld
once the writer was dead), how long the next write took after those and after
the others (a new process's start-up included), and the totals. --grace sets
gitdrop.staleLockSeconds (default: gitdrop's own, 2 s). tests/test_kill.py runs
a smaller round in CI.

The writers pause between writes because gitdrop's optimistic write loop starves
a slow writer (the CLI's build takes milliseconds) among writers that commit
back to back: it gives up after 20 lost races ("kept moving"), with or without a
kill. That is a limit of the loop, not of the locks, and it is left out here.
"""

import argparse
import fcntl
import json
import os
import random
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

ROOM = "r"
REF = "refs/heads/rooms/" + ROOM
SINK = "t/sink"
AGENTS = {"core": "t/core", "cli": "t/cli", "mcp": "t/mcp", "tools": "t/tools"}
BIN = os.path.join(os.path.dirname(sys.executable), "gitdrop")
GITDROP = [BIN] if os.path.exists(BIN) else [sys.executable, "-m", "gitdrop"]

ZYGOTE = """
import os, random, signal, sys, time
sys.path.insert(0, {root!r})
from gitdrop import hub
from gitdrop.mcp import tools as mcp_tools   # imported once: each writer is forked from here
signal.signal(signal.SIGCHLD, signal.SIG_IGN)   # children are reaped as they die
for line in sys.stdin:
    n, die, acks = line.split(" ", 2)
    pid = os.fork()
    if pid == 0:
        out = os.open(acks.strip(), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        acked = []
        if die == "1":   # killed at a chosen line: once its first write is acknowledged,
            from gitdrop import durable   # its next ref move holds the room's lock, its
            real = durable._into_place    # record logged, the ref not moved (that move
            def into_place(*a, **k):      # may carry other writers' writes too)
                if acked:
                    os.kill(os.getpid(), signal.SIGKILL)
                return real(*a, **k)
            durable._into_place = into_place
        try:
            if {lane!r} == "core":      # the core: Room.send
                r = hub.Hub({hub!r}).room({room!r})
                send = lambda text: r.send({agent!r}, {sink!r}, text)
            else:                       # the MCP tools' bodies, as the server calls them
                box = mcp_tools.ToolBox({hub!r}, {room!r}, {agent!r})
                send = lambda text: box.send({sink!r}, text)
            for i in range(int(n)):
                c = send(f"{lane} {{os.getpid()}} {{i}}")["commit"]
                os.write(out, (c + "\\n").encode())
                acked.append(1)
                time.sleep(random.uniform(0, {pause}))
        except BaseException as e:
            os.write(out, f"error {{type(e).__name__}}: {{e}}\\n".encode())
            os._exit(1)
        os._exit(0)
    sys.stdout.write(f"{{pid}}\\n")
    sys.stdout.flush()
"""


def make_hub(path: str, grace: float | None = None) -> None:
    """A hub with room r (no loop guard) and the writers' agents."""
    from gitdrop import hub as hubmod
    h = hubmod.init(path, room="")
    if grace is not None:
        h.store.repo.config["gitdrop.staleLockSeconds"] = str(grace)
    h = hubmod.Hub(path)
    h.create_room("hub/admin", ROOM, open_=True, settings={"loop_cap": 0})
    r = h.room(ROOM)
    for agent in [SINK, *AGENTS.values()]:
        r.register(agent)


def lock_state(hub: str):
    """The room's lock right now: None (no lock), "held" (a live writer's flock)
    or the identity of an unheld one."""
    lock = os.path.join(hub, REF + ".lock")
    try:
        fd = os.open(lock, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return "held"
        st = os.fstat(fd)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return st.st_ino, st.st_mtime_ns   # the inode alone may be the next lock's
    finally:
        os.close(fd)


class Lines:
    """A child's stdout read on a thread: whole lines only (a kill may cut the last)."""

    def __init__(self, stream):
        self.lines, self.cond, self.done = [], threading.Condition(), False
        self.thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.thread.start()

    def _read(self, stream):
        buf = b""
        while True:
            chunk = stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536)
            if not chunk:
                break
            buf += chunk
            *whole, buf = buf.split(b"\n")
            with self.cond:
                self.lines.extend(x.decode("utf-8", "replace") for x in whole)
                self.cond.notify_all()
        with self.cond:
            self.done = True
            self.cond.notify_all()

    def wait_for(self, n: int, timeout: float) -> bool:
        end = time.monotonic() + timeout
        with self.cond:
            while len(self.lines) < n and not self.done:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(left)
            return len(self.lines) >= n

    def finish(self, timeout: float = 10) -> list:
        self.thread.join(timeout)
        with self.cond:
            return list(self.lines)


def gone(pid: int, timeout: float = 30) -> bool:
    """Wait until process `pid` (a child of the zygote, reaped there) is gone."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.001)
    return False


def read_lines(path: str) -> list:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return []
    return [x.decode("utf-8", "replace") for x in data.split(b"\n")[:-1]]


def is_oid(s: str) -> bool:
    return len(s) == 40 and not s.strip("0123456789abcdef")


class Run:
    """One kill loop: its lanes write concurrently into one room."""

    def __init__(self, hub: str, seed: int = 1, timeout: float = 60, pause: float = 0.01,
                 inflight: int = 2):
        self.hub, self.timeout, self.pause, self.inflight = hub, timeout, pause, inflight
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.acked: list = []          # commit ids acknowledged to a writer
        self.failures: list = []       # a next write that did not go through
        self.starved: list = []        # ... because it lost 20 races in a row
        self.kills: dict = {}          # lane -> kills
        self.left: dict = {}           # lane -> kills that left the room's lock behind
        self.after_left: list = []     # seconds to the next write after such a kill
        self.after_other: list = []    # ... after the other kills
        self.survived: list = []       # a lock that outlived the next write

    def _rand(self, a, b):
        with self.lock:
            return self.rng.uniform(a, b)

    def _ack(self, oids):
        with self.lock:
            self.acked.extend(oids)

    def _fail(self, lane, what):
        # "kept moving" (exit 6) is 20 lost races in a row: the write loop's limit, not
        # a lock's, unless a lock nobody holds, older than the grace period, is there.
        stale = False
        if "kept moving" in what:
            from gitdrop import locks
            state = lock_state(self.hub)
            stale = state not in (None, "held") and \
                time.time() - state[1] / 1e9 > locks.grace(self.hub)
        with self.lock:
            if "kept moving" in what and not stale:
                self.starved.append(f"{lane}: {what}")
            else:
                self.failures.append(f"{lane}: {what}")

    def _killed(self, lane, proc, wait: float = 0) -> object:
        """Kill -9 `proc` (a Popen, or a pid), or with `wait` let it kill itself
        within that many seconds; then what it left: the identity of an unheld room
        lock."""
        if isinstance(proc, int):
            if wait:
                if not gone(proc, wait):
                    self._fail(lane, f"{proc} did not kill itself within {wait} s")
                    os.kill(proc, 9)
                    gone(proc)
            else:
                try:
                    os.kill(proc, 9)
                except ProcessLookupError:   # it ended by itself first
                    return None
                gone(proc)
        else:
            proc.kill()
            proc.wait()
        state = lock_state(self.hub)
        with self.lock:
            self.kills[lane] = self.kills.get(lane, 0) + 1
            if state not in (None, "held"):
                self.left[lane] = self.left.get(lane, 0) + 1
        return state if state not in (None, "held") else None

    def _next_done(self, lane, left, started):
        took = time.monotonic() - started
        with self.lock:
            (self.after_left if left is not None else self.after_other).append(took)
        if left is not None and lock_state(self.hub) == left:
            with self.lock:
                self.survived.append(lane)

    # --- lanes ----------------------------------------------------------------------
    def core(self, kills: int) -> None:
        self._forked("core", kills)

    def tools(self, kills: int) -> None:
        self._forked("tools", kills)

    def _forked(self, lane: str, kills: int) -> None:
        """Writers forked from a process that imported gitdrop (a kill costs no
        start-up): through the core (Room.send) or the MCP tools' bodies."""
        code = ZYGOTE.format(root=ROOT, hub=self.hub, room=ROOM, agent=AGENTS[lane],
                             sink=SINK, pause=self.pause, lane=lane)
        zygote = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        left = None
        try:
            for k in range(kills + 1):
                last = k == kills   # the next write after the last kill: one, to the end
                acks = os.path.join(self.hub, f"{lane}-acks-{k}")
                started = time.monotonic()
                die = lane == "core" and not last and k % 4 == 3
                zygote.stdin.write(f"{1 if last else 1000000} {int(die)} {acks}\n")
                zygote.stdin.flush()
                pid = int(zygote.stdout.readline())
                lines, end = [], time.monotonic() + self.timeout
                while not lines and time.monotonic() < end:
                    lines = read_lines(acks)
                    if not lines:
                        time.sleep(0.002)
                ok = bool(lines) and is_oid(lines[0])
                if ok and k:
                    self._next_done(lane, left, started)
                elif not ok:
                    self._fail(lane, f"no write went through: {lines[:1]}")
                if last or not ok:   # done (or given up): it ends by itself
                    if not gone(pid, 1 if ok else self.timeout):
                        self._killed(lane, pid)
                    left = None
                elif die:   # it kills itself in its second write, holding the lock
                    left = self._killed(lane, pid, self.timeout)
                else:
                    time.sleep(self._rand(0, 0.08))
                    left = self._killed(lane, pid)
                lines = read_lines(acks)
                self._ack([x for x in lines if is_oid(x)])
                os.unlink(acks)
        finally:
            zygote.stdin.close()
            zygote.wait()

    def _cli_send(self, text: str):
        return subprocess.Popen([*GITDROP, "--hub", self.hub, "--room", ROOM, "--as",
                                 AGENTS["cli"], "send", SINK, "-m", text, "--json"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL)

    def cli(self, kills: int) -> None:
        for k in range(kills):
            p = self._cli_send(f"cli {k} (killed)")
            time.sleep(self._rand(0, 0.35))
            if p.poll() is None:
                left = self._killed("cli", p)
            else:   # it finished first: acknowledged if it said so
                left = None
                if p.returncode == 0:
                    self._ack([json.loads(p.stdout.read())["commit"]])
            started = time.monotonic()
            q = self._cli_send(f"cli {k} (next)")
            try:
                out, err = q.communicate(timeout=self.timeout)
            except subprocess.TimeoutExpired:
                q.kill()
                out, err = q.communicate()
            if q.returncode == 0:
                self._ack([json.loads(out)["commit"]])
                self._next_done("cli", left, started)
            else:
                self._fail("cli", f"exit {q.returncode}: {err.decode()[-500:]}")

    def _mcp_start(self):
        p = subprocess.Popen([*GITDROP, "--hub", self.hub, "--room", ROOM, "--as",
                              AGENTS["mcp"], "serve"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)

        def send(doc):
            p.stdin.write((json.dumps(doc) + "\n").encode())
            p.stdin.flush()
        send({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "bench_kill", "version": "1"}}})
        send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return p, send

    def mcp(self, kills: int) -> None:
        left = None
        for k in range(kills + 1):
            last = k == kills   # the next write after the last kill: one, to the end
            started = time.monotonic()
            p, send = self._mcp_start()
            out = Lines(p.stdout)
            ids = iter(range(1, 1 << 30))

            def call():
                send({"jsonrpc": "2.0", "id": next(ids), "method": "tools/call", "params": {
                    "name": "send", "arguments": {"to_agent": SINK, "message": f"mcp {k}"}}})
            try:
                for _ in range(1 if last else self.inflight):
                    call()
            except BrokenPipeError:
                pass
            at = answered = 0
            deadline, kill_at = time.monotonic() + self.timeout, None
            while True:
                if not out.wait_for(at + 1, 0.02):
                    if out.done or time.monotonic() > deadline:
                        break
                else:
                    doc = json.loads(out.lines[at])
                    at += 1
                    if "method" in doc or not doc.get("id"):
                        continue   # initialize's answer, or a notice
                    answered += 1
                    result = doc.get("result") or {}
                    commit = (result.get("structuredContent") or {}).get("commit", "")
                    if result.get("isError") or "error" in doc or not is_oid(commit):
                        self._fail("mcp", f"call answered with an error: {doc}")
                        break
                    self._ack([commit])
                    if answered == 1:
                        if k:
                            self._next_done("mcp", left, started)
                        if last:
                            break
                        kill_at = time.monotonic() + self._rand(0, 0.3)
                    try:
                        call()
                    except BrokenPipeError:
                        break
                if kill_at is not None and time.monotonic() >= kill_at:
                    break
            if answered == 0:
                self._fail("mcp", "no answer from the server")
            if last:   # end of input: the server stops by itself
                p.stdin.close()
                try:
                    p.wait(self.timeout)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
                break
            left = self._killed("mcp", p)
            for line in out.finish()[at:]:   # answers written before the kill
                try:
                    doc = json.loads(line)
                except ValueError:
                    continue
                commit = ((doc.get("result") or {}).get("structuredContent") or {}).get("commit")
                if commit and is_oid(commit) and doc.get("id"):
                    self._ack([commit])
            try:
                p.stdin.close()
            except BrokenPipeError:
                pass

    # --- the whole run ----------------------------------------------------------------
    def go(self, core: int, cli: int, mcp: int, tools: int = 0) -> dict:
        start = time.monotonic()
        self.took = {}

        def timed(fn, n):
            t0 = time.monotonic()
            try:
                fn(n)
            except Exception:   # a lane that broke is a failure, not a silent stop
                import traceback
                self._fail(fn.__name__, traceback.format_exc()[-800:])
            self.took[fn.__name__] = time.monotonic() - t0
        lanes = [threading.Thread(target=timed, args=(fn, n)) for fn, n in
                 ((self.core, core), (self.cli, cli), (self.mcp, mcp), (self.tools, tools))
                 if n]
        for t in lanes:
            t.start()
        for t in lanes:
            t.join()
        return self.check(time.monotonic() - start)

    def check(self, seconds: float) -> dict:
        from gitdrop import hub as hubmod, locks
        from gitdrop.leanstore import LeanStore
        store = LeanStore(self.hub)
        seen, oid = set(), store.tip(REF)
        while oid:
            seen.add(oid)
            oid = store.reader.commit(oid).parent
        missing = sorted(set(self.acked) - seen)
        fsck = subprocess.run(["git", "--git-dir", self.hub, "fsck", "--full", "--strict",
                               "--no-dangling"], capture_output=True, text=True)
        left_locks = locks.find(self.hub)
        repair = subprocess.run([*GITDROP, "--hub", self.hub, "repair"], capture_output=True,
                                text=True)
        try:   # the room, re-checked from its first commit by the rules
            verified = f"{len(hubmod.Hub(self.hub).verify(ROOM))} commits pass the rules"
        except Exception as e:   # reported, not raised: the kill loop's checks are above
            verified = f"could not run ({type(e).__name__}: {e})"
        return {"seconds": seconds, "lanes": dict(self.took), "kills": dict(self.kills),
                "left": dict(self.left),
                "acked": len(set(self.acked)), "missing": missing, "failures": self.failures,
                "starved": self.starved,
                "survived": self.survived, "after_left": sorted(self.after_left),
                "after_other": sorted(self.after_other), "fsck": fsck.returncode,
                "fsck_out": (fsck.stdout + fsck.stderr)[-2000:], "locks_left": left_locks,
                "repair": repair.returncode, "repair_out": repair.stdout + repair.stderr,
                "commits": len(seen), "verified": verified}


def summary(s: dict) -> str:
    def spread(xs):
        if not xs:
            return "-"
        return (f"median {xs[len(xs) // 2] * 1e3:.0f} ms, max {xs[-1] * 1e3:.0f} ms "
                f"({len(xs)})")
    lanes = ", ".join(f"{lane} {n} (left the lock {s['left'].get(lane, 0)}; "
                      f"{s['lanes'].get(lane, 0):.0f} s)" for lane, n in sorted(s["kills"].items()))
    return "\n".join([
        f"kills: {sum(s['kills'].values())}: {lanes}",
        f"next write after a kill that left the lock: {spread(s['after_left'])}",
        f"next write after the other kills:           {spread(s['after_other'])}",
        f"next writes that failed: {len(s['failures'])}; that lost 20 races in a row "
        f"(exit 6, no stale lock there): {len(s['starved'])}",
        f"locks that outlived the next write: {len(s['survived'])}; lock files left at the "
        f"end: {len(s['locks_left'])}",
        f"acknowledged writes: {s['acked']}, missing from the room: {len(s['missing'])}; "
        f"commits on the room: {s['commits']}",
        f"git fsck --full: exit {s['fsck']}; gitdrop repair: exit {s['repair']}; "
        f"verify: {s['verified']}",
        f"{s['seconds']:.1f} s"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--core", type=int, default=200, help="kills of core writers")
    ap.add_argument("--cli", type=int, default=150, help="kills of CLI commands")
    ap.add_argument("--mcp", type=int, default=50, help="kills of MCP servers (stdio)")
    ap.add_argument("--tools", type=int, default=100,
                    help="kills of processes calling the MCP tools' bodies")
    ap.add_argument("--grace", type=float, default=None,
                    help="gitdrop.staleLockSeconds for the hub (default: gitdrop's, 2 s)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--pause", type=float, default=0.01,
                    help="the forked writers' longest pause between writes, seconds")
    ap.add_argument("--inflight", type=int, default=2,
                    help="calls an MCP server is sent before its answers")
    ap.add_argument("--dir", help="where the hub goes (default: under ~/.cache/gitdrop-bench)")
    a = ap.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import common
    work = a.dir or common.workdir("kill-")
    common.header("kill -9 at random moments, then the next command", work)
    hub = os.path.join(work, "hub.git")
    make_hub(hub, a.grace)
    s = Run(hub, a.seed, pause=a.pause, inflight=a.inflight).go(a.core, a.cli, a.mcp,
                                                                  a.tools)
    print(summary(s))
    for f in (s["failures"] + s["starved"])[:10]:
        print("failure:", f)
    if s["missing"]:
        print("missing:", " ".join(s["missing"][:10]))
    if s["fsck"]:
        print(s["fsck_out"])
    common.leave(work)
    return 0 if not (s["failures"] or s["missing"] or s["fsck"] or s["survived"]
                     or s["locks_left"] or s["repair"]) else 1


if __name__ == "__main__":
    sys.exit(main())
