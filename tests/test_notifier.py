"""The notifier with real processes: a waiter or a watcher runs as its own
process; another path (the core, a raw `git push` from a clone) writes; the
waiter wakes with the right summary, and nothing is reported twice or missed
across `git pack-refs --all` and `git gc`. A remote hub (file:// URL) is polled."""

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import pytest

from gitdrop import fmt, model
from gitdrop.notifier import TIMEOUT_EXIT, Notifier, summarize

from conftest import free_port, git

PY = sys.executable


class Proc:
    """`python -m gitdrop.notifier ...` (or the `gitdrop` command itself, with
    cli=True) with its stdout and stderr read line by line."""

    def __init__(self, *args, env=None, cli=False):
        e = dict(os.environ, **(env or {}))
        e.pop("GITDROP_AGENT", None)
        prog = [PY, "-m", "gitdrop"] if cli else [PY, "-m", "gitdrop.notifier"]
        self.p = subprocess.Popen([*prog, *args], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=e)
        self.out, self.err = queue.Queue(), queue.Queue()
        self.errors = []
        for stream, q in ((self.p.stdout, self.out), (self.p.stderr, self.err)):
            threading.Thread(target=self._pump, args=(stream, q), daemon=True).start()

    @staticmethod
    def _pump(stream, q):
        for line in stream:
            q.put((time.monotonic(), line.rstrip("\n")))
        q.put((time.monotonic(), None))

    def ready(self, text, timeout=20):
        """Wait for a line on stderr containing `text` (the mode announcement)."""
        end = time.monotonic() + timeout
        while True:
            _, line = self.err.get(timeout=max(end - time.monotonic(), 0.01))
            assert line is not None, f"exited before {text!r}: {self.errors}"
            self.errors.append(line)
            if text in line:
                return line

    def line(self, timeout=10):
        t, line = self.out.get(timeout=timeout)
        return t, line

    def finish(self, timeout=20):
        rc = self.p.wait(timeout)
        out = []
        while True:
            _, line = self.out.get(timeout=5)
            if line is None:
                break
            out.append(line)
        return rc, out

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait(5)


@pytest.fixture
def procs():
    made = []

    def make(*args, **kw):
        p = Proc(*args, **kw)
        made.append(p)
        return p
    yield make
    for p in made:
        p.kill()


def wait_args(hub, agent, *extra):
    return ("wait", "--hub", hub.path, "--room", "lobby", "--as", agent, *extra)


def hand_message(text, to):
    return fmt.format_message(text, text, [("op", "send"), ("to", to)])


def task_doc(tid, creator, state="assigned", assignee=""):
    return fmt.dumps_doc({"id": str(tid), "title": f"task {tid}", "state": state,
                          "creator": creator, "assignee": assignee}, "Do the thing.")


# --- gitdrop wait ----------------------------------------------------------------
def test_wait_returns_at_once_with_the_summary_and_marks_nothing_read(hub, team, procs):
    team.send("juno", "spartan", "first")
    team.send("juno", "spartan", "second")
    team.send("kai", "spartan", "third")  # juno leads, so kai comes last
    team.create_task("juno", "build it", assignee="spartan")
    for _ in range(2):  # peeking: the second wait sees the same
        p = procs(*wait_args(hub, "spartan", "--timeout", "30"))
        rc, out = p.finish()
        assert rc == 0
        assert out == ["gitdrop: work waiting for core/spartan in lobby: 3 unread messages "
                       "from juno, kai; task 1 assigned to you (next: gitdrop inbox)"]
    assert team.inbox("spartan", peek=True)["unread"] == 4


def test_wait_times_out_with_124_when_nothing_waits(hub, team, procs):
    team.send("juno", "spartan", "old news")
    team.inbox("spartan")
    team.send("juno", "kai", "not for spartan")
    start = time.monotonic()
    p = procs(*wait_args(hub, "spartan", "--timeout", "1"))
    rc, out = p.finish()
    assert rc == TIMEOUT_EXIT == 124
    assert out == []
    assert time.monotonic() - start >= 1
    assert any("waiting for core/spartan" in e for e in p.errors + _drain(p.err))
    p = procs(*wait_args(hub, "spartan"))  # no timeout: until interrupted
    p.ready("waiting for core/spartan")
    p.p.send_signal(signal.SIGINT)
    assert p.finish()[0] == 130


