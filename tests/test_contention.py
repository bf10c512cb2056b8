"""Writers contending for one room on a local hub: they take turns (no write fails
because others are writing), each write is its own commit checked by the rules,
a writer killed in its turn blocks nobody, and pushes landing meanwhile are
built on, not lost. Judged from the room's history."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest
import time

from gitdrop import hub as hubmod

from conftest import git

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WRITER = textwrap.dedent("""
    import sys, time
    from gitdrop import hub
    from gitdrop.errors import GitdropError
    path, me, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    room = hub.Hub(path).room("lobby")
    print("ready", flush=True)
    sys.stdin.readline()
    for k in range(n):
        try:
            room.send(me, "load/sink", f"{me} #{k}")
        except GitdropError as e:
            print(f"refused {k}: {e.rule}: {e.reason}", flush=True)
    print("done", flush=True)
""")


def _hub(tmp_path, writers):
    h = hubmod.init(str(tmp_path / "hub.git"), room="")
    h.create_room("hub/admin", "lobby", open_=True, settings={"loop_cap": 0})
    room = h.room("lobby")
    for w in writers + ["load/sink"]:
        room.register(w)
    return h


def _start(path, writers, arg, script=WRITER):
    """One process per writer running `script` (path, writer, `arg`), let go at once."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    ps = [subprocess.Popen([sys.executable, "-c", script, path, w, str(arg)], env=env,
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
          for w in writers]
    for p in ps:
        assert p.stdout.readline().strip() == "ready"
    for p in ps:          # all at once
        p.stdin.write("go\n")
        p.stdin.flush()
    return ps


def _sends(path):
    """(author, text) of every message in the room, oldest first."""
    out = git("--git-dir", path, "log", "--first-parent", "--reverse", "--format=%an%x09%b%x00",
              "refs/heads/rooms/lobby").stdout
    got = []
    for entry in out.split("\0"):
        author, _, body = entry.strip().partition("\t")
        if "#" in body and author.startswith("load/"):
            got.append((author, body.split("\n", 1)[0]))
    return got


def _in_order(sends, writer, n):
    mine = [int(text.rsplit("#", 1)[1]) for a, text in sends if a == writer]
    return mine == list(range(n))


def test_where_a_writer_cannot_sleep_on_its_slot_it_waits_for_the_turn(tmp_path):
    """Without Linux's futex (combine.CAN_SLEEP false), a writer whose write another
    turn made reads its answer when its own turn comes: every send lands once, in
    order, and some were made by another writer's turn."""
    writers = [f"load/w{i}" for i in range(4)]
    h = _hub(tmp_path, writers)
    n = 40
    no_sleep = WRITER.replace("from gitdrop import hub\n", textwrap.dedent("""
        from gitdrop import hub, combine, writequeue
        combine.CAN_SLEEP, combine._SYSCALL = False, None
        import atexit
        atexit.register(lambda: print("answered", writequeue.STATS["answered"], flush=True))
    """))
    assert no_sleep != WRITER
    ps = _start(h.store.path, writers, n, no_sleep)
    outs = [p.communicate(timeout=120)[0] for p in ps]
    assert all(p.returncode == 0 for p in ps), outs
    assert not [line for o in outs for line in o.splitlines() if line.startswith("refused")]
    assert sum(int(line.split()[1]) for o in outs for line in o.splitlines()
               if line.startswith("answered")) > 0, outs
    sends = _sends(h.store.path)
    assert len(sends) == len(writers) * n
    for w in writers:
        assert _in_order(sends, w, n), w


def test_writers_of_one_room_take_turns_and_none_is_refused(tmp_path):
    writers = [f"load/w{i}" for i in range(6)]
    h = _hub(tmp_path, writers)
    n = 60
    ps = _start(h.store.path, writers, n)
    outs = [p.communicate(timeout=120)[0] for p in ps]
    assert all(p.returncode == 0 for p in ps), outs
    refused = [line for o in outs for line in o.splitlines() if line.startswith("refused")]
    assert refused == []
    sends = _sends(h.store.path)
    assert len(sends) == len(writers) * n
    for w in writers:     # each writer's sends landed once each, in its order
        assert _in_order(sends, w, n), w
    assert hubmod.Hub(h.store.path).verify("lobby")   # every commit passes the rules again


