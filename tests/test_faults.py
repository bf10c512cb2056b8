"""What a killed process or a damaged file leaves, and how gitdrop gets past it
without a person: a ref lock whose owner is dead is cleared (and the log told), a
damaged write-ahead log is rebuilt, a damaged ref is named with the value to put
back, and `gitdrop repair` mends what is left."""

import glob
import os
import subprocess
import sys
import threading
import time

import pytest
from cli_helpers import Gitdrop

from gitdrop import hub as hubmod, locks, model, wal
from gitdrop.errors import Damaged

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REF = "refs/heads/rooms/r"


def _git(path, *args, cwd=None, env=None):
    return subprocess.run(["git", *(["--git-dir", str(path)] if path else []), *args],
                          capture_output=True, text=True, cwd=cwd,
                          env=dict(os.environ, **(env or {})))


def _fsck(path):
    p = _git(path, "fsck", "--full", "--strict", "--no-dangling")
    assert p.returncode == 0, p.stdout + p.stderr


def _hub(tmp_path, method="wal", grace=None):
    path = str(tmp_path / "hub.git")
    h = hubmod.init(path, room="")
    if method != "wal":
        h.store.repo.config["gitdrop.fsyncMethod"] = method
    if grace is not None:
        h.store.repo.config["gitdrop.staleLockSeconds"] = str(grace)
    h = hubmod.Hub(path)
    assert h.store.method == method
    h.create_room("hub/admin", "r", open_=True, settings={"loop_cap": 0})
    r = h.room("r")
    r.register("t/ann", ["lead"])
    r.register("t/bob")
    return h, r


def _cli(h, tmp_path, agent="t/ann"):
    return Gitdrop(h.store.path, str(tmp_path), agent)


def _reboot(path):
    """What the next boot sees: another boot id in the log's header, and this
    process's handle on the log forgotten."""
    log = wal.for_hub(str(path))
    lap, _, size = log._head()
    os.pwrite(log.fd, wal._header(lap, "0" * 36, size), 0)
    _forget(path)


def _forget(path):
    for key in [k for k in wal._OPEN if k[1] in (str(path), os.path.realpath(path))]:
        del wal._OPEN[key]


def _lock(h, ref=REF):
    return os.path.join(h.store.path, ref + ".lock")


def _stale(path, age=60):
    """A lock file left by a process that died `age` seconds ago (no flock)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("0" * 40 + "\n")
    t = time.time() - age
    os.utime(path, (t, t))


# A writer killed (SIGKILL) after its record is in the log, before its ref moved:
# the lock it made stays, its flock goes with it.
KILLED = """
import os, sys
sys.path.insert(0, {root!r})
from gitdrop import durable, hub
def die(*a, **k):
    os.kill(os.getpid(), 9)
