"""Dependencies, capabilities and the ready queue. Every rule on both paths: the
core's writes and a raw `git push` through the real pre-receive hook."""

import json
import os
import subprocess
import sys

import pytest

from gitdrop import events, fmt, model
from gitdrop.errors import Refusal

from conftest import refused_rule


def _rule(fn, *a, **kw):
    with pytest.raises(Refusal) as e:
        fn(*a, **kw)
    return e.value


def _done(room, tid, who="core/spartan"):
    """Take task `tid` to completed (claimed by `who`, approved by the lead)."""
    if room.task(tid)["state"] == "pending":
        room.move_task(who, tid, "claim")
    room.move_task(who, tid, "start")
    room.move_task(who, tid, "submit", note="done")
    room.move_task("core/juno", tid, "approve")


# --- the core's path -----------------------------------------------------------

def test_a_dependency_must_exist_and_must_not_close_a_cycle(team):
    a = team.create_task("core/juno", "a")["id"]
    b = team.create_task("core/juno", "b", after=[a])["id"]
    e = _rule(team.create_task, "core/juno", "c", after=["99"])
    assert e.rule == "task-dependency" and "task 99, which does not exist" in e.reason
    e = _rule(team.create_task, "core/juno", "c", after=[a, a])
    assert e.rule == "task-dependency" and "twice" in e.reason
    c = team.create_task("core/juno", "c", after=[b])["id"]
    e = _rule(team.move_task, "core/juno", a, "edit", after=[c])   # a → c → b → a
    assert e.rule == "task-dependency" and "cycle" in e.reason
    assert f"{a} → {c} → {b} → {a}" in e.reason
    e = _rule(team.move_task, "core/juno", a, "edit", after=[a])
    assert e.rule == "task-dependency" and "itself" in e.reason
    assert "gitdrop task graph" in e.fix
    # a change that closes no cycle is fine, and so is a parent
    d = team.create_task("core/juno", "d", parent=a)["id"]
    team.move_task("core/juno", d, "edit", after=[b, c])
    assert team.task(d)["after"] == [b, c] and team.task(d)["parent"] == a
    e = _rule(team.create_task, "core/juno", "e", parent="77")
    assert e.rule == "task-dependency" and "parent" in e.reason


def test_no_claim_or_start_before_the_dependencies_complete(team):
    a = team.create_task("core/juno", "a")["id"]
    b = team.create_task("core/juno", "b", after=[a])["id"]
    e = _rule(team.move_task, "core/kai", b, "claim")
    assert e.rule == "task-dependency" and f"waits on task {a}" in e.reason
    assert "gitdrop ready" in e.fix
    # a lead may assign ahead of time; the start still waits
    team.move_task("core/juno", b, "assign", assignee="core/kai")
    e = _rule(team.move_task, "core/kai", b, "start")
    assert e.rule == "task-dependency" and "cannot start" in e.reason
    assert team.task(b)["waiting_on"] == [a]
    _done(team, a)
    assert team.task(b)["waiting_on"] == []
    team.move_task("core/kai", b, "start")
    assert team.task(b)["state"] == "in_progress"


def test_a_failed_dependency_blocks_its_dependents_until_it_is_redone(team):
    a = team.create_task("core/juno", "a", max_retries=1)["id"]
    b = team.create_task("core/juno", "b", after=[a])["id"]
    team.move_task("core/spartan", a, "claim")
    team.move_task("core/spartan", a, "fail", note="the schema is wrong")
    got = team.task(b)
    assert got["state"] == "pending" and got["blocked_by"] == f"task {a} failed: the schema is wrong"
    listed = {t["id"]: t for t in team.list_tasks()}
    assert listed[b]["blocked_by"].startswith(f"task {a} failed")
    e = _rule(team.move_task, "core/kai", b, "claim")
    assert e.rule == "task-dependency" and "failed" in e.reason and "retry" in e.fix
    assert team.ready("core/kai") == []
    team.move_task("core/juno", a, "retry")   # back to its assignee; blocked no more
    assert team.task(b)["blocked_by"] == "" and team.task(b)["waiting_on"] == [a]
    _done(team, a)
    assert [t["id"] for t in team.ready("core/kai")] == [b]


