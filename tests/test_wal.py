"""The hub's write-ahead log: after a crash (here: what a power cut can leave on a
disk, made by hand, and a different boot id in the log's header) the first
process to open the hub replays the log, and every acknowledged write is back."""

import json
import os
import subprocess
import sys

import pytest

from gitdrop import durable, fmt, hub as hubmod, model, wal
from gitdrop.writequeue import Turn
from gitdrop.errors import Storage

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _git(path, *args, input=None, env=None):
    return subprocess.run(["git", "--git-dir", str(path), *args], capture_output=True,
                          text=True, input=input, env=None if env is None else {**os.environ, **env})


def _fsck(path):
    p = _git(path, "fsck", "--strict", "--no-dangling")
    assert p.returncode == 0, p.stdout + p.stderr


def _hub(tmp_path, size=None):
    path = tmp_path / "hub.git"
    if size:
        path.mkdir()
        _git(path, "init", "--bare", "-q")
        _git(path, "config", "gitdrop.walSize", str(size))
    h = hubmod.init(str(path), room="")
    assert h.store.method == "wal" and os.path.exists(wal.path_for(str(path)))
    h.create_room("hub/admin", "r", open_=True, settings={"loop_cap": 0})
    r = h.room("r")
    r.register("t/ann", ["lead"])
    r.register("t/bob")
    return h, r


def _reboot(path):
    """What the next boot sees: another boot id in the header, and this process's
    handle on the log forgotten (a new process would have none)."""
    log = wal.for_hub(str(path))
    lap, _, size = log._head()
    os.pwrite(log.fd, wal._header(lap, "0" * 36, size), 0)
    for key in [k for k in wal._OPEN if k[1] in (str(path), os.path.realpath(path))]:
        del wal._OPEN[key]


def _obj(path, oid):
    return os.path.join(str(path), "objects", oid[:2], oid[2:])


def _lose(path, oid, how):
    p = _obj(path, oid)
    if how == "missing":
        os.chmod(p, 0o644)
        os.remove(p)
    else:   # named, but its data never reached the disk
        os.chmod(p, 0o644)
        open(p, "wb").close()


