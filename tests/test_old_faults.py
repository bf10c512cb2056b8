"""Three old faults, each shown with real processes killed with SIGKILL at a
chosen point: a room's ref move cut short, the auto-responder cut between
reading and answering, and `gitdrop wait` for a task that became ready."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from gitdrop import hub as hubmod
from gitdrop import model, wal
from gitdrop.errors import NotFound, Refusal

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOM_REF = "refs/heads/rooms/r"
ARCHIVED = model.ARCHIVE_PREFIX + "r"


def _child(code: str, *args) -> subprocess.CompletedProcess:
    """`code` run in a fresh Python process (sys.argv[1:] = args)."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
                          env=env, capture_output=True, text=True, timeout=60)


def _killed(p: subprocess.CompletedProcess) -> None:
    assert p.returncode == -signal.SIGKILL, (p.returncode, p.stdout, p.stderr[-2000:])


# --- 1. a room's ref move (archive, restore, destroy) killed midway --------------------

# Kills itself (SIGKILL) when the ref move reaches the named step, in Hub.<action>.
MOVER = """
    import os, signal, sys
    from gitdrop import hub as hubmod
    path, action, step, by = (sys.argv[1:] + ["hub/admin"])[:4]
    def reached(name):
        if name == step:
            os.kill(os.getpid(), signal.SIGKILL)
    hubmod._reached = reached
    h = hubmod.Hub(path)
    getattr(h, action)("r", by)
    print("not killed")
"""


def _room_hub(tmp_path):
    """A hub whose dead writers' locks are cleared after 0.2 s (not 2 s): a finisher
    takes the killed mover's locks for dead only once they are that old."""
    path = str(tmp_path / "hub.git")
    h = hubmod.init(path, room="")
    h.store.repo.config["gitdrop.staleLockSeconds"] = "0.2"
    h = hubmod.Hub(path)
    h.create_room("hub/admin", "r", open_=True, settings={"loop_cap": 0})
    r = h.room("r")
    r.register("t/ann", ["lead"])
    r.register("t/bob")
    r.send("t/bob", "t/ann", "before the move")
    return path, h.store.room_tip("r")


def _refs(path):
    s = hubmod.Hub(path).store   # the open finishes a move cut short
    return s.tip(ROOM_REF), s.tip(ARCHIVED)


def _journal(path):
    return os.path.exists(os.path.join(path, hubmod.MOVE_JOURNAL))


@pytest.mark.parametrize("step", ["journaled", "created", "moved"])
def test_an_archive_killed_at_any_step_is_finished_by_the_next_open(tmp_path, step):
    path, tip = _room_hub(tmp_path)
    _killed(_child(MOVER, path, "archive_room", step))
    store = hubmod.Store(path)   # as the kill left it, before any Hub opens
    if step == "created":   # the fault: the room under both names
        assert store.tip(ROOM_REF) == tip and store.tip(ARCHIVED) == tip
    assert _journal(path)
    assert _refs(path) == ("", tip)
    assert not _journal(path)
    h = hubmod.Hub(path)
    assert [x["room"] for x in h.rooms("archived")] == ["r"] and h.rooms("active") == []
    h.restore_room("r", "hub/admin")   # and the room lives on
    h.room("r").send("t/bob", "t/ann", "after the move")
    assert _refs(path)[1] == ""


def test_a_restore_killed_between_its_two_refs_is_finished(tmp_path):
    path, tip = _room_hub(tmp_path)
    hubmod.Hub(path).archive_room("r", "hub/admin")
    _killed(_child(MOVER, path, "restore_room", "created"))
    store = hubmod.Store(path)
    assert store.tip(ROOM_REF) == tip and store.tip(ARCHIVED) == tip
    assert _refs(path) == (tip, "")
    assert hubmod.Hub(path).room("r").inbox("t/ann")["messages"][0]["text"] == "before the move"
    # its archive record, left behind, is taken away by the same call run again
    h = hubmod.Hub(path)
    assert h._hub_view().text("archive/r.toml")
    assert h.restore_room("r", "hub/admin") == {"room": "r", "archived": False,
                                                "tip": h.store.tip(ROOM_REF)}
    assert h._hub_view().text("archive/r.toml") is None
    with pytest.raises(Refusal):   # and then there is nothing to do
        h.restore_room("r", "hub/admin")