def _drain(q):
    out = []
    while True:
        try:
            _, line = q.get_nowait()
        except queue.Empty:
            return out
        if line is not None:
            out.append(line)


def test_wait_wakes_on_a_core_send_and_says_which_mode(hub, team, procs):
    p = procs(*wait_args(hub, "core/spartan", "--timeout", "30"))
    announce = p.ready("waiting for core/spartan")
    assert f"watching {hub.path} (local, inotify)" in announce
    team.send("kai", "core/juno", "not for spartan")  # does not wake it
    time.sleep(0.3)
    assert p.p.poll() is None
    team.inbox("juno")
    sent = time.monotonic()
    team.send("juno", "spartan", "wake up")
    t, line = p.line()
    assert line.endswith("in lobby: 1 unread message from juno (next: gitdrop inbox)")
    assert t - sent < 2  # inotify, not the slow safety re-read
    assert p.finish()[0] == 0


def test_wait_wakes_on_raw_git_push_message_and_task(hub, team, procs, clone):
    c = clone("core/juno")
    team.inbox("juno")
    p = procs(*wait_args(hub, "spartan", "--timeout", "30", "--json"))
    p.ready("waiting for")
    c.pull().commit(hand_message("pushed by hand", "core/spartan"), allow_empty=True)
    assert c.push()[0]
    rc, out = p.finish()
    got = json.loads(out[0])
    assert rc == 0 and len(out) == 1
    assert got["summary"] == "1 unread message from juno"
    assert got["events"][0]["text"] == "pushed by hand" and got["events"][0]["via"] == "to"

    team.inbox("spartan")
    p = procs(*wait_args(hub, "spartan", "--timeout", "30"), cli=True)  # the gitdrop command
    p.ready("waiting for")
    c.pull().write(model.task_path(7), task_doc(7, "core/juno", assignee="core/spartan"))
    c.commit("a task by hand")
    ok, err = c.push()
    assert ok, err
    rc, out = p.finish()
    assert rc == 0
    assert out[0].endswith(": task 7 assigned to you (next: gitdrop inbox)")


def test_wait_names_the_step_for_what_waits_not_the_inbox_it_already_read(hub, team, procs):
    """With the inbox read and a task left, wait kept saying "next: gitdrop inbox": an
    agent following it woke, read nothing, and was told the same again, for ever."""
    team.create_task("juno", "parser", assignee="spartan")
    team.inbox("spartan")
    p = procs(*wait_args(hub, "spartan", "--timeout", "30"), cli=True)
    rc, out = p.finish()
    assert rc == 0 and out[0].endswith(": task 1 assigned to you (next: gitdrop task show 1)")


def test_wait_for_a_lead_reports_reviews_and_handshakes(hub, team, procs):
    team.create_task("juno", "review me", assignee="spartan")
    team.move_task("spartan", 1, "start")
    team.inbox("juno")
    p = procs(*wait_args(hub, "juno", "--timeout", "30", "--json"))
    p.ready("waiting for core/juno")
    team.move_task("spartan", 1, "submit")
    rc, out = p.finish()
    got = json.loads(out[0])
    assert rc == 0 and got["reviews"] == ["1"]
    assert got["summary"] == "task 1 waiting for your review"
    team.inbox("kai")
    p = procs(*wait_args(hub, "kai", "--timeout", "30"))
    p.ready("waiting for core/kai")
    team.start_handshake("juno", "the plan", ["kai", "spartan"])
    rc, out = p.finish()
    assert rc == 0 and out[0].endswith("in lobby: handshake 1 waiting for your ack "
                                       "(next: gitdrop inbox)")


def test_wait_refuses_an_unknown_agent(hub, team, procs):
    rc, out = procs(*wait_args(hub, "nobody", "--timeout", "1")).finish()
    assert rc == 4 and out == []