def test_a_writer_killed_in_its_turn_blocks_nobody(tmp_path):
    writers = [f"load/w{i}" for i in range(4)]
    h = _hub(tmp_path, writers)
    n = 300
    ps = _start(h.store.path, writers, n)
    deadline = time.monotonic() + 60
    while sum(1 for a, _ in _sends(h.store.path) if a == writers[0]) < 5:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    os.kill(ps[0].pid, signal.SIGKILL)    # wherever it is: in line, in its turn, syncing
    outs = [p.communicate(timeout=120)[0] for p in ps[1:]]
    ps[0].wait()
    assert all(p.returncode == 0 for p in ps[1:]), outs
    assert not [line for o in outs for line in o.splitlines() if line.startswith("refused")]
    sends = _sends(h.store.path)
    for w in writers[1:]:
        assert _in_order(sends, w, n), w
    killed = [int(t.rsplit("#", 1)[1]) for a, t in sends if a == writers[0]]
    assert killed == list(range(len(killed))) and len(killed) < n   # a prefix, no gap
    assert hubmod.Hub(h.store.path).verify("lobby")   # every commit passes the rules again
    # and the room takes writes as before
    assert h.room("lobby").send(writers[0], "load/sink", "back")["commit"]


def test_pushes_landing_among_local_writers_are_built_on(hub, clone):
    """A push moves the ref under git's own lock, outside the writers' line: a
    local writer that lost that race builds again on the pushed commit."""
    writers = [f"load/w{i}" for i in range(3)]
    h = hub
    h.room_settings("lobby", by="hub/admin", changes={"loop_cap": 0})
    for w in writers + ["load/sink", "load/pusher"]:
        h.room("lobby").register(w)
    c = clone("load/pusher")
    n = 80
    ps = _start(h.store.path, writers, n)
    pushed = 0
    for k in range(8):
        for _ in range(20):   # a push that lost the race to a local writer pulls and goes again
            c.pull()
            c.commit(f"load/pusher #{k}", allow_empty=True)
            if c.push()[0]:
                pushed += 1
                break
    outs = [p.communicate(timeout=120)[0] for p in ps]
    assert not [line for o in outs for line in o.splitlines() if line.startswith("refused")]
    sends = _sends(h.store.path)
    for w in writers:
        assert _in_order(sends, w, n), w
    assert pushed == 8
    assert hubmod.Hub(h.store.path).verify("lobby")   # every commit passes the rules again


# --- one turn writes for every writer waiting (gitdrop.combine) ----------------

CLAIMER = textwrap.dedent("""
    import json, sys
    from gitdrop import hub, writequeue
    from gitdrop.errors import GitdropError
    path, me, tasks = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
    room = hub.Hub(path).room("lobby")
    print("ready", flush=True)
    sys.stdin.readline()
    got = {}
    for k, t in enumerate(tasks):
        room.send(me, "load/sink", f"{me} #{k}")
        try:
            got[t] = room.move_task(me, t, "claim")["commit"]
        except GitdropError as e:
            got[t] = e.rule
    print(json.dumps({"got": got, "stats": writequeue.STATS}), flush=True)
""")


