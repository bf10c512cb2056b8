"""The hub's rules through a raw `git push` into a real hub with its hook:
membership, dual-sign, the team registry on refs/heads/hub, archived room names,
full names in trailers, and the loop guard with commits dated by hand."""

import os
import time

import pytest

from gitdrop import fmt, model

from conftest import Clone, git, refused_rule


def msg(text, to, op="send"):
    return fmt.format_message(text, text, [("op", op), ("to", to)])


@pytest.fixture
def proj(hub):
    """Room proj of team core (lead juno); team web (lead ana) exists but is not in it."""
    hub.register_team("core", "juno", ["spartan", "kai"])
    hub.register_team("web", "ana", ["spartan"])
    hub.create_room("hub/admin", "proj", teams=["core"])
    r = hub.room("proj")
    for a in ("core/juno", "core/spartan", "core/kai"):
        r.register(a)
    return r


def refused(hub, c, rule):
    """Push the clone's commits; the hook refuses with `rule` and nothing stays."""
    before = hub.store.tip(model.ROOM_PREFIX + c.room)
    ok, err = c.push()
    assert not ok and refused_rule(err) == rule, err
    assert "why:" in err and "fix:" in err and "commit:" in err
    assert hub.store.tip(model.ROOM_PREFIX + c.room) == before
    assert git("cat-file", "-e", c.head(), cwd=hub.path, check=False).returncode != 0
    return err


def accepted(hub, c):
    ok, err = c.push()
    assert ok, err
    assert hub.store.room_tip(c.room) == c.head()


def register_commit(c, agent):
    c.write(model.agent_path(agent), fmt.dumps_toml({"id": agent, "cursor": c.head()}))
    return c.commit(f"{agent} joins")


def test_membership_is_refused_on_push(hub, proj, clone):
    c = clone("web/spartan", room="proj")
    register_commit(c, "web/spartan")
    err = refused(hub, c, "room-membership")
    assert "team 'web' is not a member of room 'proj'" in err and "core/juno" in err

    c.pull()
    c.commit(msg("hello core", "core/spartan"), allow_empty=True)
    err = refused(hub, c, "room-membership")                 # not "register first"
    c.pull()
    c.write(model.task_path(9), fmt.dumps_doc({"id": "9", "title": "t", "state": "pending",
                                         "creator": "web/spartan"}, "x")).commit("a task")
    refused(hub, c, "room-membership")

    hub.join_room("web", "proj", by="core/juno")             # a lead of the room adds web
    c.pull()
    register_commit(c, "web/spartan")
    accepted(hub, c)
    c.commit(msg("hello core", "core/spartan"), allow_empty=True)
    accepted(hub, c)

    hub.leave_room("web", "proj", by="web/ana")
    c.pull()
    c.commit(msg("still here?", "core/spartan"), allow_empty=True)
    refused(hub, c, "room-membership")


def test_a_closed_room_cannot_be_joined_by_pushing_room_toml(hub, proj, clone):
    c = clone("web/ana", room="proj")
    room = fmt.loads_toml(c.read("room.toml"))
    room["teams"].append("web")
    room["leads"]["web"] = "web/ana"
    c.write("room.toml", fmt.dumps_toml(room)).commit("web joins")
    refused(hub, c, "room-membership")
    c.pull().as_("core/juno")
    c.write("room.toml", fmt.dumps_toml(room)).commit("core/juno adds web")
    accepted(hub, c)
    assert proj.view().room["leads"] == {"core": "core/juno", "web": "web/ana"}