# --- gitdrop watch: nothing twice, nothing missed, whatever stores the ref -------------
def test_watch_streams_each_event_once_across_pack_refs_and_gc(hub, team, procs, clone):
    c = clone("core/juno")
    p = procs("watch", "--hub", hub.path, "--room", "lobby", "--as", "spartan", "--json")
    p.ready("streaming events for core/spartan")
    expected, sent_at = [], {}
    for i in range(24):
        if i % 6 == 5:
            team.inbox("juno")
            c.pull().commit(hand_message(f"hand {i}", "core/spartan"), allow_empty=True)
            assert c.push()[0]
            oid = c.head()
        else:
            oid = team.send("juno", "spartan" if i % 2 else "@core", f"msg {i}")["commit"]
        expected.append(oid)
        sent_at[oid] = time.monotonic()
        if i % 4 == 3:
            git("pack-refs", "--all", cwd=hub.path)
        if i % 8 == 7:
            git("gc", "-q", cwd=hub.path)
            assert not os.path.exists(os.path.join(hub.path, "refs/heads/rooms/lobby"))
    got = []
    while len(got) < len(expected):
        t, line = p.line(timeout=10)
        ev = json.loads(line)
        got.append(ev["id"])
        assert t - sent_at[ev["id"]] < 3, "late: the safety re-read, not inotify, found it"
        assert ev["via"] in ("to", "team") and ev["room"] == "lobby"
    assert got == expected
    time.sleep(0.5)
    assert p.out.empty()  # nothing twice
    p.p.send_signal(signal.SIGINT)
    assert p.finish()[0] == 0


def test_watch_text_lines_through_the_command(hub, team, procs):
    p = procs("watch", "--hub", hub.path, "--room", "lobby", "--as", "kai", cli=True)
    p.ready("streaming events")
    team.send("juno", "all", "line one\nline two")
    team.create_task("juno", "a job", assignee="kai")
    assert p.line()[1].endswith(" lobby [all] juno: line one line two")
    assert p.line()[1].endswith(" lobby [notice] task 1 created and assigned to kai: a job")
    p.p.send_signal(signal.SIGINT)
    assert p.finish()[0] == 0


def test_watch_says_when_nothing_can_come_any_more(hub, team, procs, tmp_path):
    """A room archived, or the hub deleted: watch and wait went on in silence."""
    p = procs("watch", "--hub", hub.path, "--room", "lobby", "--as", "kai", cli=True)
    p.ready("streaming events")
    hub.archive_room("lobby", "hub/admin")
    assert "room lobby was archived" in p.ready("nothing can arrive from room lobby")
    hub.restore_room("lobby", "hub/admin")
    team.send("juno", "all", "back again")
    assert p.line()[1].endswith("juno: back again")
    import shutil
    shutil.move(hub.path, str(tmp_path / "elsewhere.git"))
    assert "is gone" in p.ready("nothing can arrive from room lobby")


# --- the in-process API ----------------------------------------------------------
def test_subscribe_batches_per_agent_from_a_background_thread(hub, team):
    got = {"spartan": [], "kai": []}
    threads = set()
    arrived = threading.Event()

    def cb(name):
        def f(evs):
            threads.add(threading.current_thread().name)
            got[name].append([e["text"] for e in evs])
            arrived.set()
        return f
    n = Notifier(hub.path)
    n.subscribe("lobby", "core/spartan", cb("spartan"))
    unsub_kai = n.subscribe("lobby", "core/kai", cb("kai"))
    with n:
        team.send("juno", "spartan", "one")
        _until(lambda: got["spartan"])
        team.send("juno", "@core", "two")
        _until(lambda: len(got["spartan"]) == 2 and got["kai"])
        unsub_kai()
        team.send("juno", "all", "three")
        _until(lambda: len(got["spartan"]) == 3)
        n._dirty.set()  # a spurious wake reports nothing again
        time.sleep(0.3)
    assert got["spartan"] == [["one"], ["two"], ["three"]]
    assert got["kai"] == [["two"]]
    assert threads and threading.main_thread().name not in threads


def test_a_batch_holds_everything_since_the_last_delivery(hub, team):
    batches = []
    n = Notifier(hub.path)
    n.subscribe("lobby", "core/spartan", batches.append)
    for i in range(5):  # lands before start(): one scan, one batch, in order
        team.send("juno", "spartan", f"m{i}")
    n.scan()
    assert [[e["text"] for e in b] for b in batches] == [["m0", "m1", "m2", "m3", "m4"]]
    assert n.scan() == 0


