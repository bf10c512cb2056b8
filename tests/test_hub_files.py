"""gitdrop's own files in a hub's folders, against someone who may write those
folders (a shared hub's group): a symbolic link planted in place of one is never
followed, so no writer writes to, or truncates, a file of the planter's choosing."""

import json
import os

import pytest

from gitdrop import hub as hubmod
from cli_helpers import Gitdrop

PRECIOUS = b"someone else's file\n"


def _hub(tmp_path):
    path = str(tmp_path / "hub.git")
    hubmod.init(path, room="")
    h = hubmod.Hub(path)
    h.create_room("hub/admin", "r", open_=True, settings={"loop_cap": 0})
    r = h.room("r")
    r.register("t/ann", ["lead"])
    r.register("t/bob")
    g = Gitdrop(path, str(tmp_path), "t/ann")
    g.ok("--room", "r", "send", "t/bob", "-m", "first")   # the room's files exist now
    return h, g


def _plant(path: str, victim) -> None:
    os.unlink(path)
    os.symlink(victim, path)


@pytest.mark.parametrize("name", ["queue/refs%heads%rooms%r.slots",
                                  "queue/refs%heads%rooms%r.briefs", "walks", "tasks/r.idx"])
def test_a_link_in_place_of_a_rooms_own_file_is_not_written_through(tmp_path, name):
    """The request slots, the shared briefs, the walk memo and the task index: writes and reads still go through (each writer for itself, a cache
    rebuilt), and the linked file is untouched."""
    h, g = _hub(tmp_path)
    g.ok("--room", "r", "task", "create", "a task")
    g.ok("--room", "r", "task", "list")
    path = os.path.join(h.path, "gitdrop", name)
    assert os.path.exists(path), sorted(os.listdir(os.path.dirname(path)))
    victim = tmp_path / "victim"
    victim.write_bytes(PRECIOUS)
    _plant(path, victim)
    for n in range(3):
        g.ok("--room", "r", "send", "t/bob", "-m", f"after the link {n}")
        g.ok("--room", "r", "task", "create", f"task {n}")
        g.ok("--room", "r", "task", "list")
    assert victim.read_bytes() == PRECIOUS
    assert os.path.islink(path)
    texts = [m["text"] for m in h.room("r").inbox("t/bob", limit=10)["messages"]]
    assert texts == ["first", "after the link 0", "after the link 1", "after the link 2"]


@pytest.mark.parametrize("name", ["wal", "wal.sync"])
def test_a_link_in_place_of_the_hubs_log_is_refused_and_said(tmp_path, name):
    """The write-ahead log itself, or the file its syncs take turns on: the write is
    refused with what to do (remove the link), not a traceback, and nothing is
    written to the linked file."""
    h, g = _hub(tmp_path)
    victim = tmp_path / "victim"
    victim.write_bytes(PRECIOUS)
    path = os.path.join(h.path, "gitdrop", name)
    _plant(path, victim)
    r = g("--room", "r", "send", "t/bob", "-m", "after the link", "--json")
    assert r.rc in (8, 9) and "Traceback" not in r.err, r
    doc = json.loads(r.out)
    assert doc["ok"] is False and doc["rule"] in ("damaged", "storage"), doc
    assert "symbolic link" in doc["reason"] or "Too many levels" in doc["reason"], doc
    assert victim.read_bytes() == PRECIOUS
    # Once the link is gone, the hub writes again.
    os.unlink(path)
    if name == "wal":
        hubmod.Hub(h.path)   # makes a new log
    g.ok("--room", "r", "send", "t/bob", "-m", "after the link is gone")
    texts = [m["text"] for m in h.room("r").inbox("t/bob", limit=10)["messages"]]
    assert texts[0] == "first" and texts[-1] == "after the link is gone"
    assert victim.read_bytes() == PRECIOUS
