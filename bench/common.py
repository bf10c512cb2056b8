"""Helpers shared by the benchmarks: timing and statistics, the command line
that produced a figure, the machine it ran on, a room with a long history
built fast, and the SQLite baseline measured beside gitdrop in the same run.
"""

import math
import os
import platform
import shlex
import sqlite3
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from gitdrop import fmt, hub, model  # noqa: E402
from gitdrop.view import render_file  # noqa: E402

ROOM = "bench"
SENDER, READER = "bench/alice", "bench/bob"
TALKERS = [f"filler/talker{i}" for i in range(4)]
SINKS = [f"filler/sink{i}" for i in range(4)]


# --- where ------------------------------------------------------------------------

BENCH_HOME = os.path.join(os.path.expanduser("~"), ".cache", "gitdrop-bench")


def workdir(prefix: str) -> str:
    """A fresh directory under ~/.cache/gitdrop-bench: the filesystem of the
    default hub (~/.gitdrop), not /tmp, which is tmpfs on many systems (no
    durability to measure)."""
    import tempfile
    os.makedirs(BENCH_HOME, exist_ok=True)
    if not _MINE:
        kept = subprocess.run(["du", "-sh", BENCH_HOME], capture_output=True,
                              text=True).stdout.split("\t")[0]
        print(f"({kept or '?'} of earlier runs' files in {BENCH_HOME}: benchmarks do not "
              "remove them, see bench/README.md)")
    work = tempfile.mkdtemp(prefix=prefix, dir=BENCH_HOME)
    _MINE.append(work)
    settle(work)
    return work


_MINE: list = []


def leave(path: str) -> None:
    """The end of a run: its work directory stays. Removing thousands of files
    would slow file creation in their block groups for minutes (see settle), and
    the next run would measure that."""
    if path in _MINE:
        print(f"(work files left in {path})")


def settle(directory: str, most: float = 420.0) -> None:
    """Wait (up to `most` seconds) until creating a file in `directory` costs what
    it costs on a quiet disk: after a bulk removal on its block group (an earlier
    run's clean-up) it costs 20-40x more for one to six minutes (see
    creation_cost), and a benchmark would measure that instead of gitdrop. The
    hubs' own directories may sit in other block groups: the figure printed at the
    end of a run is the check."""
    start, quiet = time.monotonic(), 0
    while quiet < 2 and time.monotonic() - start < most:
        cost = creation_cost(directory)
        quiet = quiet + 1 if cost < 0.0001 else 0
        if not quiet:
            print(f"(file creation here costs {cost * 1e3:.2f} ms, ext4 skipping recently "
                  "freed inodes: waiting for it to pass)", flush=True)
            time.sleep(15)


def creation_cost(directory: str, dirs: int = 8, n: int = 12) -> float:
    """Seconds per file created now, in the worst of `dirs` new subdirectories of
    `directory` (a hub's object directories are new subdirectories too, and ext4
    may put each in another block group). The files are kept: removing them would
    itself slow the next creations. On ext4 without a journal the kernel skips,
    when it allocates an inode, every inode of the block group freed more than a
    second and less than one to six minutes ago (recently_deleted() in
    fs/ext4/ialloc.c): after a bulk removal (an earlier run's files, a test
    suite's temporary ones) each file created in that group costs up to 1.3 ms of
    kernel CPU instead of 0.03 ms. gitdrop creates files on every write (loose
    objects, the ref's lock) and SQLite does not, so runs print this figure to say
    which kind of moment they measured."""
    worst = 0.0
    for k in range(dirs):
        d = os.path.join(directory, f".creation-probe-{time.time_ns()}-{k}")
        os.mkdir(d)
        t = time.perf_counter()
        for i in range(n):
            os.close(os.open(os.path.join(d, str(i)), os.O_CREAT | os.O_EXCL | os.O_WRONLY,
                             0o444))
        worst = max(worst, (time.perf_counter() - t) / n)
    return worst


def creation_note(directory: str) -> str:
    cost = creation_cost(directory)
    slow = "  (slow: a recent bulk removal on this block group, see bench/README.md)" \
        if cost > 0.0001 else ""
    return f"file creation in the work directory now (worst of 8 new directories): " \
        f"{cost * 1e3:.3f} ms{slow}"


# --- numbers --------------------------------------------------------------------

def percentile(xs, q: float) -> float:
    """Nearest-rank percentile of a list of numbers."""
    s = sorted(xs)
    return s[max(0, min(len(s) - 1, math.ceil(q * len(s)) - 1))]


def median(xs) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def ms(x: float) -> str:
    return f"{x * 1e3:8.3f}"