def test_rooms_are_separate_and_a_failing_callback_harms_no_one(hub, team):
    hub.create_room("hub/admin", "ops", open_=True)
    ops = hub.room("ops")
    ops.register("core/juno", ["lead"])
    ops.register("core/spartan", ["coder"])
    seen, calls = [], []

    def broken(evs):
        calls.append(len(evs))
        raise RuntimeError("subscriber bug")
    n = Notifier(hub.path)
    n.subscribe("lobby", "core/spartan", broken)
    n.subscribe("lobby", "core/spartan", lambda evs: seen.extend(("lobby", e["text"]) for e in evs))
    n.subscribe("ops", "core/spartan", lambda evs: seen.extend(("ops", e["text"]) for e in evs))
    with n:
        team.send("juno", "spartan", "a")
        _until(lambda: len(seen) == 1)
        ops.send("juno", "spartan", "b")
        _until(lambda: len(seen) == 2)
        team.send("juno", "spartan", "c")
        _until(lambda: len(seen) == 3)
    assert seen == [("lobby", "a"), ("ops", "b"), ("lobby", "c")]
    assert calls == [1, 1]


def _until(cond, timeout=10):
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def test_summarize_words():
    w = {"unread": [{"op": "send", "from": "a/juno"}, {"op": "send", "from": "b/spartan"},
                    {"op": "send", "from": "a/juno"},
                    {"op": "task-create", "task": "12", "subject": "task 12 created"},
                    {"op": "task-approve", "task": "3", "subject": "task 3 review → completed"}],
         "tasks": ["12", "14"], "reviews": [], "handshakes": []}
    assert summarize(w) == ("3 unread messages from juno, spartan; notice: task 3 review → "
                            "completed; tasks 12, 14 assigned to you")


# --- a remote hub: followed over git itself ------------------------------------------
def test_remote_hub_is_polled_and_wakes_the_waiter(hub, team, procs, tmp_path):
    url = "file://" + hub.path
    env = {"GITDROP_CACHE": str(tmp_path / "cache")}
    p = procs("wait", "--hub", url, "--room", "lobby", "--as", "spartan", "--timeout", "30",
              env=env)
    announce = p.ready("waiting for core/spartan")
    assert f"polling {url} (remote, ls-remote every 0.2–5 s, mirror {tmp_path}" in announce
    time.sleep(0.5)
    team.send("juno", "spartan", "over the wire")
    rc, out = p.finish()
    assert rc == 0 and out[0].endswith(": 1 unread message from juno (next: gitdrop inbox)")
    # the same cache again, with the message already fetched: returns at once
    rc, out = procs("wait", "--hub", url, "--room", "lobby", "--as", "spartan", "--timeout", "0",
                    env=env).finish()
    assert rc == 0 and "1 unread message from juno" in out[0]


@pytest.fixture
def daemon_url(hub):
    """The hub served by `git daemon` on 127.0.0.1 (pushes run the hook)."""
    port = free_port()
    base = os.path.dirname(hub.path)
    d = subprocess.Popen(["git", "daemon", "--reuseaddr", "--listen=127.0.0.1",
                          f"--port={port}", f"--base-path={base}", "--export-all",
                          "--enable=receive-pack", base], stderr=subprocess.DEVNULL)
    url = f"git://127.0.0.1:{port}/{os.path.basename(hub.path)}"
    _until(lambda: git("ls-remote", url, check=False).returncode == 0)
    yield url
    d.terminate()
    d.wait(5)


def test_remote_wait_over_git_daemon_wakes_on_a_write_from_another_machine(
        hub, team, procs, daemon_url, tmp_path):
    from gitdrop.transports.remote import RemoteHub
    p = procs("wait", "--hub", daemon_url, "--room", "lobby", "--as", "spartan", "--timeout",
              "30", env={"GITDROP_CACHE": str(tmp_path / "waiter")}, cli=True)
    assert f"polling {daemon_url} (remote" in p.ready("waiting for core/spartan")
    other = RemoteHub(daemon_url, cache=str(tmp_path / "sender"))
    other.room("lobby").send("juno", "spartan", "from afar")  # pushed through the hook
    rc, out = p.finish()
    assert rc == 0 and out[0].endswith(": 1 unread message from juno (next: gitdrop inbox)")


def test_remote_watch_reports_each_push_once(hub, team, tmp_path, monkeypatch):
    monkeypatch.setenv("GITDROP_CACHE", str(tmp_path / "cache"))
    n = Notifier("file://" + hub.path, poll=(0.05, 0.2))
    batches = []
    n.subscribe("lobby", "core/spartan", batches.append)
    assert n.remote and "remote" in n.describe()
    with n:
        for i in range(4):
            team.send("juno", "spartan", f"r{i}")
            time.sleep(0.15 if i % 2 else 0)
        git("pack-refs", "--all", cwd=hub.path)
        _until(lambda: sum(len(b) for b in batches) >= 4)
        time.sleep(0.5)
    assert [e["text"] for b in batches for e in b] == ["r0", "r1", "r2", "r3"]


