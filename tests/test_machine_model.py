"""The task state machine against a plain reference model, written from the
documented table independently of gitdrop/machine.py: random operations by
random agents; gitdrop must accept exactly what the model accepts."""

import shutil
import tempfile

from hypothesis import HealthCheck, given, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from gitdrop import hub as hubmod
from gitdrop.errors import GitdropError

LEAD, CODERS = "core/juno", ["core/spartan", "core/kai"]
AGENTS = [LEAD] + CODERS
OPEN = {"pending", "assigned", "in_progress", "review", "failed", "blocked", "feedback"}


def model_next(t, agent, move, assignee):
    """The state after `move`, or None when the reference says it is refused."""
    s, lead = t["state"], agent == LEAD
    creator, owner = agent == t["creator"], agent == t["assignee"]
    if move == "assign":
        return ("assigned", assignee) if s in ("pending", "assigned") and (lead or creator) else None
    if move == "claim":
        return ("assigned", agent) if s == "pending" else None
    if move == "start":
        return ("in_progress", None) if s == "assigned" and owner else None
    if move == "submit":
        return ("review", None) if s == "in_progress" and owner else None
    if move in ("approve", "reject"):
        ok = s == "review" and lead and not owner
        return (("completed" if move == "approve" else "in_progress"), None) if ok else None
    if move == "fail":
        return ("failed", None) if s in ("assigned", "in_progress") and (owner or lead) else None
    if move == "retry":
        ok = s == "failed" and (lead or creator) and t["retries"] < 3
        return ("assigned", assignee) if ok else None  # a retry may hand it to someone else
    if move == "block":
        return ("blocked", None) if s in ("assigned", "in_progress") and (owner or lead) else None
    if move == "unblock":
        return (t["resume"], None) if s == "blocked" and (owner or lead) else None
    if move == "ask":
        return ("feedback", None) if s in ("assigned", "in_progress") and owner else None
    if move == "answer":
        # back to where it was asked from, as an unblock returns it
        return (t["resume"], None) if s == "feedback" and (creator or lead) else None
    if move == "cancel":
        return ("cancelled", None) if s in OPEN and (creator or lead) else None
    if move == "sign":
        return None  # same-team tasks need no sign-off: a sign is always refused
    raise AssertionError(move)


MOVES = ["assign", "claim", "start", "submit", "approve", "reject", "fail", "retry", "block",
         "unblock", "ask", "answer", "cancel", "sign"]


DEEP = ["start", "submit", "approve", "reject", "ask", "answer", "unblock", "retry", "fail"]


class TaskMachine(RuleBasedStateMachine):
    @initialize()
    def setup(self):
        self.dir = tempfile.mkdtemp()
        self.hub = hubmod.init(self.dir + "/hub.git", fsync=False)
        self.room = self.hub.room("lobby")
        self.room.register(LEAD, ["lead"])
        for c in CODERS:
            self.room.register(c, ["coder"])
        self.tasks = {}

    def teardown(self):
        shutil.rmtree(getattr(self, "dir", ""), ignore_errors=True)

    @rule(creator=st.sampled_from(AGENTS), assignee=st.sampled_from([""] + AGENTS + CODERS))
    def create(self, creator, assignee):
        got = self.room.create_task(creator, "a task", assignee=assignee)
        self.tasks[got["id"]] = {"state": "assigned" if assignee else "pending",
                                 "creator": creator, "assignee": assignee, "retries": 0,
                                 "resume": ""}

    @rule(data=st.data(), agent=st.sampled_from(AGENTS), move=st.sampled_from(MOVES),
          assignee=st.sampled_from(AGENTS))
    def move(self, data, agent, move, assignee):
        if not self.tasks:
            return
        self._apply(data.draw(st.sampled_from(sorted(self.tasks))), agent, move, assignee)

    def _apply(self, tid, agent, move, assignee):
        t = self.tasks[tid]
        want = model_next(t, agent, move, assignee)
        try:
            self.room.move_task(agent, tid, move, note="because", assignee=assignee,
                                question="why?", answer="so")
            accepted = True
        except GitdropError:
            accepted = False
        assert accepted == (want is not None), (tid, dict(t), agent, move)
        if accepted:
            state, who = want
            if move in ("block", "ask"):
                t["resume"] = t["state"]
            if move == "retry":
                t["retries"] += 1
            t["state"] = state
            if who:
                t["assignee"] = who

    @rule(data=st.data(), move=st.sampled_from(DEEP * 3 + MOVES))
    def likely_move(self, data, move):
        """Bias towards agents who hold a role on the task, to reach deep states."""
        if not self.tasks:
            return
        tid = data.draw(st.sampled_from(sorted(self.tasks)))
        t = self.tasks[tid]
        who = [a for a in (t["assignee"], t["creator"], LEAD) if a]
        agent = data.draw(st.sampled_from(who))
        self._apply(tid, agent, move, data.draw(st.sampled_from(AGENTS)))

    @rule(data=st.data(), move=st.sampled_from(["approve", "reject"]),
          agent=st.sampled_from(AGENTS))
    def review(self, data, move, agent):
        waiting = sorted(t for t, v in self.tasks.items() if v["state"] == "review")
        if waiting:
            self._apply(data.draw(st.sampled_from(waiting)), agent, move, agent)

    @invariant()
    def matches_repo(self):
        for tid, t in getattr(self, "tasks", {}).items():
            got = self.room.task(tid)
            assert (got["state"], got["assignee"], got["retries"]) == \
                (t["state"], t["assignee"], t["retries"])