durable._into_place = die
hub.Hub({path!r}).room("r").send("t/ann", "t/bob", "never acknowledged")
"""


def _kill_a_writer(h):
    p = subprocess.run([sys.executable, "-c", KILLED.format(root=ROOT, path=h.store.path)])
    assert p.returncode == -9
    assert os.path.exists(_lock(h))


# --- locks left by dead processes ------------------------------------------------------

def test_the_next_command_after_a_killed_writer_goes_through(tmp_path):
    """The default grace period: the command waits for the dead writer's lock to
    age (it cannot tell it from a git lock before that), then clears it."""
    h, r = _hub(tmp_path)
    tip = h.store.room_tip("r")
    _kill_a_writer(h)
    killed = time.monotonic()
    gd = _cli(h, tmp_path)
    res = gd("--room", "r", "send", "t/bob", "-m", "after the kill")
    took = time.monotonic() - killed
    assert res.rc == 0, res
    assert locks.GRACE - 0.5 < took < locks.GRACE + 3     # it waited for the lock to age
    assert not os.path.exists(_lock(h))
    assert h.store.reader.commit(h.store.room_tip("r")).parent == tip
    got = [m["text"] for m in h.room("r").inbox("t/bob")["messages"]]
    assert got == ["after the kill"]                  # the dead write was dropped
    _fsck(h.store.path)


def test_a_lock_a_live_writer_holds_is_left_alone(tmp_path):
    h, r = _hub(tmp_path, grace=0.2)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import os, sys, time\nsys.path.insert(0, {root!r})\nfrom gitdrop import locks\n"
        "fd = locks.take({lock!r})\nos.utime({lock!r}, (1, 1))\nprint('held', flush=True)\n"
        "time.sleep(60)\n").format(root=ROOT, lock=_lock(h))],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        t0 = time.monotonic()
        res = _cli(h, tmp_path)("--room", "r", "send", "t/bob", "-m", "blocked")
        assert res.rc == 6 and "kept moving" in res.err, res   # a live writer: a race
        assert time.monotonic() - t0 < 20 * locks.HELD_WAIT + 5
        assert os.path.exists(_lock(h))
    finally:
        holder.kill()
        holder.wait()
    r.send("t/ann", "t/bob", "its owner is gone")          # dead now: cleared
    assert not os.path.exists(_lock(h))


def test_a_young_lock_nobody_holds_is_waited_for(tmp_path):
    """git and libgit2 take no flock: a lock they hold for a moment is waited for,
    never removed."""
    h, r = _hub(tmp_path, grace=5)
    lock = _lock(h)
    _stale(lock, age=0)
    removed = []

    def owner():
        time.sleep(0.3)
        os.unlink(lock)          # raises if someone else removed it
        removed.append(True)
    t = threading.Thread(target=owner)
    t.start()
    t0 = time.monotonic()
    r.send("t/ann", "t/bob", "after git")
    t.join()
    assert removed and 0.3 <= time.monotonic() - t0 < 3


def test_a_dead_writers_logged_write_is_never_replayed_over_a_push(tmp_path):
    """Killed after logging its write: its record says the ref moves to a commit
    nobody acknowledged. A push then clears the lock (through the hook) and lands;
    after a crash, the replay must not put the ref back on the dead write."""
    h, r = _hub(tmp_path, grace=0.2)
    path = h.store.path
    _kill_a_writer(h)
    clone = tmp_path / "clone"
    assert _git(None, "clone", "-q", "-b", "rooms/r", path, str(clone)).returncode == 0
    (clone / model.task_path(7)).parent.mkdir(parents=True, exist_ok=True)
    (clone / model.task_path(7)).write_text('+++\nid = "7"\ntitle = "by hand"\nstate = '
                                          '"pending"\ncreator = "t/bob"\n+++\nPushed.\n')
    env = dict(GIT_AUTHOR_NAME="t/bob", GIT_AUTHOR_EMAIL="bob@t.gitdrop",
               GIT_COMMITTER_NAME="t/bob", GIT_COMMITTER_EMAIL="bob@t.gitdrop")
    _git(None, "-C", str(clone), "add", "-A")
    assert _git(None, "-C", str(clone), "commit", "-qm", "task 7", env=env).returncode == 0
    p = _git(None, "-C", str(clone), "push", "-q", "origin", "rooms/r")
    assert p.returncode == 0, p.stderr
    pushed = _git(None, "-C", str(clone), "rev-parse", "HEAD").stdout.strip()
    assert h.store.room_tip("r") == pushed and not os.path.exists(_lock(h))
    _reboot(path)
    h2 = hubmod.Hub(path)
    assert h2.store.room_tip("r") == pushed
    assert h2.room("r").task("7")["title"] == "by hand"
    _fsck(path)


def test_archive_and_the_fsync_method_clear_a_dead_lock(tmp_path):
    """libgit2's paths: a room move (a transaction) and a write with method fsync."""
    h, r = _hub(tmp_path, grace=0.2)
    _stale(_lock(h, "refs/archive/rooms/r"))
    h.archive_room("r", "hub/admin")
    assert h.store.tip("refs/archive/rooms/r")
    h.restore_room("r", "hub/admin")
    h2, r2 = _hub(tmp_path / "fsync", method="fsync", grace=0.2)
    _stale(_lock(h2))
    r2.send("t/ann", "t/bob", "through libgit2")
    assert not os.path.exists(_lock(h2))
    _fsck(h2.store.path)


# --- a damaged log -----------------------------------------------------------------------

def _damage(path, how):
    log = wal.path_for(path)
    if how == "header":
        with open(log, "r+b") as f:
            f.write(b"junk")
    else:
        os.truncate(log, 100)


@pytest.mark.parametrize("how", ["header", "truncated"])
def test_a_damaged_log_is_rebuilt_and_said_once(tmp_path, how):
    h, r = _hub(tmp_path)
    path = h.store.path
    r.send("t/ann", "t/bob", "before")
    _damage(path, how)
    gd = _cli(h, tmp_path)
    first = gd("--room", "r", "send", "t/bob", "-m", "after")
    assert first.rc == 0, first
    assert "was damaged" in first.err and "Nothing was lost" in first.err
    kept = glob.glob(wal.path_for(path) + ".damaged-*")
    assert len(kept) == 1 and kept[0] in first.err
    second = gd("--room", "r", "send", "t/bob", "-m", "again")
    assert second.rc == 0 and "damaged" not in second.err, second
    log = wal.Log(path)                         # a new handle: the new log, whole
    assert len(log.records()[0]) == 2
    # this process had the old log open: it follows to the new one
    r.inbox("t/bob")
    assert len(wal.Log(path).records()[0]) == 3
    _fsck(path)


