"""Claim leases and the reaper: a claimed task is held while its assignee acts in
the room; once the lease has expired by the hub's clock anyone may reap it back to
pending (a retry; failed past max_retries). Both paths: the core's writes, and a
raw `git push` through the real pre-receive hook."""

import os
import signal
import subprocess
import sys
import time

import pygit2
import pytest

from gitdrop import fmt, hub as hubmod, model
from gitdrop.errors import Refusal
from gitdrop.store import Reader
from gitdrop.verify import check_commits

from conftest import git, refused_rule

LEASE = model.DEFAULT_SETTINGS["task_lease"]


class Clock:
    def __init__(self, t=1_800_000_000):
        self.t = t

    def __call__(self):
        return self.t


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def room(tmp_path, clock):
    h = hubmod.init(str(tmp_path / "hub.git"), fsync=False, clock=clock)
    r = h.room("lobby")
    r.register("core/juno", ["lead"])
    r.register("core/spartan", ["coder"])
    r.register("core/kai", ["coder"])
    r.hub = h
    return r


def test_a_claim_carries_a_lease_and_a_reap_waits_for_it(room, clock):
    t = room.create_task("core/juno", "x")["id"]
    room.move_task("core/spartan", t, "claim")
    assert room.task(t)["lease_until"] == clock.t + LEASE
    clock.t += LEASE - 1
    with pytest.raises(Refusal) as e:
        room.move_task("core/kai", t, "reap")
    assert e.value.rule == "task-lease" and "core/spartan" in e.value.reason
    clock.t += 1
    r = room.move_task("core/kai", t, "reap")
    got = room.task(t)
    assert (r["state"], got["assignee"], got["retries"], got["lease_until"]) == \
        ("pending", "", 1, 0)
    assert "lease of core/spartan expired" in got["note"]
    # the former assignee and the creator are told
    ev = [e for e in room.log(3) if e["op"] == "task-reap"][0]
    from gitdrop import events
    c = room.store.reader.commit(ev["id"])
    assert events.event(room.store.reader, c)["for"] == ["core/spartan", "core/juno"]


def test_any_act_of_the_assignee_renews_and_renew_sets_a_longer_lease(room, clock):
    t = room.create_task("core/juno", "x")["id"]
    room.move_task("core/spartan", t, "claim")
    room.move_task("core/spartan", t, "start")
    clock.t += LEASE - 10
    room.send("core/spartan", "core/juno", "still on it")   # an act: no extra commit needed
    clock.t += LEASE - 10
    with pytest.raises(Refusal):
        room.move_task("core/kai", t, "reap")
    r = room.move_task("core/spartan", t, "renew", lease=4 * LEASE)
    assert r["state"] == "in_progress" and room.task(t)["lease_until"] == clock.t + 4 * LEASE
    clock.t += 3 * LEASE
    assert not room.lease(t)["expired"]
    assert room.hub.reap_tasks() == []
    with pytest.raises(Refusal) as e:
        room.move_task("core/kai", t, "renew")
    assert e.value.rule == "task-state-machine"          # only the assignee renews
    # a renew never holds longer than the room's max_task_lease
    room.move_task("core/spartan", t, "renew", lease=10 ** 9)
    assert room.task(t)["lease_until"] == clock.t + model.DEFAULT_SETTINGS["max_task_lease"]


def test_the_reaper_reaps_and_fails_past_max_retries(room, clock):
    t = room.create_task("core/juno", "x", max_retries=1)["id"]
    room.move_task("core/spartan", t, "claim")
    clock.t += LEASE + 1
    got = room.hub.reap()["reaped"]
    assert [(x["room"], x["id"], x["state"]) for x in got] == [("lobby", t, "pending")]
    assert room.log(1)[0]["author"] == "hub/reaper"
    room.move_task("core/kai", t, "claim")
    clock.t += LEASE + 1
    assert room.hub.reap_tasks()[0]["state"] == "failed"
    got = room.task(t)
    assert (got["state"], got["assignee"], got["retries"]) == ("failed", "core/kai", 1)
    assert "retries used up" in got["note"]
    assert room.hub.reap_tasks() == []
    # re-validating history cannot judge the clock: verify accepts the reaps
    ops = [op for _c, op in room.hub.verify("lobby")]
    assert ops.count("task-reap") == 2


def test_who_tells_health_from_the_last_act_and_the_work(room, clock):
    t = room.create_task("core/juno", "x")["id"]
    room.move_task("core/spartan", t, "claim")
    done = room.create_task("core/juno", "y", assignee="core/kai")["id"]
    room.move_task("core/kai", done, "start")
    room.move_task("core/kai", done, "submit")
    room.move_task("core/juno", done, "approve")
    clock.t += 3000                        # everyone went quiet...
    room.send("core/spartan", "core/juno", "working")   # ...but spartan acts (no ping)
    who = {w["agent"]: w for w in room.who()}
    assert who["core/spartan"]["health"] == "healthy" and who["core/kai"]["health"] == "dead"
    assert who["core/spartan"]["last_act"] == clock.t
    assert who["core/spartan"]["tasks"] == [t] and who["core/spartan"]["last_claimed"] == t
    assert who["core/kai"]["last_completed"] == done and who["core/kai"]["tasks"] == []


# --- a raw git push through the hook --------------------------------------------------

def _reap_doc(c, tid, **over):
    head, body = fmt.loads_doc(c.read(model.task_path(tid)))
    head.update(over)
    c.write(model.task_path(tid), fmt.dumps_doc(head, body))