def test_a_turn_writes_for_those_waiting_and_each_gets_its_own_answer(tmp_path):
    """Six processes race to claim the same tasks, sending between claims: the
    writer whose turn it is makes the others' writes too, and each process gets
    back its own answer: its commit, or the rule that refused it."""
    import json
    writers = [f"load/w{i}" for i in range(6)]
    h = _hub(tmp_path, writers)
    room = h.room("lobby")
    tasks = [room.create_task("load/sink", f"job {k}")["id"] for k in range(12)]
    ps = _start(h.store.path, writers, ",".join(tasks), CLAIMER)
    outs = {w: json.loads(p.communicate(timeout=120)[0]) for w, p in zip(writers, ps)}
    assert sum(o["stats"]["carried"] for o in outs.values()) > 0   # turns did write for others
    assert sum(o["stats"]["answered"] for o in outs.values()) == \
        sum(o["stats"]["carried"] for o in outs.values())
    for t in tasks:
        winners = [w for w in writers if len(outs[w]["got"][t]) == 40]
        assert len(winners) == 1, (t, {w: outs[w]["got"][t] for w in writers})
        assert {outs[w]["got"][t] for w in writers if w not in winners} == {"task-state-machine"}
        task = room.task(t)
        assert task["assignee"] == winners[0]
        # the commit its winner was given is the claim, by the winner
        claim = h.store.reader.commit(outs[winners[0]]["got"][t])
        assert claim.author == winners[0] and f"Gitdrop-Task: {t}" in claim.message
    sends = _sends(h.store.path)
    for w in writers:
        assert _in_order(sends, w, len(tasks)), w
    assert hubmod.Hub(h.store.path).verify("lobby")


KILLER = textwrap.dedent("""
    import os, signal, sys
    from gitdrop import combine, hub, store
    path, me, n, at = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    took = []

    def die():
        os.kill(os.getpid(), signal.SIGKILL)

    real_take, real_cas, real_done = combine.Slots.take, store.Store._cas, combine.Slots.done

    def take(self):
        got = real_take(self)
        took.append(bool(got))
        if got and at == "take":     # requests TAKEN, nothing written
            die()
        return got

    def cas(self, *a, **k):
        if took and took[-1] and at == "cas":   # answers PENDING, the ref not moved
            die()
        return real_cas(self, *a, **k)

    def done(self, *a, **k):
        if at == "done":             # the ref moved, answers still PENDING
            die()
        return real_done(self, *a, **k)
    combine.Slots.take, store.Store._cas, combine.Slots.done = take, cas, done
    room = hub.Hub(path).room("lobby")
    print("ready", flush=True)
    sys.stdin.readline()
    for k in range(n):
        room.send(me, "load/sink", f"{me} #{k}")
""")


def test_a_turn_killed_while_writing_for_others_loses_and_doubles_nothing(tmp_path):
    """The writer making others' writes is killed at each step: after taking the
    requests, after answering them but before the ref moved, after the ref moved
    but before saying so. Each waiting writer's write lands exactly once (it
    writes for itself when the answer cannot be trusted) and nobody is refused."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for at in ("take", "cas", "done"):
        # On a busy machine the others may all be done before the killer ever holds
        # the turn while one waits: then nothing was tested, and the run is made again.
        for attempt in range(4):
            writers = [f"load/w{i}" for i in range(4)]
            h = _hub(tmp_path / f"{at}{attempt}", writers + ["load/k"])
            n = 40
            ps = [subprocess.Popen([sys.executable, "-c", WRITER, h.store.path, w, str(n)],
                                   env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   text=True)
                  for w in writers]
            killer = subprocess.Popen([sys.executable, "-c", KILLER, h.store.path, "load/k",
                                       str(n * 20), at], env=env, stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True)
            for p in ps + [killer]:
                assert p.stdout.readline().strip() == "ready"
            for p in [killer] + ps:
                p.stdin.write("go\n")
                p.stdin.flush()
            outs = [p.communicate(timeout=120)[0] for p in ps]
            killer.wait(timeout=120)
            if killer.returncode == -signal.SIGKILL:
                break
        assert killer.returncode == -signal.SIGKILL, at   # it did lead, and died there
        assert not [line for o in outs for line in o.splitlines() if line.startswith("refused")]
        sends = _sends(h.store.path)
        for w in writers:
            assert _in_order(sends, w, n), (at, w)
        mine = [int(t.rsplit("#", 1)[1]) for a, t in sends if a == "load/k"]
        assert mine == list(range(len(mine))), at
        assert hubmod.Hub(h.store.path).verify("lobby")


def test_what_other_writers_wrote_reaches_the_unread_check_through_their_briefs(tmp_path):
    """Another process's messages to an agent are in the briefs the writers share,
    and the agent's next send is refused for them (unread-before-send) as when
    the commits are read from their files."""
    from gitdrop.errors import Refusal
    h = _hub(tmp_path, ["load/ann", "load/bob"])
    room = h.room("lobby")
    room.send("load/bob", "load/sink", "before")          # bob's walk is memoised here
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import sys
        from gitdrop import hub
        r = hub.Hub(sys.argv[1]).room("lobby")
        for k in range(3):
            r.send("load/ann", "load/sink", f"aside {k}")
        r.send("load/ann", "load/bob", "for you", cc="load/sink")
        r.send("load/ann", "@load", "for the team")
    """), h.store.path], env=env, check=True)
    mine = {c for c in git("--git-dir", h.store.path, "rev-list", "-5",
                           "refs/heads/rooms/lobby").stdout.split()}
    try:
        room.send("load/bob", "load/sink", "after")
        raise AssertionError("bob sent with two unread messages")
    except Refusal as e:
        assert e.rule == "unread-before-send" and "2 unread" in e.reason, e.reason
    assert mine <= set(h.store.reader.briefs)              # known from the briefs, not files