def test_capabilities_route_work_and_a_required_one_is_a_rule(team):
    team.register("core/kai", caps=["db", "backend"])
    assert team.view().agent("core/kai")["caps"] == ["db", "backend"]
    t = team.create_task("core/juno", "migrate", requires=["db"])["id"]
    e = _rule(team.move_task, "core/spartan", t, "claim")
    assert e.rule == "task-capability" and "core/spartan lacks db" in e.reason
    assert "register --cap" in e.fix
    e = _rule(team.move_task, "core/juno", t, "assign", assignee="core/spartan")
    assert e.rule == "task-capability"
    e = _rule(team.create_task, "core/juno", "x", requires=["db"], assignee="core/spartan")
    assert e.rule == "task-capability"
    assert team.ready("core/spartan") == []
    assert [x["id"] for x in team.list_tasks(able="core/spartan")] == []
    assert [x["id"] for x in team.list_tasks(able="core/kai")] == [t]
    team.move_task("core/kai", t, "claim")
    # a re-registration without --cap keeps them; with, replaces them
    team.register("core/kai", description="db person")
    assert team.view().agent("core/kai")["caps"] == ["db", "backend"]
    team.register("core/kai", caps=["docs"])
    assert team.view().agent("core/kai")["caps"] == ["docs"]
    e = _rule(team.register, "core/kai", caps=["bad name"])
    assert e.rule in ("format", "usage")
    who = {a["agent"]: a for a in team.who()}
    assert who["core/kai"]["caps"] == ["docs"]


def test_ready_orders_by_priority_then_age_and_puts_own_work_first(team):
    low = team.create_task("core/juno", "low")["id"]
    high = team.create_task("core/juno", "high", priority=5)["id"]
    high2 = team.create_task("core/juno", "high, later", priority=5)["id"]
    mine = team.create_task("core/juno", "mine", assignee="core/kai")["id"]
    team.create_task("core/juno", "someone else's", assignee="core/spartan")
    team.create_task("core/juno", "tagged", tags=["ui"])
    team.create_task("core/juno", "waits", after=[low])
    got = [t["id"] for t in team.ready("core/kai")]
    assert got[:4] == [mine, high, high2, low] and len(got) == 5
    assert [t["title"] for t in team.ready("core/kai", tag="ui")] == ["tagged"]
    r = team.claim_next("core/kai")
    assert r == dict(r, task=mine, claimed=False)   # its own assigned task first
    team.move_task("core/kai", mine, "start")
    r = team.claim_next("core/kai")                  # in progress: still its work to do
    assert r == dict(r, task=mine, claimed=False, state="in_progress")
    team.move_task("core/kai", mine, "submit", note="done")
    r = team.claim_next("core/kai")
    assert (r["task"], r["claimed"]) == (high, True)
    assert team.task(high)["assignee"] == "core/kai"


def test_claim_next_moves_on_when_a_race_is_lost(team):
    a = team.create_task("core/juno", "a", priority=2)["id"]
    b = team.create_task("core/juno", "b", priority=1)["id"]
    real = team.move_task
    raced = []

    def racing(agent, tid, move, **kw):   # someone else claims the best task first
        if move == "claim" and not raced:
            raced.append(tid)
            real("core/spartan", tid, "claim")
        return real(agent, tid, move, **kw)
    team.move_task = racing
    r = team.claim_next("core/kai")
    assert raced == [a] and (r["task"], r["claimed"], r["lost"]) == (b, True, 1)
    assert team.task(a)["assignee"] == "core/spartan"
    assert team.claim_next("core/kai")["task"] == b   # its own now; nothing else is ready
    team.move_task("core/kai", b, "start")
    team.move_task("core/kai", b, "submit", note="done")
    assert team.claim_next("core/kai") == dict(team.claim_next("core/kai"), task="")


def test_a_waiting_task_is_not_reaped_and_a_completion_renews_its_lease(tmp_path):
    r, clock, lease = _lease_room(tmp_path)
    a = r.create_task("core/juno", "a")["id"]
    b = r.create_task("core/juno", "b", after=[a], assignee="core/kai")["id"]
    clock.t += lease + 100
    assert r.lease(b)["expired"] is False and r.lease(b)["waiting_on"] == [a]
    e = _rule(r.move_task, "core/spartan", b, "reap")
    assert e.rule == "task-lease" and "waits on" in e.reason
    assert r.reap_leases() == []
    _done(r, a)
    clock.t += lease - 5    # the completion of a renewed b's lease
    assert r.lease(b)["expired"] is False
    clock.t += 10
    assert r.lease(b)["expired"] is True
    assert [x["task"] for x in r.reap_leases()] == [b]


def _lease_room(tmp_path):
    from test_task_lease import Clock
    from gitdrop import hub as hubmod
    clock = Clock()
    h = hubmod.init(str(tmp_path / "hub.git"), fsync=False, clock=clock)
    r = h.room("lobby")
    for a, role in (("core/juno", "lead"), ("core/spartan", "coder"), ("core/kai", "coder")):
        r.register(a, [role])
    return r, clock, model.DEFAULT_SETTINGS["task_lease"]