def ratio(a: float, b: float) -> str:
    return f"{a / b:6.2f}x" if b else "     -"


class Timer:
    """Samples per label, in seconds."""

    def __init__(self):
        self.samples: dict[str, list[float]] = {}

    def add(self, label: str, seconds: float) -> None:
        self.samples.setdefault(label, []).append(seconds)

    def time(self, label: str, fn, *a, **kw):
        t = time.perf_counter()
        out = fn(*a, **kw)
        self.add(label, time.perf_counter() - t)
        return out

    def med(self, label: str) -> float:
        return median(self.samples[label])

    def p99(self, label: str) -> float:
        return percentile(self.samples[label], 0.99)

    def n(self, label: str) -> int:
        return len(self.samples[label])


# --- where and how -----------------------------------------------------------

def command() -> str:
    """The exact command line that is running, to print beside its figures."""
    script = os.path.relpath(sys.argv[0], ROOT) if os.path.isabs(sys.argv[0]) else sys.argv[0]
    return shlex.join([sys.executable, script] + sys.argv[1:])


def fs_type(path: str) -> str:
    best, kind = "", "?"
    try:
        with open("/proc/mounts") as f:
            for line in f:
                dev, mnt, typ = line.split()[:3]
                if (path + "/").startswith(mnt.rstrip("/") + "/") and len(mnt) >= len(best):
                    best, kind = mnt, f"{typ} on {dev} ({mnt})"
    except OSError:
        pass
    return kind


def environment(workdir: str) -> str:
    import pygit2
    git = subprocess.run(["git", "--version"], capture_output=True, text=True).stdout.strip()
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return (f"python {platform.python_version()}, pygit2 {pygit2.__version__} "
            f"(libgit2 {pygit2.LIBGIT2_VERSION}), {git}, sqlite {sqlite3.sqlite_version}, "
            f"{os.cpu_count()} cpu, load {load}, {fs_type(workdir)}")


def begin(given: str, prefix: str, title: str) -> str:
    """A run's work directory (`--dir`, made if need be, or a fresh one) after its
    header is printed."""
    work = given or workdir(prefix)
    os.makedirs(work, exist_ok=True)
    header(title, work)
    return work


def header(title: str, workdir: str) -> None:
    print(f"# {title}")
    print(f"command: {command()}")
    print(f"machine: {environment(workdir)}")
    print(f"started: {time.strftime('%Y-%m-%d %H:%M:%S')}")


# --- a room with history --------------------------------------------------------

def make_room(path: str, history: int, fsync: bool = True, tasks: int = 8) -> "hub.Hub":
    """A hub with room `bench` (loop_cap = 0), two benchmark agents, filler agents,
    a few tasks for bench/bob, then `history` message commits (filler talkers to
    filler sinks) and read commits that put both benchmark agents' cursors at the
    tip, as agents who keep up with their inbox would have."""
    h = hub.init(path, room="", fsync=fsync)
    # loop_cap = 0: the benchmark sends thousands of messages from one agent,
    # which the default loop guard (60 per 60 s) would refuse.
    h.create_room("hub/admin", ROOM, open_=True, settings={"loop_cap": 0})
    r = h.room(ROOM)
    for a in [SENDER, READER] + TALKERS + SINKS:
        r.register(a)
    for i in range(tasks):
        r.create_task(SENDER, f"benchmark task {i + 1}", body="Move me around.",
                      assignee=READER)
    if history:
        fast_history(h, history)
    for a in (SENDER, READER):
        move_cursor_to_tip(h, a)
    return h