def test_full_names_in_trailers_and_lead_cc_of_pushed_messages(hub, proj, clone):
    hub.join_room("web", "proj", by="core/juno")
    proj.register("web/spartan")
    proj.register("web/ana")
    c = clone("web/spartan", room="proj")
    c.commit(msg("to which spartan?", "spartan"), allow_empty=True)
    err = refused(hub, c, "unknown-recipient")
    assert "team/name" in err
    c.pull()
    c.commit(msg("to the core one", "core/spartan"), allow_empty=True)
    accepted(hub, c)
    for lead in ("core/juno", "web/ana"):
        got = proj.inbox(lead)["messages"]
        assert [(m["from"], m["text"], m["via"]) for m in got] == \
            [("web/spartan", "to the core one", "lead")]
    assert [m["via"] for m in proj.inbox("core/spartan")["messages"]] == ["to"]
    assert proj.inbox("core/kai")["messages"] == []


def test_cross_team_task_start_is_refused_on_push_until_both_leads_sign(hub, proj, clone):
    hub.join_room("web", "proj", by="core/juno")
    proj.register("web/ana")
    proj.register("web/spartan")
    t = proj.create_task("core/juno", "the form", assignee="web/spartan")
    path = model.task_path(t['id'])

    def start(c):
        c.pull()
        c.write(path, c.read(path).replace('state = "assigned"', 'state = "in_progress"'))
        c.commit("starting")

    c = clone("web/spartan", room="proj")
    start(c)
    err = refused(hub, c, "dual-sign")
    assert "core/juno" in err and "web/ana" in err
    proj.move_task("core/juno", t["id"], "sign")
    start(c)
    err = refused(hub, c, "dual-sign")
    assert "web/ana" in err and "from core/juno" not in err

    lead = clone("web/ana", room="proj")                     # the second lead signs by push
    lead.write(path, lead.read(path).replace('signoffs = ["core/juno"]',
                                             'signoffs = ["core/juno", "web/ana"]'))
    lead.commit("sign")
    accepted(hub, lead)
    assert proj.task(t["id"])["signoffs"] == ["core/juno", "web/ana"]
    start(c)
    accepted(hub, c)
    assert proj.task(t["id"])["state"] == "in_progress"


def hub_clone(hub, path, agent):
    git("clone", "-q", "-b", "hub", hub.path, str(path))
    c = Clone.__new__(Clone)
    c.path, c.room, c.url = str(path), "hub", hub.path
    return c.as_(agent)


def push_hub(c):
    p = git("push", "origin", "HEAD:refs/heads/hub", cwd=c.path, check=False)
    return p.returncode == 0, p.stderr


def test_team_registry_changes_only_by_its_lead_on_push(hub, proj, tmp_path):
    c = hub_clone(hub, tmp_path / "hubclone", "core/spartan")
    base = hub.store.tip(model.HUB_REF)
    core = fmt.loads_toml(c.read("teams/core.toml"))
    c.write("teams/core.toml", fmt.dumps_toml(dict(core, lead="core/spartan")))
    c.commit("spartan takes over")
    ok, err = push_hub(c)
    assert not ok and refused_rule(err) == "lead-only" and "core/juno" in err
    assert hub.store.tip(model.HUB_REF) == base and hub.team("core")["lead"] == "core/juno"

    git("reset", "-q", "--hard", "origin/hub", cwd=c.path)
    c.as_("core/juno")
    c.write("teams/core.toml", fmt.dumps_toml(
        dict(core, members=core["members"] + ["core/mia"])))
    c.commit("mia joins core")
    assert push_hub(c)[0]
    assert "core/mia" in hub.team("core")["members"]

    # a new team: created by its own lead, not by someone else
    c.write("teams/qa.toml", fmt.dumps_toml({"name": "qa", "lead": "qa/quinn"}))
    c.commit("qa team")
    ok, err = push_hub(c)
    assert not ok and refused_rule(err) == "lead-only"
    git("reset", "-q", "--hard", "origin/hub", cwd=c.path)
    c.as_("qa/quinn")
    c.write("teams/qa.toml", fmt.dumps_toml({"name": "qa", "lead": "qa/quinn"}))
    c.commit("qa team")
    assert push_hub(c)[0]
    assert hub.team("qa")["lead"] == "qa/quinn"

    # the hub's own records are not for pushing
    c.write("archive/proj.toml", fmt.dumps_toml({"name": "proj", "archived": 1}))
    c.commit("fake archive")
    ok, err = push_hub(c)
    assert not ok and refused_rule(err) == "format"
    git("reset", "-q", "--hard", "origin/hub", cwd=c.path)
    c.write("teams/x.toml", fmt.dumps_toml({"name": "x", "lead": "qa/quinn"}))
    c.write("teams/y.toml", fmt.dumps_toml({"name": "y", "lead": "qa/quinn"}))
    c.commit("two teams at once")
    ok, err = push_hub(c)
    assert not ok and refused_rule(err) == "one-operation"
    assert [t["name"] for t in hub.teams()] == ["core", "qa", "web"]