def test_a_task_waiting_on_one_that_waits_on_a_cancelled_one_is_stuck_not_waiting(tmp_path):
    """Only a cancelled or failed dependency of its own made a task stuck: one waiting
    on a task that waits on a cancelled one was held past every reap."""
    r, clock, lease = _lease_room(tmp_path)
    a = r.create_task("core/juno", "a")["id"]
    p = r.create_task("core/juno", "p", after=[a])["id"]
    b = r.create_task("core/juno", "b", after=[p], assignee="core/kai")["id"]
    r.move_task("core/juno", a, "cancel", note="not needed after all")
    clock.t += lease + 100
    assert r.lease(b)["waiting_on"] == [] and r.lease(b)["expired"] is True
    assert [x["task"] for x in r.reap_leases()] == [b]


def test_a_dependency_completed_without_review_renews_the_waiting_lease(tmp_path):
    """Only an approval counted: a dependency finished by `complete` (no review, as
    worker pipelines run) left the waiting task to be reaped the same second."""
    r, clock, lease = _lease_room(tmp_path)
    a = r.create_task("core/juno", "a", review=False)["id"]
    b = r.create_task("core/juno", "b", after=[a], assignee="core/kai")["id"]
    clock.t += lease + 100
    r.move_task("core/spartan", a, "claim")
    r.move_task("core/spartan", a, "start")
    r.move_task("core/spartan", a, "complete")
    assert r.task(a)["state"] == "completed"
    assert r.lease(b)["expired"] is False
    assert _rule(r.move_task, "core/spartan", b, "reap").rule == "task-lease"


def test_what_a_task_waits_on_is_its_creator_s_or_a_lead_s_to_change(team):
    """Its assignee dropped a dependency to start early, or pointed a task in progress
    at one nobody would do, holding it past every reap."""
    a = team.create_task("core/juno", "a")["id"]
    b = team.create_task("core/juno", "b", after=[a], assignee="core/kai")["id"]
    e = _rule(team.move_task, "core/kai", b, "edit", after=[])
    assert e.rule == "task-state-machine" and "waits on" in e.reason
    team.move_task("core/juno", b, "edit", after=[])
    assert team.task(b)["after"] == []


def test_a_change_of_dependencies_is_judged_only_below_a_reach(team, monkeypatch):
    """Each edit of `after` walked the whole chain above it: one push of 1,000 edits on
    a chain of 5,000 tasks held the hook 71 s, and verify twice that."""
    from gitdrop import deps
    monkeypatch.setattr(deps, "MAX_REACH", 5)
    ids = [team.create_task("core/juno", "t0")["id"]]
    for i in range(1, 9):
        ids.append(team.create_task("core/juno", f"t{i}", after=[ids[-1]])["id"])
    extra = team.create_task("core/juno", "extra")["id"]
    e = _rule(team.move_task, "core/juno", ids[-1], "edit", after=[ids[-2], extra])
    assert e.rule == "task-dependency" and "more than 5 tasks" in e.reason
    team.move_task("core/juno", ids[2], "edit", after=[ids[1], extra])   # a short reach
    text = deps.graph_text(team.graph())
    assert max(len(ln) - len(ln.lstrip()) for ln in text.splitlines()) <= 2 * deps.INDENT_MOST


def test_a_completion_wakes_the_dependents_assignees_and_the_able(team):
    team.register("core/kai", caps=["db"])
    a = team.create_task("core/juno", "a")["id"]
    b = team.create_task("core/juno", "b", after=[a], assignee="core/spartan")["id"]
    team.create_task("core/juno", "c", after=[a], requires=["db"])
    team.create_task("core/juno", "d", after=[a, b])    # still waits on b: nobody woken
    team.move_task("core/spartan", a, "claim")
    team.move_task("core/spartan", a, "start")
    team.move_task("core/spartan", a, "submit", note="ok")
    team.inbox("core/kai")
    team.register("core/lee", caps=[])   # could take c? no: it lacks db
    approved = team.move_task("core/juno", a, "approve")
    reader = team.store.reader
    ev = events.event(reader, reader.commit(approved["commit"]))
    assert ev["for"] == ["core/spartan", events.ABLE + "db"]
    assert events.concerns(ev, "core/kai", False, ["db"]) == "notice"
    assert events.concerns(ev, "core/lee", False, []) == ""
    got = team.inbox("core/kai")["messages"]
    assert any(m["op"] == "task-approve" and m["task"] == a for m in got)
    assert not [m for m in team.inbox("core/lee")["messages"] if m["op"] == "task-approve"]
    assert [m for m in team.inbox("core/spartan")["messages"] if m["op"] == "task-approve"]