def test_a_push_gets_past_a_damaged_log(tmp_path):
    h, r = _hub(tmp_path)
    path = h.store.path
    _damage(path, "header")
    clone = tmp_path / "clone"
    assert _git(None, "clone", "-q", "-b", "rooms/r", path, str(clone)).returncode == 0
    (clone / "notes.md").write_text("x\n")
    env = dict(GIT_AUTHOR_NAME="t/bob", GIT_AUTHOR_EMAIL="bob@t.gitdrop",
               GIT_COMMITTER_NAME="t/bob", GIT_COMMITTER_EMAIL="bob@t.gitdrop")
    (clone / model.task_path(5)).parent.mkdir(parents=True, exist_ok=True)
    (clone / model.task_path(5)).write_text('+++\nid = "5"\ntitle = "t"\nstate = "pending"\n'
                                          'creator = "t/bob"\n+++\n')
    os.remove(clone / "notes.md")
    _git(None, "-C", str(clone), "add", "-A")
    _git(None, "-C", str(clone), "commit", "-qm", "task 5", env=env)
    p = _git(None, "-C", str(clone), "push", "origin", "rooms/r")
    assert p.returncode == 0, p.stderr
    assert "was damaged" in p.stderr and "Traceback" not in p.stderr


def test_a_damaged_log_after_a_restart_replays_what_survived(tmp_path):
    """The machine went down, and the log's header with it: the records that are
    whole are replayed, and the message says a write may be lost."""
    h, r = _hub(tmp_path)
    path = h.store.path
    start = h.store.room_tip("r")
    r.send("t/ann", "t/bob", "logged")
    tip = h.store.room_tip("r")
    with open(os.path.join(path, REF), "w") as f:   # the crash lost the ref's move
        f.write(start + "\n")
    log = wal.for_hub(path)
    lap, _, size = log._head()
    head = bytearray(wal._header(lap, "0" * 36, size))
    head[-1] ^= 0xFF                                # another boot, and a bad checksum
    os.pwrite(log.fd, bytes(head), 0)
    _forget(path)
    res = _cli(h, tmp_path, "t/bob")("--room", "r", "inbox")
    assert res.rc == 0, res
    assert "restarted" in res.err and "may be lost" in res.err and "fsck" in res.err
    assert "logged" in res.out
    assert hubmod.Hub(path).store.reader.commit(hubmod.Hub(path).store.room_tip("r")) \
        .parent == tip
    _fsck(path)


# --- damaged refs, and gitdrop repair ---------------------------------------------------------

def test_a_garbage_room_ref_is_named_with_what_to_put_back(tmp_path):
    h, r = _hub(tmp_path)
    path = h.store.path
    r.send("t/ann", "t/bob", "kept")
    tip = h.store.room_tip("r")
    with open(os.path.join(path, REF), "w") as f:
        f.write("garbage\n")
    gd = _cli(h, tmp_path)
    res = gd("--room", "r", "send", "t/bob", "-m", "x", "--json")
    assert res.rc == 8, res
    doc = res.json
    assert doc["rule"] == "damaged" and REF in doc["reason"] and "garbage" in doc["reason"]
    assert tip in doc["fix"] and "repair --apply" in doc["fix"]
    with pytest.raises(Damaged):                    # through pygit2 too
        hubmod.Hub(path).room("r")
    rooms = gd("room", "list", "--json")
    assert rooms.rc == 0, rooms
    row, = [x for x in rooms.json["rooms"] if x["room"] == "r"]
    assert row["health"] == "damaged" and "repair" in row["fix"]
    look = gd("repair", "--json")
    assert look.rc == 8 and look.json["damaged"][0]["offer"] == tip, look
    assert open(os.path.join(path, REF)).read() == "garbage\n"   # only looked
    done = gd("repair", "--apply")
    assert done.rc == 0 and f"put back {REF} = {tip}" in done.out, done
    assert gd("--room", "r", "send", "t/bob", "-m", "works again").rc == 0
    _fsck(path)
    _reboot(path)                                   # and a replay keeps it
    h2 = hubmod.Hub(path)
    assert [m["text"] for m in h2.room("r").inbox("t/bob")["messages"]] == \
        ["kept", "works again"]