def test_unreachable_remote_is_a_clear_error(procs, tmp_path):
    p = procs("wait", "--hub", "file://" + str(tmp_path / "nope.git"), "--as", "x/y",
              "--timeout", "1", env={"GITDROP_CACHE": str(tmp_path / "cache")})
    rc, out = p.finish()
    assert rc == 7 and out == []  # the `unreachable` error of gitdrop.transports.remote
    assert any("cannot fetch from file://" in e for e in _drain(p.err))


# --- the Claude Code Stop hook (templates/claude-code) -----------------------------------
HOOK = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    "templates", "claude-code", "gitdrop-stop-hook.py")


def run_hook(hub, tmp_path, idle, session="s1", **kw):
    env = dict(os.environ, GITDROP_BIN=f"{PY} -m gitdrop", GITDROP_HUB=hub.path,
               GITDROP_AGENT="core/spartan", GITDROP_IDLE=str(idle), TMPDIR=str(tmp_path))
    return subprocess.Popen([PY, HOOK], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, **kw), \
        json.dumps({"session_id": session, "hook_event_name": "Stop", "stop_hook_active": True})


def test_stop_hook_lets_an_idle_worker_stop_and_keeps_a_busy_one(hub, team, tmp_path):
    p, stdin = run_hook(hub, tmp_path, 1)
    out, err = p.communicate(stdin, timeout=30)
    assert p.returncode == 0 and out == ""  # idle: Claude may stop

    p, stdin = run_hook(hub, tmp_path, 30)
    p.stdin.write(stdin)
    p.stdin.close()
    time.sleep(1.5)
    assert p.poll() is None  # waiting for work
    team.send("juno", "spartan", "are you there?")
    out = p.stdout.read()
    assert p.wait(30) == 0
    got = json.loads(out)
    assert got["decision"] == "block"
    assert "1 unread message from juno" in got["reason"] and "gitdrop inbox" in got["reason"]

    # the worker does not act on it: the same work comes back; after 3 times, let it stop
    outs = []
    for _ in range(3):
        p, stdin = run_hook(hub, tmp_path, 30)
        outs.append(p.communicate(stdin, timeout=30))
    assert [bool(o) for o, _ in outs] == [True, True, False]
    assert "nothing moves" in outs[-1][1]
    team.inbox("spartan")  # acting on it resets the count
    team.send("juno", "spartan", "next")
    p, stdin = run_hook(hub, tmp_path, 30)
    assert json.loads(p.communicate(stdin, timeout=30)[0])["decision"] == "block"


def test_a_hub_without_rooms_is_watched_from_its_first_room_on(tmp_path):
    """The rooms' ref folder does not exist until the first room: the watch starts on
    refs/heads and follows it once it appears; inotify, not the 10 s safety re-read,
    delivers (scans are counted); an archived room's ref leaving wakes no one."""
    from gitdrop import hub as hubmod
    h = hubmod.init(str(tmp_path / "hub.git"), room="")
    assert not os.path.isdir(os.path.join(h.store.path, "refs", "heads", "rooms"))
    got = []
    n = Notifier(h.store.path)
    n.subscribe("fresh", "core/kai", got.extend)
    with n:
        time.sleep(0.2)
        h.create_room("hub/admin", "fresh", open_=True)
        room = h.room("fresh")
        room.register("core/juno", ["lead"])
        room.register("core/kai")
        t0 = time.monotonic()
        room.send("core/juno", "kai", "first words")
        _until(lambda: got)
        assert time.monotonic() - t0 < 2
        assert [e["text"] for e in got] == ["first words"]
        scans = n.scans
        room.send("core/juno", "kai", "again")
        _until(lambda: len(got) == 2)
        assert n.scans - scans <= 2          # one ref move, one wake (not five)
        h.archive_room("fresh", "hub/admin")
        time.sleep(0.3)
    assert [e["text"] for e in got] == ["first words", "again"]


