"""The state is the fold of the history: re-checking a room from its first
commit gives the same verdicts, any past state can be read, and racing writers
never lose an update."""

import os
import subprocess
import sys
import time

from gitdrop import fmt, model
from gitdrop.errors import Refusal
from gitdrop.verify import check_commits

from conftest import git, refused_rule


def busy_room(lobby, clone):
    lobby.register("core/juno", ["lead"])
    lobby.register("core/spartan", ["coder"])
    lobby.register("core/kai", ["coder"])
    h = lobby.start_handshake("core/juno", "plan", ["core/spartan", "core/kai"])
    t = lobby.create_task("core/juno", "parser", assignee="core/spartan", handshake=h["id"])
    lobby.ack_handshake("core/spartan", h["id"])
    lobby.ack_handshake("core/kai", h["id"])
    lobby.move_task("core/spartan", t["id"], "start")
    lobby.send("core/juno", "@core", "go team")
    lobby.inbox("core/spartan")
    lobby.send("core/spartan", "juno", "on it", task=t["id"])
    lobby.declare_contract("core/kai", "api", "GET /x", kind="api_endpoint")
    lobby.set_context("core/juno", "stack", "python")
    c = clone("core/kai")
    c.write(model.task_path(99), fmt.dumps_doc({"id": "99", "title": "by hand", "creator": "core/kai"},
                                         "body")).commit("hand task")
    assert c.push()[0]
    lobby.move_task("core/spartan", t["id"], "submit", note="done")
    lobby.move_task("core/juno", t["id"], "approve")
    return t


def test_revalidating_from_first_commit_reproduces_verdicts(hub, lobby, clone):
    busy_room(lobby, clone)
    verdicts = hub.verify("lobby")
    logged = [e["op"] for e in lobby.log(1000)]
    assert [op for _oid, op in verdicts][1:] == [op or "task-create" for op in logged[1:]]
    assert verdicts[0][1] == "room-create"
    assert "task-create" in [op for _o, op in verdicts]  # the hand-pushed one, inferred


def test_a_refused_commit_stays_refused_as_history_moves_on(hub, lobby, clone):
    busy_room(lobby, clone)
    c = clone("core/kai")
    base = c.head()
    c.commit(fmt.format_message("hi", "hi", [("op", "send"), ("to", "core/ghost")]),
             allow_empty=True)
    ok, err = c.push()
    assert not ok and refused_rule(err) == "unknown-recipient"
    bad = c.head()
    lobby.inbox("core/juno")
    lobby.send("core/juno", "all", "more history")
    lobby.register("core/ghost")
    # judged against its own parent, the verdict does not depend on the room's tip
    git("fetch", "-q", c.path, f"{bad}:refs/gitdrop-test/bad", cwd=hub.path)
    try:
        check_commits(hub.store.reader, model.ROOM_PREFIX + "lobby", base, bad)
        raise AssertionError("accepted")
    except Refusal as e:
        assert e.rule == "unknown-recipient"


def test_any_past_state_can_be_read(hub, lobby, clone):
    t = busy_room(lobby, clone)
    log = lobby.log(1000)
    before_submit = next(e["id"] for e in log if e["subject"].startswith(
        f"task {t['id']} in_progress → review"))
    old = lobby.view(before_submit + "~1")
    assert old.task(t["id"])[0]["state"] == "in_progress"
    assert lobby.view().task(t["id"])[0]["state"] == "completed"
    first = lobby.view(log[0]["id"])
    assert first.agents() == [] and first.task_ids() == []


RACE_PRELUDE = r"""
import sys, time
from gitdrop.hub import Hub
from gitdrop.errors import Conflict, Refusal
room = Hub(sys.argv[1]).room("lobby")
args = sys.argv[3:]
while time.time() < float(sys.argv[2]):
    pass
"""


def race(tmp_path, hub_path: str, body: str, argvs) -> list[str]:
    """Run `body` in one process per argv, all released at the same instant, each
    with `room` (the hub's lobby) and `args` (its argv); returns their outputs."""
    script = tmp_path / "racer.py"
    script.write_text(RACE_PRELUDE + body)
    start = str(time.time() + 1.0)
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    procs = [subprocess.Popen([sys.executable, str(script), hub_path, start, *argv],
                              stdout=subprocess.PIPE, text=True, env=env) for argv in argvs]
    return [p.communicate(timeout=60)[0] for p in procs]


RACER = r"""
agent, tasks = args[0], args[1:]
for t in tasks:
    try:
        room.move_task(agent, t, "claim")
        print(t, "won")
    except Refusal as e:
        print(t, "lost", e.reason)
"""