def test_repair_keeps_commits_pushed_after_the_last_logged_value(tmp_path):
    """A push is not in gitdrop's log: repair put back the last logged value, and
    the commits pushed on top of it were dropped (unreachable, for git gc to
    delete). The newest one is offered now, once the rules accept them; commits
    on top that the rules refuse are listed, not put back."""
    h, r = _hub(tmp_path)
    path = h.store.path
    r.send("t/ann", "t/bob", "written by gitdrop")
    logged = h.store.room_tip("r")
    work = str(tmp_path / "work")
    assert _git(None, "clone", "-q", "-b", "rooms/r", path, work).returncode == 0
    who = {"GIT_AUTHOR_NAME": "t/ann", "GIT_AUTHOR_EMAIL": "ann@t.gitdrop",
           "GIT_COMMITTER_NAME": "t/ann", "GIT_COMMITTER_EMAIL": "ann@t.gitdrop"}
    for text in ("decision A", "decision B"):
        p = _git(None, "commit", "-q", "--allow-empty", "-m", text, cwd=work, env=who)
        assert p.returncode == 0, p.stderr
    p = _git(None, "push", "-q", "origin", "HEAD:rooms/r", cwd=work)
    assert p.returncode == 0, p.stderr
    pushed = h.store.room_tip("r")
    assert pushed != logged and wal.last_logged(path, REF) == logged
    with open(os.path.join(path, REF), "w") as f:
        f.write("garbage\n")
    gd = _cli(h, tmp_path)
    look = gd("repair", "--json")
    assert look.rc == 8, look
    entry, = look.json["damaged"]
    assert entry["offer"] == pushed and "pushed" in entry["source"], entry
    assert logged in entry["candidates"]                  # the older one to choose
    done = gd("repair", "--apply")
    assert done.rc == 0 and f"put back {REF} = {pushed}" in done.out, done
    assert [m["text"] for m in hubmod.Hub(path).room("r").inbox("t/bob")["messages"]] == \
        ["written by gitdrop", "decision A", "decision B"]
    _fsck(path)
    # a commit on top that the rules refuse (an author not in the room) is listed,
    # not offered; one on an older commit's line is neither
    assert gd("--room", "r", "send", "t/bob", "-m", "logged again").rc == 0
    tip = h.store.room_tip("r")
    eve = dict(who, GIT_AUTHOR_NAME="t/eve", GIT_COMMITTER_NAME="t/eve")
    forged = [_git(path, "commit-tree", f"{on}^{{tree}}", "-p", on, "-m", "forged",
                   env=eve).stdout.strip() for on in (tip, pushed)]
    with open(os.path.join(path, REF), "w") as f:
        f.write("garbage\n")
    look = gd("repair", "--json")
    entry, = look.json["damaged"]
    assert entry["offer"] == tip and entry["candidates"] == forged[:1], entry
    assert "not accepted by the rules" in entry["source"]


def test_repair_finds_a_cut_short_ref_the_log_no_longer_names(tmp_path):
    """No record of the ref in the log (it turned a lap, or was rebuilt): the
    newest commit of the room that no ref reaches is offered; a ref with nothing
    to put back can be dropped."""
    h, r = _hub(tmp_path)
    path = h.store.path
    r.send("t/ann", "t/bob", "one")
    r.send("t/ann", "t/bob", "two")
    tip = h.store.room_tip("r")
    os.remove(wal.path_for(path))
    _forget(path)
    with open(os.path.join(path, REF), "w") as f:
        f.write(tip[:12] + "\n")
    with open(os.path.join(path, "refs/heads/rooms/made-by-hand"), "w") as f:
        f.write("nonsense\n")
    gd = _cli(h, tmp_path)
    look = gd("repair", "--json")
    assert look.rc == 8, look
    by_ref = {d["ref"]: d for d in look.json["damaged"]}
    assert by_ref[REF]["offer"] == tip
    assert by_ref["refs/heads/rooms/made-by-hand"]["offer"] == ""
    words = gd("repair")
    assert "--drop refs/heads/rooms/made-by-hand" in words.err, words
    assert gd("repair", "--apply").rc == 8          # one is left
    done = gd("repair", "--drop", "refs/heads/rooms/made-by-hand")
    assert done.rc == 0 and "the hub is healthy" in done.out, done
    assert hubmod.Hub(path).store.room_tip("r") == tip
    _fsck(path)