def fast_history(h: "hub.Hub", n: int) -> None:
    """Append `n` send commits in the on-repo format (each reuses its parent's
    tree, as a message does) with one `git fast-import`, then move the room ref
    once with CAS. Talkers write to sinks, so nobody's unread count matters."""
    store = h.store
    ref = store.room_ref(ROOM)
    tip = store.tip(ref)
    now = int(time.time())
    start = now - n  # one message a second, ending now
    chunks = []
    for i in range(n):
        a, b = TALKERS[i % 4], SINKS[(i // 4) % 4]
        text = f"filler message {i}"
        msg = fmt.format_message(f"{model.short(a)} → {model.short(b)}: {text}", text,
                                 [("op", "send"), ("to", b)]).encode()
        team, name = model.split_agent(a)
        who = f"{a} <{name}@{team}.gitdrop> {start + i} +0000\n".encode()
        chunks.append(b"commit %s\nauthor %scommitter %sdata %d\n%s\n"
                      % (ref.encode() + b".build", who, who, len(msg), msg))
        if i == 0:
            chunks.append(b"from %s\n" % tip.encode())
    chunks.append(b"done\n")
    p = subprocess.run(["git", "--git-dir", store.path, "fast-import", "--quiet", "--done"],
                       input=b"".join(chunks), capture_output=True)
    if p.returncode:
        raise RuntimeError(p.stderr.decode())
    built = store.tip(ref + ".build")
    if not store._cas(ref, tip, built, "benchmark history"):
        raise RuntimeError("the room moved while its history was built")
    store.delete_ref(ref + ".build")


def move_cursor_to_tip(h: "hub.Hub", agent: str) -> None:
    """A read commit that moves `agent`'s cursor to the room tip, through the
    rules (the core's inbox writes nothing when nothing concerns the agent)."""
    def build(view, tip):
        doc = dict(view.agent(agent), cursor=tip)
        return ({model.agent_path(agent): render_file("agent", doc)},
                fmt.format_message(f"{model.short(agent)} caught up", "", [("op", "read")]),
                {})
    h.store.write(h.store.room_ref(ROOM), build, agent)


# --- the SQLite baseline ---------------------------------------------------------

class SqliteRoom:
    """The same messages, inbox and task moves in SQLite (WAL), as the systems
    gitdrop replaces keep them: a row per message, a cursor per agent, a row per
    task moved with a compare-and-set on its state. One transaction per call."""

    def __init__(self, path: str, history: int, tasks: int = 8):
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.executescript("""
            CREATE TABLE IF NOT EXISTS messages (id INTEGER PRIMARY KEY, sender TEXT,
                recipient TEXT, body TEXT, ts INTEGER);
            CREATE INDEX IF NOT EXISTS inbox ON messages (recipient, id);
            CREATE TABLE IF NOT EXISTS cursors (agent TEXT PRIMARY KEY, last INTEGER);
            CREATE TABLE IF NOT EXISTS tasks (id INTEGER PRIMARY KEY, title TEXT,
                state TEXT, assignee TEXT, note TEXT, updated INTEGER);
        """)
        self.durable(True)
        db, now = self.db, int(time.time())
        db.execute("BEGIN")
        db.executemany("INSERT INTO messages (sender, recipient, body, ts) VALUES (?,?,?,?)",
                       ((TALKERS[i % 4], SINKS[(i // 4) % 4], f"filler message {i}",
                         now - history + i) for i in range(history)))
        last = db.execute("SELECT coalesce(max(id), 0) FROM messages").fetchone()[0]
        db.executemany("INSERT INTO cursors VALUES (?, ?)", ((SENDER, last), (READER, last)))
        db.executemany("INSERT INTO tasks VALUES (?,?,?,?,?,?)",
                       ((i + 1, f"benchmark task {i + 1}", "assigned", READER, "", now)
                        for i in range(tasks)))
        db.execute("COMMIT")
        # Steady state: a WAL that has grown once is rewritten in place, so its
        # fsync commits no file-size change. Grow it now (4 MB), as any SQLite
        # that has been running a while has, and checkpoint: the baseline is then
        # the same whatever the history size (a fresh WAL made the empty
        # database's inserts ~2x slower than the 100k one's).
        db.execute("CREATE TABLE warm (x BLOB)")
        db.execute("BEGIN")
        db.execute("INSERT INTO warm VALUES (zeroblob(4194304))")
        db.execute("COMMIT")
        db.execute("DROP TABLE warm")
        db.execute("PRAGMA wal_checkpoint(PASSIVE)")

    def durable(self, on: bool) -> None:
        self.db.execute(f"PRAGMA synchronous={'FULL' if on else 'OFF'}")

    def send(self, sender: str, recipient: str, text: str) -> None:
        db = self.db
        db.execute("BEGIN")
        db.execute("INSERT INTO messages (sender, recipient, body, ts) VALUES (?,?,?,?)",
                   (sender, recipient, text, int(time.time())))
        db.execute("COMMIT")

    def inbox(self, agent: str, limit: int = 20) -> list:
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        last = db.execute("SELECT last FROM cursors WHERE agent = ?", (agent,)).fetchone()[0]
        rows = db.execute("SELECT id, sender, body, ts FROM messages WHERE recipient = ? "
                          "AND id > ? ORDER BY id LIMIT ?", (agent, last, limit)).fetchall()
        if rows:
            db.execute("UPDATE cursors SET last = ? WHERE agent = ?", (rows[-1][0], agent))
        db.execute("COMMIT")
        return rows

    def move(self, task: int, frm: str, to: str, note: str) -> bool:
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        n = db.execute("UPDATE tasks SET state = ?, note = ?, updated = ? WHERE id = ? "
                       "AND state = ?", (to, note, int(time.time()), task, frm)).rowcount
        db.execute("COMMIT")
        return n == 1