def test_on_an_event_loop_the_loop_reads_and_scans(tmp_path):
    """start(loop): the inotify descriptor is read by the asyncio loop (the MCP
    server's), so scans and callbacks run on the loop's thread, after whatever the
    loop was doing; the first room is followed; one ref move is one scan; stop()
    closes the descriptor."""
    import asyncio
    from gitdrop import hub as hubmod
    h = hubmod.init(str(tmp_path / "hub.git"), room="")
    got, threads = [], set()

    def landed(evs):
        threads.add(threading.get_ident())
        got.extend(evs)

    async def main():
        n = Notifier(h.store.path)
        n.subscribe("fresh", "core/kai", landed)
        n.start(asyncio.get_running_loop())
        fd = n._observer.fd

        def writes():
            h.create_room("hub/admin", "fresh", open_=True)
            room = h.room("fresh")
            room.register("core/juno", ["lead"])
            room.register("core/kai")
            room.send("core/juno", "kai", "first words")
            return room
        try:
            room = await asyncio.to_thread(writes)
            for _ in range(200):
                if got:
                    break
                await asyncio.sleep(0.01)
            assert [e["text"] for e in got] == ["first words"]
            scans = n.scans
            await asyncio.to_thread(room.send, "core/juno", "kai", "again")
            for _ in range(200):
                if len(got) == 2:
                    break
                await asyncio.sleep(0.01)
            assert [e["text"] for e in got] == ["first words", "again"]
            assert n.scans - scans == 1           # one ref move, one scan
        finally:
            n.stop()
        with pytest.raises(OSError):
            os.fstat(fd)
        return threading.get_ident()
    loop_thread = asyncio.run(main())
    assert threads == {loop_thread}


def test_each_watcher_gets_what_concerns_it_and_nothing_else(hub, team):
    """Many watchers of one room: every one is handed exactly the events that
    concern it (events.concerns, asked of each commit for each watcher), in
    order, though the notifier asks only those a commit names; watchers that
    last saw different tips each get theirs."""
    from gitdrop import events
    from gitdrop.view import first_parent_walk
    room = team
    for a in ("ops/ann", "ops/bo", "qa/cy", "qa/dee"):
        room.register(a, ["lead"] if a == "ops/ann" else ["coder"],
                      caps=["python"] if a in ("qa/cy", "ops/bo") else None)
    everyone = ["core/juno", "core/spartan", "core/kai", "ops/ann", "ops/bo", "qa/cy",
                "qa/dee"]
    n = Notifier(hub.path)
    got = {}

    def watch(agent, every=False):
        key = (agent, every)
        got[key] = []
        n.subscribe("lobby", agent, lambda evs: got[key].extend(
            (e["id"], e["via"]) for e in evs), every=every)
    for a in everyone[:4]:
        watch(a)
    watch("qa/dee", every=True)

    def say(sender, to, text, **kw):
        room.inbox(sender)   # unread-before-send
        room.send(sender, to, text, **kw)
    base_early = hub.store.tip("refs/heads/rooms/lobby")
    say("core/kai", "core/spartan", "direct", cc=["ops/bo"])
    say("ops/bo", "@core", "to a team")
    for a in everyone[4:]:
        watch(a)             # these last saw a later tip
    base_late = hub.store.tip("refs/heads/rooms/lobby")
    say("qa/cy", "all", "to everyone")
    say("core/spartan", "qa/dee", "to one of qa", cc=["qa/cy"])
    room.create_task("core/juno", "for someone able", requires=["python"])
    room.create_task("core/juno", "for kai", assignee="core/kai")
    say("ops/ann", "ops/bo", "lead to one")
    n.scan()
    tip = hub.store.tip("refs/heads/rooms/lobby")
    view, reader = hub.store.view("lobby"), hub.store.reader

    def expected(agent, since, every=False):
        out, commits = [], []
        for c in first_parent_walk(reader, tip):
            if c.oid == since:
                break
            commits.append(c)
        for c in reversed(commits):
            if c.author == agent:
                continue
            me = view.agent(agent)
            how = "room" if every else events.concerns(
                events.event(reader, c), agent, view.is_lead(agent), me["caps"])
            if how:
                out.append((c.oid, how))
        return out
    for (agent, every), evs in got.items():
        since = base_early if agent in everyone[:4] or every else base_late
        assert evs == expected(agent, since, every), agent
    # the cases are all there: a copy to a lead, a team, all, cc, a notice by caps
    hows = {how for evs in got.values() for _, how in evs}
    assert {"to", "cc", "team", "all", "lead", "notice", "room"} <= hows, hows
    assert n.scan() == 0