TaskMachine.TestCase.settings = settings(max_examples=20, stateful_step_count=50, deadline=None,
                                         suppress_health_check=list(HealthCheck))
test_task_machine = TaskMachine.TestCase


def test_every_move_once(tmp_path):
    """A fixed tour that makes every move of the table once, legally."""
    hub = hubmod.init(str(tmp_path / "hub.git"), fsync=False)
    r = hub.room("lobby")
    r.register(LEAD, ["lead"])
    for c in CODERS:
        r.register(c, ["coder"])
    sp, kai = CODERS
    t = r.create_task(LEAD, "tour")["id"]
    steps = [(LEAD, "assign", {"assignee": kai}, "assigned"), (LEAD, "edit", {"priority": 2}, "assigned"),
             (kai, "start", {}, "in_progress"), (kai, "renew", {"lease": 3600}, "in_progress"),
             (kai, "ask", {"question": "which?"}, "feedback"),
             (LEAD, "answer", {"answer": "this"}, "in_progress"),
             (kai, "block", {"note": "waiting on db"}, "blocked"), (kai, "unblock", {}, "in_progress"),
             (kai, "submit", {}, "review"), (LEAD, "reject", {"note": "tests"}, "in_progress"),
             (kai, "submit", {}, "review"), (LEAD, "approve", {}, "completed")]
    for agent, move, kw, state in steps:
        assert r.move_task(agent, t, move, **kw)["state"] == state, move
    t2 = r.create_task(kai, "second")["id"]
    for agent, move, kw, state in [(sp, "claim", {}, "assigned"), (sp, "fail", {"note": "no"}, "failed"),
                                   (kai, "retry", {}, "assigned"), (kai, "cancel", {}, "cancelled")]:
        assert r.move_task(agent, t2, move, **kw)["state"] == state, move
    assert r.task(t)["priority"] == 2 and r.task(t2)["retries"] == 1
    r.update_room("hub/admin", "room-settings", "leases end at once", settings={"task_lease": 0})
    t3 = r.create_task(kai, "third")["id"]
    for agent, move, kw, state in [(sp, "claim", {}, "assigned"), (kai, "reap", {}, "pending")]:
        assert r.move_task(agent, t3, move, **kw)["state"] == state, move
    assert r.task(t3)["retries"] == 1
    t4 = r.create_task(LEAD, "fourth", review=False)["id"]
    for agent, move, kw, state in [(sp, "claim", {}, "assigned"),
                                   (sp, "release", {"failed": True, "retry_in": 60}, "pending"),
                                   (kai, "claim", {}, "assigned"), (kai, "start", {}, "in_progress"),
                                   (kai, "complete", {}, "completed")]:
        assert r.move_task(agent, t4, move, **kw)["state"] == state, move
    assert r.task(t4)["retries"] == 1
    made = {e["op"] for e in r.log(500)}
    from gitdrop import machine
    assert {"task-" + m for m in machine.MOVES} - made == {"task-sign"}  # sign: see test_hub