def test_the_graph_as_text_json_and_dot(team):
    a = team.create_task("core/juno", "schema")["id"]
    b = team.create_task("core/juno", "api", after=[a])["id"]
    c = team.create_task("core/juno", "docs \"v2\"", after=[a, b])["id"]
    lone = team.create_task("core/juno", "lone")["id"]
    from gitdrop import deps
    g = team.graph()
    assert sorted(map(tuple, g["edges"])) == sorted([(b, a), (c, a), (c, b)])
    text = deps.graph_text(g).splitlines()
    assert text[0].startswith(f"#{a} [pending] schema")
    assert any(line.startswith(f"  #{b} [pending] api (waits on {a})") for line in text)
    assert any(line.startswith(f"#{lone} ") for line in text)
    sub = team.graph(b)
    assert {n["id"] for n in sub["nodes"]} == {a, b, c}
    dot = deps.graph_dot(g)
    assert f'"t{a}" -> "t{b}";' in dot and "docs 'v2'" in dot
    if _has_dot():
        p = subprocess.run(["dot", "-Tsvg"], input=dot, capture_output=True, text=True)
        assert p.returncode == 0, p.stderr


def _has_dot():
    from shutil import which
    return which("dot") is not None


# --- a raw git push, through the real hook ---------------------------------------

def _task_doc(c, tid, **over):
    head, body = fmt.loads_doc(c.read(model.task_path(tid)))
    head.update(over)
    c.write(model.task_path(tid), fmt.dumps_doc(head, body))


def test_pushed_dependencies_and_capabilities_meet_the_same_rules(hub, team, clone):
    a = team.create_task("core/juno", "a")["id"]
    b = team.create_task("core/juno", "b", after=[a])["id"]
    t = team.create_task("core/juno", "db work", requires=["db"])["id"]
    lead = clone("core/juno")
    # a new task waiting on a task that does not exist
    head, _ = fmt.loads_doc(lead.read(model.task_path(a)))
    head.update(id="50", title="by hand", after=["99"])
    lead.write(model.task_path(50), fmt.dumps_doc(head, "x"))
    lead.commit("a task by hand")
    ok, err = lead.push()
    assert not ok and refused_rule(err) == "task-dependency" and "does not exist" in err, err
    lead.pull()
    # an edit that closes a cycle
    _task_doc(lead, a, after=[b])
    lead.commit("a waits on b")
    ok, err = lead.push()
    assert not ok and refused_rule(err) == "task-dependency" and "cycle" in err, err
    lead.pull()
    # a claim by hand before the dependency completed
    kai = clone("core/kai")
    _task_doc(kai, b, state="assigned", assignee="core/kai", lease_until=0)
    kai.commit("claim b")
    ok, err = kai.push()
    assert not ok and refused_rule(err) == "task-dependency", err
    kai.pull()
    # a claim by hand without the required capability
    _task_doc(kai, t, state="assigned", assignee="core/kai")
    kai.commit("claim the db task")
    ok, err = kai.push()
    assert not ok and refused_rule(err) == "task-capability" and "lacks db" in err, err
    kai.pull()
    # a start by hand of a task assigned ahead of time
    team.move_task("core/juno", b, "assign", assignee="core/kai")
    kai.pull()
    _task_doc(kai, b, state="in_progress")
    kai.commit("start b")
    ok, err = kai.push()
    assert not ok and refused_rule(err) == "task-dependency", err
    kai.pull()
    # capabilities declared by hand: checked too, and then the claim goes through
    path = model.agent_path("core/kai")
    doc = fmt.loads_toml(kai.read(path))
    kai.write(path, fmt.dumps_toml(dict(doc, caps=["db", "db"])))
    kai.commit("caps")
    ok, err = kai.push()
    assert not ok and refused_rule(err) == "format", err
    kai.pull()
    kai.write(path, fmt.dumps_toml(dict(doc, caps=["db"])))
    kai.commit("caps")
    ok, err = kai.push()
    assert ok, err
    _task_doc(kai, t, state="assigned", assignee="core/kai", lease_until=0)
    kai.commit("claim the db task")
    ok, err = kai.push()
    assert ok, err
    assert team.task(t)["assignee"] == "core/kai"


# --- the command line -----------------------------------------------------------