def test_a_subscriber_far_behind_the_tip_loses_no_event(hub, team):
    """Past 1,000 commits between two scans (one push of them, an import, a watcher
    stopped a while) the notifier took the base for rewritten history and delivered
    only the newest 1,000: a message before them was lost for good. A base the tip
    has moved on from is walked back to, however far (to 50,000)."""
    import test_work_trust
    got = []
    n = Notifier(hub.path)
    n.subscribe("lobby", "core/spartan", lambda evs: got.extend(evs))
    team.send("core/kai", "core/spartan", "URGENT: the build is broken")
    test_work_trust._filler(hub, 1500, int(time.time()))   # then 1,500 others at once
    n.scan()
    assert [e["text"] for e in got if e["op"] == "send"] == ["URGENT: the build is broken"]


def test_a_ref_moved_back_announces_nothing_again(hub, team):
    """A room restored from a backup (its ref moved back to an older commit): the
    walk from the new tip never met the watcher's base, so up to 1,000 old events
    were delivered again as new, and an agent could act on them twice."""
    got = []
    n = Notifier(hub.path)
    n.subscribe("lobby", "core/spartan", lambda evs: got.extend(evs))
    for i in range(3):
        team.send("core/kai", "core/spartan", f"old {i}")
    n.scan()
    assert [e["text"] for e in got if e["op"] == "send"] == ["old 0", "old 1", "old 2"]
    ref = hub.store.room_ref("lobby")
    back = hub.store.reader.commit(hub.store.tip(ref)).parent
    git("update-ref", ref, back, cwd=hub.path)
    got.clear()
    n.scan()
    assert got == []
    team.send("core/kai", "core/spartan", "new after the restore")   # and it goes on
    n.scan()
    assert [e["text"] for e in got if e["op"] == "send"] == ["new after the restore"]


def test_what_a_watcher_keeps_of_the_events_it_worked_out_is_bounded(hub, team, monkeypatch):
    """Every event worked out was kept, message text and all, up to 50,000: a watcher
    of a room flooded with 16 KB messages (as the loop guard allows) held 1.2 GB."""
    from gitdrop import events
    from gitdrop.notifier import first_parent_walk
    monkeypatch.setattr(events, "MEMO_BYTES", 256 << 10)
    monkeypatch.setattr(events, "_MEMO", {})
    monkeypatch.setattr(events, "_KEPT", [0])
    big = "x" * 15000
    for i in range(60):   # 900 KB of text
        team.send("core/kai", "core/spartan", f"{i} {big}")
    walked = list(first_parent_walk(hub.store.reader, hub.store.room_tip("lobby")))
    for c in walked:
        assert events.event(hub.store.reader, c)["id"] == c.oid
    kept = sum(len(e["text"] or "") for e in events._MEMO.values())
    assert 0 < kept <= 256 << 10 and len(events._MEMO) < len(walked), kept


NO_DESCRIPTORS = r"""
import json, os, resource, sys, time
from gitdrop import hub as hubmod
from gitdrop.notifier import Notifier
path = sys.argv[1]
got = []
n = Notifier(path)
n.subscribe("lobby", "core/spartan", lambda evs: got.extend(evs))
n.scan()
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
top = max(int(x) for x in os.listdir("/proc/self/fd"))
resource.setrlimit(resource.RLIMIT_NOFILE, (top + 1, hard))
fill = []
try:   # every descriptor taken: inotify_init and pipe() fail with EMFILE, as at the
    while True:   # limit of inotify instances
        fill.append(os.open("/dev/null", os.O_RDONLY))
except OSError:
    pass
try:
    n.start()
finally:
    for fd in fill:
        os.close(fd)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
hubmod.Hub(path).room("lobby").send("core/kai", "core/spartan", "found by looking")
end = time.monotonic() + 20
while not got and time.monotonic() < end:
    time.sleep(0.05)
n.stop()
print(json.dumps([e.get("text") for e in got if e["op"] == "send"]))
"""


def test_without_an_inotify_watch_the_notifier_looks_instead(hub, team):
    """No inotify instance to be had (128 per user by default: every wait, watch,
    autorespond and serve takes one) or no descriptor: wait, watch and autorespond
    died with a traceback. The notifier says so once and looks at the refs instead."""
    p = subprocess.run([sys.executable, "-c", NO_DESCRIPTORS, hub.path], capture_output=True,
                       text=True, timeout=60, cwd=os.path.dirname(os.path.dirname(
                           os.path.abspath(__file__))))
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == ["found by looking"]
    assert "cannot watch" in p.stderr and "looking every" in p.stderr, p.stderr
