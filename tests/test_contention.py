"""Writers contending for one room on a local hub: they take turns (no write fails
because others are writing), each write is its own commit checked by the rules,
a writer killed in its turn blocks nobody, and pushes landing meanwhile are
built on, not lost. Judged from the room's history."""

import os
import signal
import subprocess
import sys
import textwrap
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


def _start(path, writers, n):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    ps = [subprocess.Popen([sys.executable, "-c", WRITER, path, w, str(n)], env=env,
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
