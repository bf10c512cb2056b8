"""The task headers kept between processes (gitdrop/taskindex.py): derived data
that must never change an answer, whatever state its file is in."""

import os
import subprocess
import sys

from gitdrop import hub as hubmod, taskindex
from gitdrop.leanstore import LeanStore


def _fresh_lean(path):
    """What a new command-line process sees: the lean store, nothing in memory."""
    from gitdrop.core import Room
    return Room(LeanStore(path), "lobby")


def _answers(room):
    return ([(t["id"], t["state"], t["assignee"], t["after"], t["requires"], t["title"])
             for t in room.list_tasks(include_done=True)],
            [t["id"] for t in room.ready("core/kai")])


def test_the_index_gives_the_answers_a_full_parse_gives(hub, team):
    a = team.create_task("core/juno", "a", priority=1)["id"]
    team.create_task("core/juno", "b", after=[a], tags=["x"])
    team.create_task("core/juno", "c", requires=["db"])
    first = _answers(_fresh_lean(hub.path))
    idx = taskindex.path_for(hub.path, "lobby")
    assert os.path.exists(idx) and len(open(idx).read().splitlines()) == 3
    assert _answers(_fresh_lean(hub.path)) == first      # from the file alone
    # a move changes one blob: only that one is parsed and appended
    team.move_task("core/kai", a, "claim")
    got = _answers(_fresh_lean(hub.path))
    assert got[0][0][1:3] == ("assigned", "core/kai") and got != first
    assert len(open(idx).read().splitlines()) == 4
    # the pygit2 store and the lean store agree, index or not
    assert _answers(hubmod.Hub(hub.path).room("lobby")) == got


def test_a_damaged_or_lying_index_changes_no_answer(hub, team):
    for i in range(5):
        team.create_task("core/juno", f"t{i}", priority=i)
    truth = _answers(_fresh_lean(hub.path))
    idx = taskindex.path_for(hub.path, "lobby")
    lines = open(idx).read().splitlines()
    # a line cut short by a crash runs into the next; another names the wrong task
    oid = lines[2].split('"')[1]
    bad = lines[0][:30] + lines[1] + "\n" + f'["{oid}",{{"id":"999","title":"lie"}}]' + "\n"
    with open(idx, "w") as f:
        f.write(bad + "\n".join(lines[3:]) + "\n{not json\n")
    assert _answers(_fresh_lean(hub.path)) == truth
    with open(idx, "wb") as f:
        f.write(b"\xff\xfe garbage")
    assert _answers(_fresh_lean(hub.path)) == truth
    os.remove(idx)
    os.makedirs(idx)      # not even a file: still the same answers
    assert _answers(_fresh_lean(hub.path)) == truth


def test_the_file_is_rewritten_with_the_live_tasks_only(hub, team, monkeypatch):
    monkeypatch.setattr(taskindex, "COMPACT_SLACK", 4)
    t = team.create_task("core/juno", "a")["id"]
    team.create_task("core/juno", "b")
    idx = taskindex.path_for(hub.path, "lobby")
    for n in range(8):      # each edit leaves a stale line behind
        team.move_task("core/juno", t, "edit", title=f"a{n}")
        taskindex.headers(_fresh_lean(hub.path).view())
    lines = open(idx).read().splitlines()
    assert len(lines) <= 2 * 2 + 4
    assert _answers(_fresh_lean(hub.path))[0][0][5] == "a7"


def test_slim_headers_read_their_defaults_and_full_copies_are_independent():
    h = taskindex.Header({"id": "3", "title": "x"})
    assert h["after"] == [] and h["priority"] == 0 and h["state"] == "pending"
    f = taskindex.full(h)
    f["tags"].append("y")
    assert h["tags"] == [] and set(f) >= {"after", "requires", "lease_until"}


def test_ready_in_a_fresh_process_reads_the_index(hub, team, tmp_path):
    for i in range(30):
        team.create_task("core/juno", f"t{i}")
    env = dict(os.environ, GITDROP_HUB=hub.path, GITDROP_ROOM="lobby", GITDROP_AGENT="core/kai")
    cmd = [sys.executable, "-m", "gitdrop.cli.main", "ready", "--json", "-n", "0"]
    p1 = subprocess.run(cmd, env=env, capture_output=True, text=True)
    idx = taskindex.path_for(hub.path, "lobby")
    before = os.stat(idx).st_mtime_ns
    p2 = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert p1.returncode == p2.returncode == 0 and p1.stdout == p2.stdout
    assert os.stat(idx).st_mtime_ns == before      # nothing new to parse: nothing written
    assert p1.stdout.count('"title"') == 30


def test_the_ready_pool_is_kept_by_the_tasks_tree_and_remade_after_a_change(hub, team):
    a = team.create_task("core/juno", "a")["id"]
    b = team.create_task("core/juno", "b", after=[a])["id"]
    c = team.create_task("core/juno", "c")["id"]
    team.move_task("core/spartan", c, "claim")
    team.move_task("core/spartan", c, "start")
    first = [t["id"] for t in _fresh_lean(hub.path).ready("core/kai")]
    assert first == [a]
    pool = os.path.join(hub.path, "gitdrop", "tasks", "lobby.ready")
    import json
    data = json.load(open(pool))
    assert sorted(h["id"] for h in data["pool"]) == [a, b, c]   # c: spartan's to resume
    assert data["states"] == {a: "pending"}
    # another tree's pool is not used
    json.dump(dict(data, tree="0" * 40, pool=[]), open(pool, "w"))
    assert [t["id"] for t in _fresh_lean(hub.path).ready("core/kai")] == [a]
    # a change of any task makes it again
    team.move_task("core/kai", a, "claim")
    assert [t["id"] for t in _fresh_lean(hub.path).ready("core/kai")] == [a]   # its own
    assert json.load(open(pool))["states"] == {a: "assigned"}
    assert [t["id"] for t in _fresh_lean(hub.path).ready("core/spartan")] == [c]
    team.move_task("core/spartan", c, "submit", note="done")   # in review: in no pool
    assert [t["id"] for t in _fresh_lean(hub.path).ready("core/spartan")] == []


def test_only_a_room_name_becomes_a_file_name(tmp_path):
    assert taskindex.path_for(str(tmp_path), "lobby").endswith("/gitdrop/tasks/lobby.idx")
    for bad in ("../../etc/x", "a/b", "", ".hidden.lock", "x\n"):
        assert taskindex.path_for(str(tmp_path), bad) == ""
    assert taskindex.path_for(str(tmp_path), "lobby", ".ready").endswith("lobby.ready")
