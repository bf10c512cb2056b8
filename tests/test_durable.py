"""gitdrop.durable writes what libgit2 would write, moves refs with a real
compare-and-swap against git's own lock protocol, and Store's group commit
(write_many) makes one validated commit per operation and moves the ref once."""

import os
import subprocess
import sys
import textwrap

import pygit2
import pytest

from gitdrop import durable, hub as hubmod, locks
from gitdrop.errors import Refusal
from gitdrop.store import Store

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _fsck(path):
    p = subprocess.run(["git", "--git-dir", str(path), "fsck", "--strict", "--no-dangling"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def _hub(path, method, clock=None):
    h = hubmod.init(str(path), room="", fsync=True)
    h.store.repo.config["gitdrop.fsyncMethod"] = method
    h = hubmod.Hub(str(path), clock=clock)
    assert h.store.method == method
    return h


@pytest.mark.parametrize("method", ["wal", "fsync", "none"])
def test_writer_objects_match_libgit2(tmp_path, method):
    a = pygit2.init_repository(str(tmp_path / "a"), bare=True)
    pygit2.init_repository(str(tmp_path / "b"), bare=True)
    w = durable.Writer(str(tmp_path / "b"), method)
    for data in (b"", b"hello\n", "é → ü\n".encode()):
        assert w.blob(data) == str(a.create_blob(data))
    blob = str(a.create_blob(b"x"))
    assert w.blob(b"x") == blob
    tb = a.TreeBuilder()
    tb.insert("1.md", blob, pygit2.GIT_FILEMODE_BLOB)
    sub = str(tb.write())
    assert w.tree([("1.md", pygit2.GIT_FILEMODE_BLOB, blob)]) == sub
    names = ["tasks", "tasks.md", "room.toml", "a-b", "a", "agents", "a.b"]
    dirs = {"tasks", "a", "agents"}
    tb = a.TreeBuilder()
    entries = []
    for n in names:
        mode = pygit2.GIT_FILEMODE_TREE if n in dirs else pygit2.GIT_FILEMODE_BLOB
        tb.insert(n, sub if n in dirs else blob, mode)
        entries.append((n, mode, sub if n in dirs else blob))
    root = str(tb.write())
    assert w.tree(entries) == root
    assert w.tree([]) == str(a.TreeBuilder().write())
    sig = pygit2.Signature("team/jo", "jo@team.gitdrop", 1700000000, 0)
    msg = "jo → al: é\n\nbody\n\nGitdrop-Op: send\nGitdrop-To: team/al\n"
    c1 = str(a.create_commit(None, sig, sig, msg, pygit2.Oid(hex=root), []))
    assert w.commit(root, [], sig.name, sig.email, 1700000000, msg) == c1
    c2 = str(a.create_commit(None, sig, sig, "no newline", pygit2.Oid(hex=root),
                             [pygit2.Oid(hex=c1)]))
    assert w.commit(root, [c1], sig.name, sig.email, 1700000000, "no newline") == c2
    ref = "refs/heads/rooms/x"
    assert w.move_ref(ref, "", c1)
    assert not w.move_ref(ref, "", c2)          # it exists now
    assert w.move_ref(ref, c1, c2)
    assert not w.move_ref(ref, c1, c2)          # it moved
    _fsck(tmp_path / "b")
    subprocess.run(["git", "--git-dir", str(tmp_path / "b"), "pack-refs", "--all"], check=True)
    assert not os.path.exists(tmp_path / "b" / ref)
    assert w.current(ref) == c2                 # read from packed-refs
    assert w.move_ref(ref, c2, c1)
    assert pygit2.Repository(str(tmp_path / "b")).references[ref].target == pygit2.Oid(hex=c1)


def test_loose_objects_read_back_at_every_size(tmp_path):
    """Small objects are deflated with a small window (durable._deflate): git and
    libgit2 read them back, at and around the size where the window changes, and
    a small one's file is no bigger than a default deflate's."""
    import zlib
    path = tmp_path / "b"
    repo = pygit2.init_repository(str(path), bare=True)
    w = durable.Writer(str(path), "none")
    text = open(os.path.join(ROOT, "gitdrop", "core.py"), "rb").read()
    for n in (0, 1, 380, 8170, 8180, 8192, 9000, 60000):
        for data in (text[:n], os.urandom(n)):
            oid = w.blob(data)
            assert repo[oid].data == data
            got = subprocess.run(["git", "--git-dir", str(path), "cat-file", "blob", oid],
                                 capture_output=True, check=True).stdout
            assert got == data
    commit = w.commit(str(repo.TreeBuilder().write()), [], "team/jo", "jo@team.gitdrop",
                      1700000000, "jo → al: hello\n\nGitdrop-Op: send\n")
    raw = open(path / "objects" / commit[:2] / commit[2:], "rb").read()
    assert len(raw) <= len(zlib.compress(zlib.decompress(raw), 1)) + 2
    _fsck(path)


def test_a_held_lock_is_a_lost_race(tmp_path):
    h = _hub(tmp_path / "h", "wal")
    h.create_room("hub/admin", "r", open_=True)
    ref = h.store.room_ref("r")
    tip = h.store.tip(ref)
    w = durable.Writer(h.store.path, "wal")
    lock = os.path.join(h.store.path, ref + ".lock")
    fd = locks.take(lock)                       # a live gitdrop writer's: flocked
    os.utime(lock, (1, 1))                      # however old it is
    assert not w.move_ref(ref, tip, tip)
    assert os.path.exists(lock)                 # someone else's lock is left alone
    os.close(fd)                                # its owner dies (the flock goes with it)
    assert not w.move_ref(ref, tip, tip)        # a lost race, but the dead lock is gone
    assert not os.path.exists(lock)
    assert w.move_ref(ref, tip, tip)


class Clock:
    def __init__(self):
        self.now = 1_700_000_000

    def __call__(self):
        self.now += 1
        return self.now


def _script(room):
    room.register("t/ann", ["lead"])
    room.register("t/bob")
    room.create_task("t/ann", "first", body="Do it.", assignee="t/bob")
    room.send("t/ann", "t/bob", "hello")
    room.inbox("t/bob")
    room.move_task("t/bob", "1", "start")
    room.set_context("t/bob", "k", "v")
    room.set_context("t/bob", "k", None)      # removes context/ and its tree
    room.send("t/bob", "all", "done")


def test_both_methods_write_the_same_commits(tmp_path):
    tips = []
    for method in ("wal", "fsync"):
        h = _hub(tmp_path / method, method, Clock())
        h.create_room("hub/admin", "r", open_=True)
        _script(h.room("r"))
        tips.append(h.store.room_tip("r"))
        _fsck(tmp_path / method)
        assert len(h.verify("r")) == 11    # ann taking the lead adds team t to the room
    assert tips[0] == tips[1]


WRITER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    from gitdrop import hub
    h = hub.Hub({path!r})
    assert h.store.method == "wal"
    r = h.room("r")
    for i in range({n}):
        r.send({agent!r}, "t/sink", f"{{i}} from {agent}")
""")


def test_concurrent_writers_lose_nothing(tmp_path):
    """Three processes send at once, two through the log and one through libgit2:
    every message is on the branch, in one linear history."""
    h = _hub(tmp_path / "h", "wal")
    h.create_room("hub/admin", "r", open_=True, settings={"loop_cap": 0})
    room = h.room("r")
    for a in ("t/a", "t/b", "t/c", "t/sink"):
        room.register(a)
    n = 25
    procs = []
    for agent, logged in (("t/a", True), ("t/b", True), ("t/c", False)):
        env = dict(os.environ)
        code = WRITER.format(root=ROOT, path=h.store.path, n=n, agent=agent)
        if not logged:  # this one writes through libgit2 (fsync per file)
            code = code.replace('assert h.store.method == "wal"', 'h.store.method = "fsync"')
        procs.append(subprocess.Popen([sys.executable, "-c", code], env=env,
                                      stderr=subprocess.PIPE, text=True))
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    log = hubmod.Hub(h.store.path).room("r").log(n=1000)
    sends = [e for e in log if e["op"] == "send"]
    assert len(sends) == 3 * n
    for agent in ("t/a", "t/b", "t/c"):
        texts = [e["subject"] for e in sends if e["author"] == agent]
        assert [t.rsplit(": ", 1)[1] for t in texts] == [f"{i} from {agent}" for i in range(n)]
    _fsck(h.store.path)
    assert len(hubmod.Hub(h.store.path).verify("r")) == 5 + 3 * n


@pytest.mark.parametrize("method", ["wal", "fsync"])
def test_write_many_one_commit_per_operation(tmp_path, method):
    h = _hub(tmp_path / "h", method, Clock())
    h.create_room("hub/admin", "r", open_=True, settings={"loop_cap": 0})
    room = h.room("r")
    room.register("t/ann")
    room.register("t/bob")
    store: Store = h.store
    ref = store.room_ref("r")
    start = store.tip(ref)
    moves = []
    real_cas = store._cas
    store._cas = lambda *a, **kw: moves.append(a[1:3]) or real_cas(*a, **kw)

    def send(to, text):
        def build(view, tip):
            return {}, room._msg(f"ann → {to}: {text}", text, "send", to=to), {"text": text}
        return build, "t/ann"
    ops = [send("t/bob", "one"), send("t/nobody", "refused"), send("t/bob", "two"),
           (send("t/bob", "not mine")[0], "t/bob"), send("t/bob", "three")]
    out = store.write_many(ref, ops, now=h.clock())
    assert [type(x).__name__ for x in out] == ["tuple", "Refusal", "tuple", "Refusal", "tuple"]
    assert out[1].rule == "unknown-recipient"
    assert out[3].rule == "unread-before-send"       # bob has unread messages from ann
    assert [r["text"] for _, r in (out[0], out[2], out[4])] == ["one", "two", "three"]
    assert len(moves) == 1 and moves[0] == (start, out[4][0])   # the ref moved once
    c = store.reader.commit(out[4][0])
    assert c.parent == out[2][0] and store.reader.commit(out[2][0]).parent == out[0][0]
    assert store.reader.commit(out[0][0]).parent == start
    assert len(h.verify("r")) == 6
    _fsck(store.path)
    with pytest.raises(Refusal):
        store.write(ref, send("t/nobody", "x")[0], "t/ann", now=h.clock())