def _gd(hub, agent, *args):
    env = dict(os.environ, GITDROP_HUB=hub.path, GITDROP_ROOM="lobby", GITDROP_AGENT=agent)
    return subprocess.run([sys.executable, "-m", "gitdrop.cli.main", *args], env=env,
                          capture_output=True, text=True)


def test_the_cli_ready_claim_graph_and_edit(hub, team):
    p = _gd(hub, "core/kai", "register", "core/kai", "--cap", "db,ui")
    assert p.returncode == 0, p.stderr
    a = _gd(hub, "core/juno", "task", "create", "schema", "--requires", "db").stdout.strip()
    b = _gd(hub, "core/juno", "task", "create", "api", "--after", a).stdout.strip()
    p = _gd(hub, "core/juno", "task", "edit", a, "--after", b)
    assert p.returncode == 3 and "task-dependency" in p.stderr and "cycle" in p.stderr
    p = _gd(hub, "core/spartan", "ready")
    assert p.returncode == 0 and "nothing is ready for core/spartan" in p.stdout
    p = _gd(hub, "core/kai", "ready", "--json")
    assert [t["id"] for t in json.loads(p.stdout)["tasks"]] == [a]
    p = _gd(hub, "core/kai", "ready", "--claim")
    assert p.returncode == 0 and f"claimed task {a}: schema" in p.stdout, p.stderr
    assert f"gitdrop task start {a}" in p.stdout
    p = _gd(hub, "core/kai", "task", "graph")
    assert p.stdout.splitlines()[:2] == [f"#{a} [assigned] @core/kai schema",
                                         f"  #{b} [pending] api (waits on {a})"]
    p = _gd(hub, "core/kai", "task", "graph", "--json")
    assert json.loads(p.stdout)["edges"] == [[b, a]]
    p = _gd(hub, "core/kai", "task", "list")
    assert "waits on" in p.stdout and "needs db" in p.stdout
    p = _gd(hub, "core/kai", "who")
    assert "db, ui" in p.stdout
    p = _gd(hub, "core/juno", "task", "edit", b)
    assert p.returncode == 2 and "nothing to change" in p.stderr


def test_the_notifier_wakes_whoever_can_take_a_task_that_became_ready(hub, team):
    from gitdrop.notifier import Notifier
    team.register("core/kai", caps=["db"])
    a = team.create_task("core/juno", "a", review=False)["id"]
    team.create_task("core/juno", "b", after=[a], requires=["db"])
    team.move_task("core/spartan", a, "claim")
    team.move_task("core/spartan", a, "start")
    got = {"kai": [], "juno": []}
    n = Notifier(hub.path)
    n.subscribe("lobby", "core/kai", lambda evs: got["kai"].extend(evs))
    n.subscribe("lobby", "core/juno", lambda evs: got["juno"].extend(evs))
    n.scan()
    done = team.move_task("core/spartan", a, "complete", note="done")
    n.scan()
    assert [(e["op"], e["id"]) for e in got["kai"]] == [("task-complete", done["commit"])]
    assert [e["op"] for e in got["juno"]] == ["task-complete"]   # the creator is told too


def test_a_claim_hint_keeps_the_agent_and_names_the_step_for_the_state(hub, team):
    """`ready --claim` of a task already in progress said `next: gitdrop task start 3`
    (refused); and a hint without the --as it was given acted as the environment's
    agent when pasted."""
    a = team.create_task("core/juno", "in progress", assignee="core/kai")["id"]
    team.move_task("core/kai", a, "start")
    env = dict(os.environ, GITDROP_HUB=hub.path, GITDROP_ROOM="lobby", GITDROP_AGENT="core/juno")
    p = subprocess.run([sys.executable, "-m", "gitdrop.cli.main", "--as", "kai", "ready",
                        "--claim"], env=env, capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.splitlines()[-1] == \
        f"next: gitdrop --as kai task submit {a}", p.stdout + p.stderr


def test_an_assignee_refused_a_start_for_a_dependency_is_told_the_task_stays_its(team):
    """The fix told the task's own assignee to take another task instead, as if it
    had lost this one."""
    a = team.create_task("core/juno", "a")["id"]
    b = team.create_task("core/juno", "b", after=[a], assignee="core/kai")["id"]
    e = _rule(team.move_task, "core/kai", b, "start")
    assert e.rule == "task-dependency" and e.fix.startswith("start it once they are: it is "
                                                            "yours meanwhile"), e.fix
    c = team.create_task("core/juno", "c", after=[a])["id"]
    assert _rule(team.move_task, "core/kai", c, "claim").fix == \
        "take a ready task instead (gitdrop ready)"