def test_a_destroy_killed_after_writing_down_its_move_is_finished(tmp_path):
    path, tip = _room_hub(tmp_path)
    # an open room: its destroy is the operator's too (its only lead waits for it)
    assert hubmod.Hub(path).destroy_room("r", "t/ann")["waiting_for"] == ["hub/admin"]
    _killed(_child(MOVER, path, "destroy_room", "journaled", "hub/admin"))
    assert hubmod.Store(path).tip(ROOM_REF) == tip   # nothing moved yet
    assert _refs(path) == ("", "")
    assert not _journal(path)


def test_a_move_killed_then_written_to_is_undone_and_the_write_kept(tmp_path):
    """After the kill a writer clears the dead mover's lock (its owner is gone) and
    commits to the old ref: the room stayed where it was, so the move is undone
    rather than finished over an accepted write; a crash after that replays the log
    without bringing the undone ref back."""
    path, tip = _room_hub(tmp_path)
    _killed(_child(MOVER, path, "archive_room", "created"))
    from gitdrop.core import Room
    store = hubmod.Store(path)
    written = Room(store, "r", lambda: store.reader.commit(tip).time + 1).send(
        "t/bob", "t/ann", "while it moved")["commit"]
    assert store.tip(ROOM_REF) == written and store.tip(ARCHIVED) == tip
    assert _refs(path) == (written, "")
    log = wal.for_hub(path)   # the next boot: the log is replayed
    lap, _, size = log._head()
    os.pwrite(log.fd, wal._header(lap, "0" * 36, size), 0)
    for key in [k for k in wal._OPEN if k[1] in (path, os.path.realpath(path))]:
        del wal._OPEN[key]
    assert _refs(path) == (written, "")


def test_the_open_that_finishes_a_move_may_be_killed_too(tmp_path):
    path, tip = _room_hub(tmp_path)
    _killed(_child(MOVER, path, "archive_room", "created"))
    opener = MOVER.replace('getattr(h, action)("r", "t/ann")', "")
    _killed(_child(opener, path, "-", "finished"))   # done, but the journal still there
    assert _journal(path)
    assert _refs(path) == ("", tip) and not _journal(path)


# --- 2. the auto-responder killed between marking messages read and answering -----------

# The away agent's responder, one round, killed (SIGKILL) at its first send: before it
# is written ("before"), or just after it landed ("after").
RESPONDER = """
    import os, signal, sys
    from gitdrop import core
    from gitdrop.autorespond import Responder
    path, when = sys.argv[1:3]
    real = core.Room.send
    def send(self, *a, **k):
        if when == "after":
            real(self, *a, **k)
        os.kill(os.getpid(), signal.SIGKILL)
    core.Room.send = send
    Responder(path, "lobby", "core/spartan", {"away": "on leave"}).run_once()
    print("not killed")
"""


def _three(tmp_path):
    """A hub whose lobby has juno (lead), spartan and kai."""
    h = hubmod.init(str(tmp_path / "hub.git"))
    r = h.room("lobby")
    r.register("core/juno", ["lead"])
    r.register("core/spartan", ["coder"])
    r.register("core/kai", ["coder"])
    return h, r


@pytest.fixture
def away(tmp_path):
    """juno leads spartan and kai; kai asks spartan a question, then tells it something."""
    h, r = _three(tmp_path)
    asked = r.send("core/kai", "core/spartan", "Can you review my PR today?")["commit"]
    told = r.send("core/kai", "core/spartan", "The staging server is up again.")["commit"]
    (tmp_path / "away.toml").write_text('away = "on leave"\n')
    return h, r, [asked, told]