def _push(c, env=None):
    p = git("push", "origin", f"HEAD:rooms/{c.room}", cwd=c.path, check=False, env=env)
    return p.returncode == 0, p.stderr


def test_a_pushed_reap_is_judged_by_the_hub_clock(hub, team, clone):
    team.update_room("hub/admin", "room-settings", "short leases", settings={"task_lease": 12})
    t = team.create_task("core/juno", "x")["id"]
    c = clone("core/kai")
    team.move_task("core/spartan", t, "claim")
    until = team.task(t)["lease_until"]
    c.pull()
    _reap_doc(c, t, state="pending", assignee="", retries=1, lease_until=0,
              note="lease expired")
    c.commit("reap")
    base = hub.store.room_tip("lobby")
    ok, err = _push(c)
    assert not ok and refused_rule(err) == "task-lease", err
    # dated in the future (within the clock skew): still the hub's clock decides
    future = int(time.time()) + 25
    env = {"GIT_COMMITTER_DATE": f"{future} +0000", "GIT_AUTHOR_DATE": f"{future} +0000"}
    git("commit", "-q", "--amend", "--no-edit", cwd=c.path, env=env)
    ok, err = _push(c)
    assert not ok and refused_rule(err) == "task-lease", err
    # in process, at receipt, the same verdict; re-validating (no clock) cannot judge
    with pytest.raises(Refusal) as e:
        check_commits(Reader(pygit2.Repository(c.path)), model.ROOM_PREFIX + "lobby", base,
                      c.head(), now=int(time.time()))
    assert e.value.rule == "task-lease"
    assert time.time() < until, "too slow to test a refusal before expiry"
    time.sleep(max(0.0, until + 1.2 - time.time()))
    git("commit", "-q", "--amend", "--no-edit", "--reset-author", cwd=c.path)
    ok, err = _push(c)
    assert ok, err
    got = team.task(t)
    assert (got["state"], got["assignee"], got["retries"]) == ("pending", "", 1)
    assert hub.verify("lobby")[-1][1] == "task-reap"   # inferred from the diff
    check_commits(hub.store.reader, model.ROOM_PREFIX + "lobby", base, c.head())


def test_a_pushed_renew_and_its_bound(hub, team, clone):
    t = team.create_task("core/juno", "x", assignee="core/spartan")["id"]
    c = clone("core/spartan")
    _reap_doc(c, t, lease_until=int(time.time()) + 10 * 86400)
    c.commit("hold it for ten days")
    ok, err = _push(c)
    assert not ok and refused_rule(err) == "task-lease", err
    c.pull()
    _reap_doc(c, t, lease_until=int(time.time()) + 7200)
    c.commit("hold it two hours")
    ok, err = _push(c)
    assert ok, err
    assert hub.verify("lobby")[-1][1] == "task-renew"
    c.pull().as_("core/kai")
    _reap_doc(c, t, lease_until=int(time.time()) + 9000)
    c.commit("not mine")
    ok, err = _push(c)
    assert not ok and refused_rule(err) == "task-state-machine", err


WORKER = r"""
import sys, time
from gitdrop import hub as hubmod
room = hubmod.Hub(sys.argv[1]).room("lobby")
room.move_task("core/spartan", sys.argv[2], "claim")
room.move_task("core/spartan", sys.argv[2], "start")
print("started", flush=True)
time.sleep(600)
"""


def test_a_killed_worker_s_task_is_reaped_and_done_by_another(hub, team):
    team.update_room("hub/admin", "room-settings", "short leases", settings={"task_lease": 6})
    t = team.create_task("core/juno", "x")["id"]
    p = subprocess.Popen([sys.executable, "-c", WORKER, hub.path, t], stdout=subprocess.PIPE,
                         text=True, cwd=os.path.dirname(os.path.dirname(__file__)))
    try:
        assert p.stdout.readline().strip() == "started"
        os.kill(p.pid, signal.SIGKILL)
        p.wait(10)
        assert team.task(t)["state"] == "in_progress"
        until = team.task(t)["lease_until"]
        if time.time() < until - 1:
            assert hub.reap_tasks() == []              # still held
        time.sleep(max(0.0, until + 1.2 - time.time()))
        assert [x["id"] for x in hub.reap_tasks()] == [t]
    finally:
        if p.poll() is None:
            p.kill()
    team.move_task("core/kai", t, "claim")
    team.move_task("core/kai", t, "start")
    team.move_task("core/kai", t, "submit", note="done")
    team.move_task("core/juno", t, "approve")
    got = team.task(t)
    assert (got["state"], got["assignee"], got["retries"]) == ("completed", "core/kai", 1)


def test_the_tasks_of_an_agent_that_left_are_listed_and_reaped_at_once(room, clock):
    """An agent left holding a task in progress: the lead could not assign it, release
    it ("only core/spartan can"), reap it (half an hour to wait), or even list it by its
    assignee ("not registered")."""
    t = room.create_task("core/juno", "half done")["id"]
    room.move_task("core/spartan", t, "claim")
    room.move_task("core/spartan", t, "start")
    r = room.deregister("core/spartan")
    assert r["held"] == [t]
    assert [x["id"] for x in room.list_tasks(assignee="core/spartan")] == [t]
    got = room.move_task("core/kai", t, "reap")   # at once: its holder is gone
    assert got["state"] == "pending" and room.task(t)["assignee"] == ""
    # one held by an agent still here is not: its lease runs as before
    u = room.create_task("core/juno", "mine")["id"]
    room.move_task("core/kai", u, "claim")
    with pytest.raises(Refusal) as e:
        room.move_task("core/juno", u, "reap")
    assert e.value.rule == "task-lease"