def test_replay_restores_what_the_crash_lost(tmp_path):
    h, r = _hub(tmp_path)
    path = h.store.path
    tip0 = h.store.room_tip("r")
    r.send("t/ann", "t/bob", "one")
    r.create_task("t/ann", "Build it", body="Do it.", assignee="t/bob")
    r.send("t/ann", "t/bob", "two")
    tip = h.store.room_tip("r")
    records, _ = wal.for_hub(path).records()
    logged = [oid for _, _, objs in records for oid, _ in objs]
    assert tip in logged
    # The crash: the last commits' objects are gone or empty, the room's ref is
    # back where it was, the hub's ref file is empty, and a lock was left behind.
    parent = h.store.reader.commit(tip).parent
    _lose(path, tip, "missing")
    _lose(path, parent, "empty")
    for oid in logged[-4:-2]:
        if os.path.exists(_obj(path, oid)):
            _lose(path, oid, "missing")
    ref = os.path.join(path, h.store.room_ref("r"))
    with open(ref, "w") as f:
        f.write(tip0 + "\n")
    hub_tip = h.store.tip("refs/heads/hub")
    open(os.path.join(path, "refs/heads/hub"), "w").close()
    lock = ref + ".lock"
    open(lock, "w").close()
    os.utime(lock, (1, 1))   # from before this boot
    _reboot(path)
    assert _git(path, "fsck", "--no-dangling").returncode != 0

    # A new process opens the hub (the command line), and sees every write.
    p = subprocess.run([sys.executable, "-m", "gitdrop", "--hub", path, "--room", "r",
                        "--as", "t/bob", "--json", "inbox"], capture_output=True, text=True,
                       cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert "replayed" in p.stderr and "write(s)" in p.stderr     # says what it did
    got = json.loads(p.stdout)["messages"]   # two messages and the task assigned
    assert [m["text"] for m in got if m["text"]] == ["one", "two"] and len(got) == 3
    assert not os.path.exists(lock)
    h2 = hubmod.Hub(path)
    assert h2.store.tip("refs/heads/hub") == hub_tip
    assert h2.store.reader.commit(h2.store.room_tip("r")).parent == tip
    _fsck(path)
    assert len(h2.verify("r")) == 8   # ann taking the lead added team t to the room
    log = wal.for_hub(path)
    assert log._head()[1] == wal.boot_id()       # consistent in this boot again
    assert len(log.records()[0]) == 1            # a new lap: bob's read since
    h2.room("r").send("t/bob", "t/ann", "three")
    assert len(log.records()[0]) == 2


def test_a_torn_record_is_not_replayed(tmp_path):
    h, r = _hub(tmp_path)
    path = h.store.path
    r.send("t/ann", "t/bob", "kept")
    tip = h.store.room_tip("r")
    log = wal.for_hub(path)
    records, end = log.records()
    # A record whose fdatasync never returned: half of it reached the disk.
    lap = log._head()[0]
    payload = wal._encode([(h.store.room_ref("r"), tip, "1" * 40)], [])
    rec = wal._REC.pack(wal.REC_MAGIC, lap, records[-1][0] + 1, len(payload), 0) + payload
    os.pwrite(log.fd, rec[:len(rec) // 2], end)
    assert len(log.records()[0]) == len(records)
    _reboot(path)
    h2 = hubmod.Hub(path)
    assert h2.store.room_tip("r") == tip
    _fsck(path)


def test_a_failed_ref_move_takes_its_record_back(tmp_path):
    h, r = _hub(tmp_path)
    path = h.store.path
    log = wal.for_hub(path)
    before = log.records()[0]
    tip = h.store.room_tip("r")
    with pytest.raises(OSError):
        with log.append([(h.store.room_ref("r"), tip, "2" * 40)]):
            raise OSError("the rename failed")
    assert log.records()[0] == before
    r.send("t/ann", "t/bob", "after")          # the next write goes where it was
    assert len(log.records()[0]) == len(before) + 1
    _reboot(path)
    assert hubmod.Hub(path).room("r").inbox("t/bob")["messages"][0]["text"] == "after"


def test_group_commit_syncs_after_the_turn_and_objects_come_first(tmp_path, monkeypatch):
    """A write's loose files are in place before its ref moves (readers open them at
    once); its record is synced after its turn in line, before the call returns,
    and one sync may cover the records of writers that came through meanwhile. If
    the files fail, the record is taken back and the ref stays."""
    h, r = _hub(tmp_path)
    path = h.store.path
    log = wal.for_hub(path)
    events = []
    real_sync, real_put, real_exit = os.fdatasync, durable.Writer._put, Turn.__exit__
    monkeypatch.setattr(os, "fdatasync", lambda fd: (events.append("sync"), real_sync(fd))[1])
    monkeypatch.setattr(durable.Writer, "_put", lambda *a: (events.append("file"),
                                                            real_put(*a))[1])
    monkeypatch.setattr(Turn, "__exit__", lambda *a: (events.append("turn over"),
                                                      real_exit(*a))[1])
    done = r.send("t/ann", "t/bob", "while syncing")
    monkeypatch.undo()
    assert events == ["file", "turn over", "sync"], events
    assert log._synced() > log.records()[0][-1][0]          # its record is durable
    assert os.path.exists(_obj(path, done["commit"])) and h.store.room_tip("r") == done["commit"]
    before, tip = log.records()[0], h.store.room_tip("r")
    # A record another writer already synced past needs no sync of its own.
    monkeypatch.setattr(os, "fdatasync", lambda fd: events.append("second sync"))
    log.sync_through(log.records()[0][-1][0])
    monkeypatch.undo()
    assert "second sync" not in events

    def full(*_a):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(durable.Writer, "_put", full)
    with pytest.raises(Storage, match="No space left on device; nothing was written"):
        r.send("t/ann", "t/bob", "no room for it")
    monkeypatch.undo()
    assert h.store.room_tip("r") == tip and log.records()[0] == before
    assert not os.path.exists(os.path.join(path, h.store.room_ref("r") + ".lock"))
    _reboot(path)   # and a replay does not bring it back
    got = hubmod.Hub(path).room("r").inbox("t/bob")["messages"]
    assert [m["text"] for m in got] == ["while syncing"]
    _fsck(path)


def test_a_durable_mark_that_does_not_check_is_synced_again(tmp_path, monkeypatch):
    """The mark saying which records are durable is read without a lock; one read
    while another process rewrote it (or written by an older gitdrop, without its
    crc) must not let a write skip its sync: it reads as nothing synced."""
    import struct
    path = str(tmp_path / "hub.git")
    h = hubmod.init(path, room="")
    h.create_room("hub/admin", "r", open_=True)
    r = h.room("r")
    r.register("t/ann")
    log = wal.for_hub(path)
    seq = log.records()[0][-1][0]
    log.sync_through(seq)
    assert log._synced() > seq
    syncs = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (syncs.append(fd), real(fd))[1])
    log.sync_through(seq)
    assert syncs == []                        # a mark that checks: no sync needed
    good = os.pread(log.fd, 12, wal._SYNCED_AT)
    for torn in (struct.pack("<Q", 1 << 40) + good[8:],     # a value it never had
                 struct.pack("<Q", seq + 5) + b"\0" * 4):   # an older gitdrop's mark
        os.pwrite(log.fd, torn, wal._SYNCED_AT)
        assert log._synced() == 0
        log.sync_through(seq)
        assert len(syncs) == 1 and log._synced() == seq + 1  # synced, marked truly
        syncs.clear()
    # An older gitdrop replayed the log after a reboot: a new lap whose records are
    # numbered from 0 again, and the mark (which it does not know) left at seq + 1.
    os.pwrite(log.fd, wal._HINT.pack(wal.HEADER, 0), wal._HINT_AT)
    assert log._synced() == 0
    r.send("t/ann", "t/ann", "after the old replay")   # record 0 of the lap: synced
    assert len(syncs) == 1, syncs


@pytest.mark.parametrize("files", ["whole", "blob lost", "commit lost"])
def test_a_ref_moved_before_its_record_was_synced_is_kept_only_if_whole(tmp_path, files):
    """Group commit moves a ref a moment before its record is synced. A crash in
    that moment leaves the ref naming a commit no record holds: kept if every
    object of it reached the device, else put back on the last logged write (which
    holds every acknowledged one)."""
    h, r = _hub(tmp_path)
    path = str(h.store.path)
    acked = r.send("t/ann", "t/bob", "acknowledged")["commit"]
    blob = _git(path, "hash-object", "-w", "--stdin", input="lost in the crash\n").stdout.strip()
    base_tree = _git(path, "rev-parse", acked + "^{tree}").stdout.strip()
    listing = _git(path, "ls-tree", base_tree).stdout + f"100644 blob {blob}\tnote.md\n"
    tree = _git(path, "mktree", input=listing).stdout.strip()
    unlogged = _git(path, "commit-tree", tree, "-p", acked, "-m", "t/ann: note",
                    env={"GIT_AUTHOR_NAME": "t/ann", "GIT_AUTHOR_EMAIL": "ann@t.gitdrop",
                         "GIT_COMMITTER_NAME": "t/ann",
                         "GIT_COMMITTER_EMAIL": "ann@t.gitdrop"}).stdout.strip()
    ref = os.path.join(path, h.store.room_ref("r"))
    with open(ref, "w") as f:          # the ref moved; its record never reached the device
        f.write(unlogged + "\n")
    if files == "blob lost":
        _lose(path, blob, "zeroed")
    elif files == "commit lost":
        _lose(path, unlogged, "missing")
    _reboot(path)
    tip = hubmod.Hub(path).store.room_tip("r")
    assert tip == (unlogged if files == "whole" else acked)
    if files != "blob lost":
        _fsck(path)


def test_laps_and_a_record_too_big_for_the_log(tmp_path):
    h, r = _hub(tmp_path, size=32 * 1024)
    path = h.store.path
    log = wal.for_hub(path)
    lap = log._head()[0]
    for i in range(120):
        r.send("t/ann", "t/bob", f"message {i}: " + "x" * 200)
        r.inbox("t/bob")
    assert log._head()[0] > lap + 2           # the log went round, syncing as it did
    records, end = log.records()
    assert records and end <= 32 * 1024
    n = len(records)
    big = os.urandom(30000).hex()               # ~30 KB compressed: more than the log
    r.set_context("t/ann", "big", big)          # made durable file by file instead
    assert len(log.records()[0]) == n
    _reboot(path)
    h2 = hubmod.Hub(path)
    assert h2.room("r").context("big") == {"big": big}
    assert len(h2.room("r").inbox("t/bob")["messages"]) == 0
    _fsck(path)


def test_archive_is_replayed_in_order(tmp_path):
    """A room created and archived since the last lap: the crash kept the room's
    ref file (its removal was lost); replaying the log removes it again."""
    h, r = _hub(tmp_path)
    path = h.store.path
    tip = h.store.room_tip("r")
    h.archive_room("r", "hub/admin")
    ref = os.path.join(path, h.store.room_ref("r"))
    assert not os.path.exists(ref)
    os.makedirs(os.path.dirname(ref), exist_ok=True)
    with open(ref, "w") as f:
        f.write(tip + "\n")
    _reboot(path)
    h2 = hubmod.Hub(path)
    assert not os.path.exists(ref)
    assert "r" not in h2.store.rooms()
    assert h2.store.tip("refs/archive/rooms/r") == tip


def test_replay_moves_forward_over_a_lost_push(tmp_path):
    """Our write, then a push on top of it, then our next write: if the crash lost
    the refs of all three, replay ends on the last one (never backwards)."""
    h, r = _hub(tmp_path)
    path = h.store.path
    start = h.store.room_tip("r")
    r.send("t/ann", "t/bob", "first")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "-b", "rooms/r", path, str(clone)], check=True)
    (clone / model.task_path(7)).parent.mkdir(parents=True, exist_ok=True)
    (clone / model.task_path(7)).write_text(fmt.dumps_doc(
        {"id": "7", "title": "by hand", "state": "pending", "creator": "t/bob",
         "assignee": ""}, "Pushed by hand."))
    env = dict(os.environ, GIT_AUTHOR_NAME="t/bob", GIT_AUTHOR_EMAIL="bob@t.gitdrop",
               GIT_COMMITTER_NAME="t/bob", GIT_COMMITTER_EMAIL="bob@t.gitdrop")
    subprocess.run(["git", "-C", str(clone), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(clone), "commit", "-qm", "task 7"], check=True, env=env)
    p = subprocess.run(["git", "-C", str(clone), "push", "-q", "origin", "rooms/r"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    r2 = hubmod.Hub(path).room("r")
    r2.send("t/ann", "t/bob", "second")
    final = h.store.room_tip("r")
    with open(os.path.join(path, h.store.room_ref("r")), "w") as f:
        f.write(start + "\n")
    _reboot(path)
    assert hubmod.Hub(path).store.room_tip("r") == final
    _fsck(path)


def test_method_follows_the_settings(tmp_path):
    h, _ = _hub(tmp_path)
    cfg = h.store.repo.config
    assert durable.method_for(cfg, h.store.path) == "wal"
    cfg["gitdrop.fsyncMethod"] = "fsync"
    assert durable.method_for(cfg, h.store.path) == "fsync"
    cfg["gitdrop.fsyncMethod"] = "auto"
    cfg["core.logAllRefUpdates"] = "true"      # reflogs: libgit2 writes them
    assert durable.method_for(cfg, h.store.path) == "fsync"
    cfg["gitdrop.fsync"] = "false"
    assert durable.method_for(cfg, h.store.path) == "none"


KILLED = """
import os, sys
sys.path.insert(0, {root!r})
from gitdrop import durable, hub
durable._into_place = lambda lock, path: os._exit(9)   # dies after the log, before the ref
hub.Hub({path!r}).room("r").send("t/ann", "t/bob", "never acknowledged")
"""


def test_a_writer_killed_after_logging_keeps_its_record(tmp_path):
    """Its record stays (the next one goes after it), so a later write that the
    killed one's objects might underlie is replayed whole; the last write wins.
    The lock it left is cleared by the next writer, which first logs that the ref
    still holds what it held (the dead write is dropped: never acknowledged)."""
    h, r = _hub(tmp_path)
    path = h.store.path
    ref = h.store.room_ref("r")
    log = wal.for_hub(path)
    n = len(log.records()[0])
    before = h.store.room_tip("r")
    p = subprocess.run([sys.executable, "-c", KILLED.format(root=ROOT, path=path)])
    assert p.returncode == 9
    assert len(log.records()[0]) == n + 1
    lock = os.path.join(path, ref + ".lock")
    assert os.path.exists(lock)                    # the dead writer's lock
    os.utime(lock, (1, 1))                         # past the grace period
    r.send("t/ann", "t/bob", "acknowledged")       # no person needed
    assert not os.path.exists(lock)
    records = log.records()[0]
    assert len(records) == n + 3                   # after it, not over it
    assert records[-2][1] == [(ref, before, before)]
    tip = h.store.room_tip("r")
    _reboot(path)
    h2 = hubmod.Hub(path)
    assert h2.store.room_tip("r") == tip
    assert [m["text"] for m in h2.room("r").inbox("t/bob")["messages"]] == ["acknowledged"]
    _fsck(path)


def test_threads_of_one_process_append_in_turn(tmp_path):
    """flock does not exclude threads that share the log's descriptor: a server
    writing for several agents at once must still get one record after another."""
    import threading
    h, r = _hub(tmp_path)
    log = wal.for_hub(h.store.path)
    rooms = []
    for i in range(4):
        h.create_room("hub/admin", f"t{i}", open_=True, settings={"loop_cap": 0})
        room = h.room(f"t{i}")
        room.register("t/ann")
        room.register("t/bob")
        rooms.append(room)
    n = len(log.records()[0])
    errors = []

    def talk(room):
        try:
            for j in range(15):
                room.send("t/ann", "t/bob", f"{j}")
        except Exception as e:   # reported below
            errors.append(e)
    threads = [threading.Thread(target=talk, args=(room,)) for room in rooms]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(log.records()[0]) == n + 60