def _answers(r):
    """Per message of kai's, the automatic replies it got, and the tasks juno got."""
    got = {}
    for m in r.inbox("core/kai", limit=0, peek=True)["messages"]:
        if m["op"] == "send" and m["text"].startswith("[auto-reply]"):
            c = r.store.reader.commit(m["id"])
            to = next(v for k, v in c.trailers if k == "reply-to")
            got[to] = got.get(to, 0) + 1
    return got, sorted(r.view().task_ids())   # only escalations make tasks here


def _restart(tmp_path, h):
    """The responder started again, as a user does: the CLI, one round."""
    from cli_helpers import Gitdrop
    gd = Gitdrop(h.path, str(tmp_path / "home"), "core/spartan")
    return gd.ok("autorespond", "--rules", str(tmp_path / "away.toml"), "--once", "--json")


def test_a_responder_killed_after_reading_answers_when_started_again(tmp_path, away):
    h, r, msgs = away
    _killed(_child(RESPONDER, h.path, "before"))
    # the fault's ground: both read (the inbox will not show them again), none answered
    assert r.inbox("core/spartan", peek=True)["unread"] == 0
    assert _answers(r)[0] == {}
    pending = hubmod.Hub(h.path).room("lobby")
    _restart(tmp_path, h)
    got, tasks = _answers(pending)
    assert got == {msgs[0]: 1, msgs[1]: 1}   # each answered, once
    assert len(tasks) == 1                   # the question went to juno once (it had)
    _restart(tmp_path, h)
    assert _answers(r) == (got, tasks)       # nothing more on another round
    assert not os.path.exists(os.path.join(h.path, "gitdrop", "autorespond", "lobby",
                                           "core", "spartan.pending"))


def test_a_responder_killed_after_an_answer_landed_does_not_give_it_twice(tmp_path, away):
    h, r, msgs = away
    _killed(_child(RESPONDER, h.path, "after"))
    assert _answers(r)[0] == {msgs[0]: 1}
    _restart(tmp_path, h)
    got, tasks = _answers(r)
    assert got == {msgs[0]: 1, msgs[1]: 1} and len(tasks) == 1


# --- 3. `gitdrop wait` and a task that becomes ready ------------------------------------

@pytest.fixture
def crew(tmp_path):
    """juno leads; kai holds task 1 (started); task 2 waits on it, for anyone."""
    from cli_helpers import Gitdrop
    h, r = _three(tmp_path)
    r.create_task("core/juno", "build the parser", assignee="core/kai", review=False)
    r.move_task("core/kai", "1", "start")
    r.create_task("core/juno", "test the parser", after=["1"])
    return r, Gitdrop(h.path, str(tmp_path / "home"))