def test_an_archived_room_cannot_be_recreated_by_push(hub, proj, clone):
    c = clone("core/spartan", room="proj")
    tip = hub.archive_room("proj", "core/juno")["tip"]
    c.commit(msg("anyone?", "core/kai"), allow_empty=True)
    ok, err = c.push()
    assert not ok and refused_rule(err) == "format" and "archived" in err
    assert "gitdrop room restore proj" in err
    assert not hub.store.tip(model.ROOM_PREFIX + "proj")
    hub.restore_room("proj", "core/juno")
    assert hub.store.room_tip("proj") == tip
    c.push()
    assert hub.store.room_tip("proj") == c.head()


def test_loop_guard_on_push_with_dated_commits(hub, proj, clone):
    """On push the window ends at the hub's clock and a whole push counts as sent
    now: dates cannot spread a burst (and dates far off are refused outright)."""
    proj.update_room("core/juno", "room-settings", "loop guard",
                     settings={"loop_cap": 2, "loop_window": 40})
    now = int(time.time())
    c = clone("core/kai", room="proj")

    def dated(text, at):
        env = {"GIT_AUTHOR_DATE": f"@{at} +0000", "GIT_COMMITTER_DATE": f"@{at} +0000"}
        git("commit", "-q", "--allow-empty", "-m", msg(text, "core/spartan"), cwd=c.path,
            env=env)

    dated("one", now - 3600)
    err = refused(hub, c, "clock")                           # an hour back: not believed
    assert "3600s in the past" in err or "in the past" in err
    git("reset", "-q", "--hard", "HEAD~1", cwd=c.path)
    dated("one", now - 20)                                   # within the skew, but
    dated("two", now - 10)                                   # spread over the window
    dated("three", now)
    err = refused(hub, c, "loop-guard")                      # the whole push is refused
    assert "2 messages in the last 40s" in err and "wait 40s" in err

    git("reset", "-q", "--hard", "HEAD~1", cwd=c.path)
    accepted(hub, c)                                         # two fit under the cap
    dated("three", int(time.time()))                         # the two count by their dates
    err = refused(hub, c, "loop-guard")
    assert "wait 1" in err or "wait 2" in err                # ~20 s: when "one" leaves
    assert [m["text"] for m in proj.inbox("core/spartan")["messages"]] == ["one", "two"]
    assert os.path.exists(os.path.join(hub.path, "hooks", "pre-receive"))


def test_a_team_file_listing_numbers_as_members_is_refused_by_rule(hub, proj, tmp_path):
    """members = [5] passed the field's type check (a list) and then crashed the hook
    (a number has no team/name to split): the push failed with a traceback, not a rule."""
    c = hub_clone(hub, tmp_path / "hubclone", "core/juno")
    core = fmt.loads_toml(c.read("teams/core.toml"))
    c.write("teams/core.toml", fmt.dumps_toml(dict(core, members=[5])))
    c.commit("a number joins core")
    ok, err = push_hub(c)
    assert not ok and refused_rule(err) == "format" and "members of team core" in err, err
    assert "Traceback" not in err and "hook failed" not in err