def test_two_processes_claim_one_task_exactly_one_wins(hub, lobby, tmp_path):
    lobby.register("core/juno", ["lead"])
    lobby.register("core/spartan")
    lobby.register("core/kai")
    ids = [lobby.create_task("core/juno", f"t{i}")["id"] for i in range(15)]
    outs = race(tmp_path, hub.path, RACER, [[a, *ids] for a in ("core/spartan", "core/kai")])
    results = {}
    for agent, out in zip(("core/spartan", "core/kai"), outs):
        for line in out.splitlines():
            tid, verdict, *why = line.split(" ", 2)
            results.setdefault(tid, []).append((agent, verdict, why[0] if why else ""))
    for tid in ids:
        got = results[tid]
        winners = [a for a, v, _ in got if v == "won"]
        assert len(winners) == 1, got
        loser = [(a, why) for a, v, why in got if v == "lost"]
        assert len(loser) == 1 and winners[0] in loser[0][1]   # told who won
        assert lobby.task(tid)["assignee"] == winners[0]
    claims = [e for e in lobby.log(1000) if e["op"] == "task-claim"]
    assert len(claims) == len(ids)                               # no lost or double claim


def test_a_retried_operation_with_the_same_key_is_applied_once(lobby):
    lobby.register("core/juno", ["lead"])
    lobby.register("core/spartan")
    first = lobby.send("core/juno", "spartan", "deploy at 5", key="k-1")
    again = lobby.send("core/juno", "spartan", "deploy at 5", key="k-1")
    assert again["replayed"] is True and again["commit"] == first["commit"]
    assert again["to"] == ["core/spartan"]
    t = lobby.create_task("core/juno", "once", assignee="spartan", key="k-2")
    t2 = lobby.create_task("core/juno", "once", assignee="spartan", key="k-2")
    assert t2["id"] == t["id"] and t2["state"] == "assigned"
    m = lobby.move_task("core/spartan", t["id"], "start", key="k-3")
    m2 = lobby.move_task("core/spartan", t["id"], "start", key="k-3")   # not refused
    assert (m2["from"], m2["state"], m2["commit"]) == ("assigned", "in_progress", m["commit"])
    assert len([e for e in lobby.history(50) if e["text"] == "deploy at 5"]) == 1
    assert len(lobby.list_tasks()) == 1
    other = lobby.send("core/juno", "spartan", "deploy at 6", key="k-4")
    assert "replayed" not in other


KEYED = r"""
for i in range(10):
    r = room.send("core/juno", "all", f"note {i}", key=f"same-{i}")
    print(r["commit"], r.get("replayed", False))
"""


def test_racing_retries_with_one_key_land_once(hub, lobby, tmp_path):
    """Two processes send the same keyed operations at once: each lands once."""
    lobby.register("core/juno", ["lead"])
    lobby.update_room("hub/admin", "room-settings", "no cap", settings={"loop_cap": 0})
    outs = [out.split("\n") for out in race(tmp_path, hub.path, KEYED, [[]] * 2)]
    a, b = ([line.split()[0] for line in out if line] for out in outs)
    assert a == b                                   # both were told the same commits
    texts = [e["text"] for e in lobby.history(100)]
    assert sorted(texts) == sorted(f"note {i}" for i in range(10))


REGISTRAR = r"""
me, names = args[0], args[1:]
for n in names:
    try:
        room.register(n, ["coder"], f"by {me}", new_only=True)
        print(n, "won")
    except Conflict:
        print(n, "lost")
"""


def test_two_processes_register_one_new_name_exactly_one_joins(hub, lobby, tmp_path):
    """What a new agent's first registration over HTTP relies on (it mints the token):
    the loser of the race changes nothing, not even the winner's description."""
    names = [f"core/n{i}" for i in range(12)]
    outs = dict(zip(("a", "b"), race(tmp_path, hub.path, REGISTRAR,
                                     [[me, *names] for me in ("a", "b")])))
    view = lobby.view()
    for n in names:
        won = [me for me, out in outs.items() if f"{n} won" in out.splitlines()]
        assert len(won) == 1, outs
        assert view.agent(n)["description"] == f"by {won[0]}"
    ops = [e["op"] for e in lobby.log(1000)]
    assert ops.count("register") == len(names) and "status" not in ops


def test_history_of_a_task_reaches_back_only_as_far_as_asked(team):
    """A filter matching little walks the whole room: the board bounds the walk
    (reach), so a task with no messages cannot hold it for seconds."""
    t = team.create_task("core/juno", "an old one")
    for k in range(3):
        team.send("core/juno", "core/kai", f"about it {k}", task=t["id"])
        team.inbox("core/juno")
        team.inbox("core/kai")
    for k in range(6):
        team.send("core/juno", "core/kai", f"other {k}")
        team.inbox("core/kai")
    assert len(team.history(100, task=t["id"])) == 3
    assert team.history(100, task=t["id"], reach=6) == []
    assert [m["text"] for m in team.history(100, reach=6)] == [f"other {k}" for k in range(3, 6)]