def test_repair_clears_dead_locks_and_says_a_hub_is_healthy(tmp_path):
    h, r = _hub(tmp_path, grace=0.2)
    gd = _cli(h, tmp_path)
    healthy = gd("repair")
    assert healthy.rc == 0 and "the hub is healthy" in healthy.out, healthy
    _stale(_lock(h))
    _stale(_lock(h, "refs/heads/hub"))
    res = gd("repair", "--json")
    assert res.rc == 0, res
    assert sorted(res.json["locks_cleared"]) == ["refs/heads/hub.lock", REF + ".lock"]
    assert not os.path.exists(_lock(h))
    _damage(h.store.path, "header")
    res = gd("repair")
    assert res.rc == 0 and "log: rebuilt" in res.out, res


def test_a_ref_naming_a_missing_commit_is_listed_and_put_back(tmp_path):
    h, r = _hub(tmp_path)
    path = h.store.path
    r.send("t/ann", "t/bob", "kept")
    tip = h.store.room_tip("r")
    with open(os.path.join(path, REF), "w") as f:
        f.write("1" * 40 + "\n")                    # an id, of nothing in the hub
    gd = _cli(h, tmp_path)
    rooms = gd("room", "list", "--json")
    assert rooms.rc == 0, rooms
    row, = [x for x in rooms.json["rooms"] if x["room"] == "r"]
    assert row["health"] == "damaged" and "missing" in row["damaged"]
    look = gd("repair", "--json")
    assert look.rc == 8 and look.json["damaged"][0]["offer"] == tip, look
    assert gd("repair", "--apply").rc == 0
    assert hubmod.Hub(path).store.room_tip("r") == tip
    _fsck(path)


def _no_file_may_grow():
    """In the child: every write that grows a file fails (EFBIG), as on a full disk."""
    import resource
    import signal
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))


def test_a_disk_that_takes_no_more_is_said_and_leaves_nothing(tmp_path):
    """A write the system refuses (a full disk, a quota, a read-only mount) is exit 9,
    rule storage, not a traceback; no half object, lock or commit stays, and the
    same write goes through once the disk takes it."""
    import json
    from cli_helpers import ENTRY
    h, room = _hub(tmp_path)
    g = _cli(h, tmp_path)
    before = h.store.room_tip("r")
    objects = sorted(glob.glob(os.path.join(h.path, "objects", "*", "*")))
    for args in (["send", "t/bob", "-m", "hello"], ["task", "create", "a task"],
                 ["token", "t/bob"]):
        p = subprocess.run([*ENTRY, "--room", "r", *args, "--json"], env=g.env,
                           capture_output=True, text=True, preexec_fn=_no_file_may_grow,
                           stdin=subprocess.DEVNULL, timeout=60)
        assert p.returncode == 9 and "Traceback" not in p.stderr, p.stderr
        doc = json.loads(p.stdout)
        assert doc["rule"] == "storage" and "File too large" in doc["reason"], doc
        assert "nothing was written" in doc["reason"] and "df -h" in doc["fix"], doc
    assert h.store.room_tip("r") == before
    assert sorted(glob.glob(os.path.join(h.path, "objects", "*", "*"))) == objects
    assert not glob.glob(os.path.join(h.path, "refs", "**", "*.lock"), recursive=True)
    g.ok("--room", "r", "send", "t/bob", "-m", "hello")
    assert [m["text"] for m in room.inbox("t/bob")["messages"]] == ["hello"]
    _fsck(h.path)


def test_verify_stops_at_a_history_a_graft_made_loop(tmp_path):
    """A hub's info/grafts can give a room's first commit its tip as parent: git's
    commits cannot loop, but the walk then never ended (600 MB in 30 s)."""
    h = hubmod.init(str(tmp_path / "hub.git"))
    h.room("lobby").register("core/juno", ["lead"])
    ref = model.ROOM_PREFIX + "lobby"
    tip = h.store.tip(ref)
    root = subprocess.run(["git", "--git-dir", h.path, "rev-list", "--max-parents=0", ref],
                          capture_output=True, text=True, check=True).stdout.split()[0]
    with open(os.path.join(h.path, "info", "grafts"), "w") as f:
        f.write(f"{root} {tip}\n")
    r = Gitdrop(h.path, str(tmp_path / "home"))("verify", "lobby", "--json", timeout=60)
    assert r.rc == 3 and r.json["rule"] == "linear-history", r
    assert "loop" in r.json["reason"] and "info/grafts" in r.json["fix"], r