HOLDER = textwrap.dedent("""
    import sys, time
    from gitdrop import combine
    slots = combine.Slots(sys.argv[1])
    end = time.time() + float(sys.argv[2])
    seq = 0
    while time.time() < end:
        taken = slots.take()
        for t, body in taken:
            seq += 1
            slots.pending([(t, {"ok": [body.decode(), {}], "tip": "x"})])
            slots.done([t], seq)
""")


def test_an_answer_read_without_the_lock_is_never_torn(tmp_path):
    """An asker reads its DONE slot without the slots' lock while the holder may
    still be writing the slot's header: it must never see a state without the
    fields that go with it (a torn read made a writer redo a write another had
    made: a message twice). The asker here spins on its slot, as a woken writer
    does, at the moment the holder answers."""
    from gitdrop import combine
    path = str(tmp_path / "r.slots")
    slots = combine.Slots(path)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, path, "8"])
    try:
        wrong, answered, last = [], 0, 0
        end = time.time() + 15   # a busy machine answers slower: a count, not a time
        while answered < 1500 and time.time() < end:
            payload = f"request {answered}".encode()
            mine = slots.ask(payload)
            assert mine is not None
            while slots.state(mine[0]) != combine.DONE:
                pass
            got = slots.answer(mine)
            if got is None or got[1]["ok"][0] != payload.decode() or got[2] <= last:
                wrong.append(got)
            else:
                last = got[2]
            answered += 1
        assert answered > 300
        assert not wrong, f"{len(wrong)} of {answered} answers read torn: {wrong[:3]}"
    finally:
        holder.kill()
        holder.wait()


def _request(room, verb, *args):
    """The request a writer of `room` leaves in its slot for `verb`, as it would
    (made but not written: the store's write is stopped at the ask)."""
    from gitdrop import core

    class Asked(Exception):
        pass
    got = []

    def write(ref, build, agent, now=None, recipe=None, **kw):
        got.append(recipe.payload)
        raise Asked()
    room.store.write = write
    try:
        getattr(room, verb)(*args)
    except Asked:
        pass
    finally:
        del room.store.write
    return got[0], core