class Waiter:
    """`gitdrop wait --json` as spartan, in a process of its own, once it waits."""

    def __init__(self, gd, timeout):
        from cli_helpers import ENTRY
        import queue
        import threading
        self.p = subprocess.Popen([*ENTRY, "--as", "spartan", "wait", "--timeout",
                                   str(timeout), "--json"], env=gd.env, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.err = queue.Queue()
        threading.Thread(target=lambda: [self.err.put(x) for x in self.p.stderr],
                         daemon=True).start()
        try:   # "gitdrop: watching ...; waiting for core/spartan in lobby"
            line = self.err.get(timeout=30)
        except queue.Empty:
            line = ""
        assert "waiting for core/spartan" in line, (line, self.p.poll(), self.p.stdout.read())

    def result(self, limit=30):
        import json
        out = self.p.stdout.read()
        assert self.p.wait(limit) == 0, (self.p.returncode, out)
        return json.loads(out)


@pytest.mark.parametrize("how", ["dependency done", "new task", "released"])
def test_wait_wakes_when_another_process_makes_a_task_ready(crew, how):
    r, gd = crew
    if how == "released":
        gd.ok("--as", "kai", "task", "complete", "1")
        gd.ok("--as", "kai", "task", "claim", "2")
        r.inbox("core/spartan", limit=0)   # read: only the release may wake it
    w = Waiter(gd, 30)
    if how == "dependency done":
        gd.ok("--as", "kai", "task", "complete", "1")
        want = "2"
    elif how == "new task":   # no notice reaches spartan: the task is for anyone
        want = gd.js("--as", "juno", "task", "create", "review the parser")["id"]
    else:
        gd.ok("--as", "kai", "task", "release", "2", "--note", "not mine")
        want = "2"
    doc = w.result()
    assert doc["ready"] == [want] and f"task {want} ready for you to take" in doc["summary"]
    assert "next: gitdrop ready --claim" in doc["alert"] or doc["unread"]


def test_wait_wakes_when_a_backoff_runs_out_with_no_commit_to_say_so(crew):
    r, gd = crew
    gd.ok("--as", "kai", "task", "complete", "1")
    gd.ok("--as", "kai", "task", "claim", "2")
    r.inbox("core/spartan", limit=0)
    w = Waiter(gd, 30)
    import time
    gd.ok("--as", "kai", "task", "release", "2", "--retry-in", "2")
    released = time.monotonic()
    doc = w.result()
    assert doc["ready"] == ["2"] and time.monotonic() - released >= 1.0


def test_wait_does_not_end_for_what_was_ready_or_still_waits_on_another(crew):
    """Task 2 is ready when the wait begins (nothing new: it times out); task 3 is
    assigned to spartan but waits on task 1, so it wakes spartan only once 1 is done
    (it returned at once before, and never woke for the dependency)."""
    r, gd = crew
    r.create_task("core/juno", "ship the parser", assignee="core/spartan", after=["1"])
    r.inbox("core/spartan", limit=0)   # the notice of task 3, read
    assert Waiter(gd, 1).p.wait(30) == 124
    w = Waiter(gd, 30)
    gd.ok("--as", "kai", "task", "complete", "1")
    doc = w.result()
    assert doc["tasks"] == ["3"] and doc["ready"] == ["2"]


def test_a_destroy_killed_before_its_hub_commit_is_finished_and_its_consents_die_with_it(
        tmp_path):
    """Killed after the room went and before its hub commit, a destroy left the
    consents of its room: the same call run again said there was no room, repair
    said the hub was healthy, and the next room of that name was destroyed by one
    call, the other lead's old consent counting for it."""
    path, tip = _room_hub(tmp_path)

    def killed_in_the_middle(later):
        h = hubmod.Hub(path, clock=lambda: int(time.time()) + later)
        if not h.store.tip(ROOM_REF):
            h.create_room("hub/admin", "r", open_=True)
            h.room("r").register("t/ann", ["lead"])
        assert h.destroy_room("r", "t/ann")["waiting_for"] == ["hub/admin"]
        _killed(_child(MOVER, path, "destroy_room", "moved", "hub/admin"))
        assert _refs(path) == ("", "")
        assert "t/ann" in hubmod.Hub(path)._hub_view().text("destroy/r.toml")

    killed_in_the_middle(0)
    h = hubmod.Hub(path, clock=lambda: int(time.time()) + 5)   # a later room of the name
    h.create_room("hub/admin", "r", open_=True)
    h.room("r").register("t/ann", ["lead"])
    assert h.destroy_room("r", "hub/admin")["waiting_for"] == ["t/ann"]   # ann's was for the old
    assert h.destroy_room("r", "t/ann")["destroyed"]
    killed_in_the_middle(10)
    got = hubmod.Hub(path).destroy_room("r", "hub/admin")   # the same call, run again
    assert got["destroyed"] and got["finished"], got
    hv = hubmod.Hub(path)._hub_view()
    assert hv.text("destroy/r.toml") is None and hv.text("archive/r.toml") is None
    with pytest.raises(NotFound):   # and then there is nothing to do
        hubmod.Hub(path).destroy_room("r", "hub/admin")