def test_move_to_a_target_state(tmp_path):
    """Tools that speak in target states (update_task) find the one move there."""
    hub = hubmod.init(str(tmp_path / "hub.git"), fsync=False)
    r = hub.room("lobby")
    r.register(LEAD, ["lead"])
    r.register(CODERS[0])
    t = r.create_task(LEAD, "x", assignee=CODERS[0])["id"]
    assert r.move_task_to(CODERS[0], t, "in_progress")["state"] == "in_progress"
    assert r.move_task_to(CODERS[0], t, "blocked", note="db down")["state"] == "blocked"
    assert r.move_task_to(CODERS[0], t, "in_progress")["state"] == "in_progress"  # unblock
    import pytest
    from gitdrop.errors import Refusal
    with pytest.raises(Refusal) as e:
        r.move_task_to(CODERS[0], t, "completed")
    assert e.value.rule == "task-state-machine" and "gitdrop task submit" in e.value.fix
    assert r.move_task_to(LEAD, t, "cancelled")["state"] == "cancelled"


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(st.characters(min_codepoint=97, max_codepoint=122), min_size=1),
                       st.one_of(st.text(), st.integers(-10**12, 10**12), st.booleans(),
                                 st.lists(st.text(), max_size=4))))
def test_the_toml_subset_reads_back_what_it_writes(data):
    """Any text (control characters, quotes, non-ASCII, DEL) survives a write and a
    read of the TOML subset unchanged."""
    from gitdrop import fmt
    assert fmt.loads_toml(fmt.dumps_toml(data)) == data


def test_a_refused_move_names_the_moves_its_caller_may_make(team):
    """The fix listed every move from the state, one line of 258 characters with
    'reap (→ reap)', complete for a task that needs review, and reap and cancel for
    an assignee who could make neither."""
    import pytest
    from gitdrop.errors import Refusal
    t = team.create_task("core/juno", "reviewed work", assignee="core/spartan")["id"]
    team.move_task("core/spartan", t, "start")
    with pytest.raises(Refusal) as e:
        team.move_task("core/spartan", t, "approve")
    fix = e.value.fix
    assert fix.startswith("from in_progress you may: submit (→ review)"), fix
    for wrong in ("complete", "reap", "cancel", "(→ reap)", "edit", "renew"):
        assert wrong not in fix, (wrong, fix)


def test_a_move_made_again_says_it_may_have_landed_already(team):
    """A claim, a submit or an approval called again after its answer was lost was
    refused as if it were a mistake ("claim needs pending", "create a new task
    instead"), hiding that the first call had done it."""
    import pytest
    from gitdrop.errors import Refusal
    t = team.create_task("core/juno", "work")["id"]
    team.move_task("core/spartan", t, "claim")
    for agent, move, state, mine in (("core/spartan", "claim", "assigned", True),
                                     ("core/spartan", "start", "in_progress", True),
                                     ("core/spartan", "submit", "review", True),
                                     ("core/juno", "approve", "completed", False)):
        if move != "claim":
            team.move_task(agent, t, move)
        with pytest.raises(Refusal) as e:
            team.move_task(agent, t, move)
        assert e.value.rule == "task-state-machine"
        assert e.value.reason.startswith(f"task {t} is {state} already" +
                                         (", and yours" if mine else " (")), e.value.reason
        assert "may have landed, its answer lost" in e.value.reason
        assert e.value.fix.startswith("nothing to do if so; else "), e.value.fix
    other = team.create_task("core/juno", "other")["id"]
    with pytest.raises(Refusal) as e:   # not where the move leads: said as before
        team.move_task("core/spartan", other, "submit")
    assert e.value.reason == f"task {other} is pending; submit needs in_progress"
    team.move_task("core/spartan", other, "claim")
    team.move_task("core/spartan", other, "start")
    with pytest.raises(Refusal) as e:   # nobody's but its assignee's to have started
        team.move_task("core/kai", other, "start")
    assert e.value.reason == f"task {other} is in_progress; start needs assigned"