def test_a_request_built_before_the_turn_is_built_again_once_the_room_changed(tmp_path):
    """A writer builds its send before it asks for the turn, on the room as it
    sees it; the holder writes that while the room's files are the same, and
    otherwise calls the verb again on the room as it is (a name that has become
    ambiguous, a sender who has left: the rules of the room now)."""
    import json
    from gitdrop import errors
    h = _hub(tmp_path, ["a/ann", "a/bob"])
    room = h.room("lobby")
    store, ref = h.store, "refs/heads/rooms/lobby"
    payload, core = _request(room, "send", "a/ann", "bob", "hello bob")
    made = json.loads(payload)[5]
    assert made[1] == "a/ann" and "hello bob" in made[3]
    tip = store.tip(ref)
    build, author, _ = core._rebuild(store, ref, payload, store.view("lobby"))
    assert author == "a/ann"
    changes, message, result = build(store._view_at("lobby", tip), tip)
    assert (changes, message, result["to"]) == ({}, made[3], ["a/bob"])

    room.register("b/bob")          # "bob" now names two agents
    tip = store.tip(ref)
    with pytest.raises(errors.Ambiguous):
        build(store._view_at("lobby", tip), tip)

    payload, _ = _request(room, "send", "a/ann", "a/bob", "still there?")
    build, _, _ = core._rebuild(store, ref, payload, store.view("lobby"))
    room.deregister("a/ann", "a/ann")   # the sender has left
    tip = store.tip(ref)
    with pytest.raises(errors.NotFound):
        build(store._view_at("lobby", tip), tip)
    # Written by its holder, a request whose build fails is answered with its error
    # and leaves no commit (test_a_turn_writes_for_those_waiting_and_each_gets_its_own_answer).


def test_two_threads_of_one_process_never_get_the_same_slot(tmp_path, monkeypatch):
    """flock does not tell one process's threads apart (a worker renews its lease
    from a thread while it writes from another): two threads asking at once must
    each get a slot of their own, holding their own request."""
    import threading
    from gitdrop import combine
    slots = combine.Slots(str(tmp_path / "r.slots"))
    real = combine.Slots._states

    def slow(self):   # the other thread runs between the look and the claim
        got = real(self)
        time.sleep(0.0005)
        return got
    monkeypatch.setattr(combine.Slots, "_states", slow)
    both, shared = threading.Barrier(2), []

    def ask(k):
        for n in range(50):
            both.wait()
            mine = slots.ask(f"{k} {n}".encode())
            both.wait()
            shared.append(slots._head(mine[0])[3] == mine[1]
                          and slots._body(mine[0]) == f"{k} {n}".encode())
            both.wait()
            slots.answer(mine)   # frees it
    threads = [threading.Thread(target=ask, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(shared) == 100 and all(shared), shared.count(False)


def test_a_process_writing_to_many_rooms_keeps_the_files_of_a_few(tmp_path, monkeypatch):
    """Each room a process writes to holds 5 descriptors (its turn's lock, the slots and
    the briefs, two of them mapped); with no bound, one process writing to a few
    hundred rooms (a web board, a reaper) ran out (at 48 rooms under a limit of 256).
    Past KEEP rooms, those no write uses are closed; threads writing to rooms being
    closed and opened again around them lose nothing."""
    import random
    import threading
    from gitdrop import writequeue
    monkeypatch.setattr(writequeue, "KEEP", 4)
    h = hubmod.init(str(tmp_path / "hub.git"))
    names = [f"r{i}" for i in range(12)]
    for name in names:
        h.create_room("hub/admin", name, open_=True, settings={"loop_cap": 0})
        h.room(name).register("core/juno", ["lead"])
    fds = lambda: len(os.listdir("/proc/self/fd"))   # noqa: E731
    h.room(names[0]).send("core/juno", "core/juno", "first")
    base = fds()
    for name in names:
        h.room(name).send("core/juno", "core/juno", f"to {name}")
    assert fds() <= base + 4 * 5, (base, fds())   # was base + 55: 5 for each room

    def commits(name):
        return int(git("rev-list", "--count", f"refs/heads/rooms/{name}", cwd=h.path).stdout)
    before = {name: commits(name) for name in names}
    errors, sent = [], {name: 0 for name in names}
    lock = threading.Lock()

    def writer(seed):
        rnd = random.Random(seed)
        try:
            for _ in range(25):
                name = rnd.choice(names)
                h.room(name).send("core/juno", "core/juno", f"{seed} to {name}")
                with lock:
                    sent[name] += 1
        except Exception as e:   # a closed file under a write: "mmap closed", EBADF
            errors.append(repr(e))
    threads = [threading.Thread(target=writer, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors[:3]
    assert sum(sent.values()) == 6 * 25
    for name in names:
        assert commits(name) == before[name] + sent[name], (name, before[name], sent[name])
    assert fds() <= base + 4 * 5 + 6, (base, fds())
