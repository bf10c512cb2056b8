"""What a newcomer meets in the first hour: the inbox shows what matters, and every
`fix:` names the next command of the face in use."""

import os
import subprocess

import pytest

from cli_helpers import Gitdrop
from conftest import git, refused_rule


@pytest.fixture
def gd(hub, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    return Gitdrop(hub.path, str(home), "core/juno")


def test_the_inbox_shows_reasons_notes_and_questions(gd, team):
    tid = gd.ok("task", "create", "Build GET /users", "--assign", "spartan").out.strip()
    gd.ok("--as", "spartan", "task", "start", tid)
    gd.ok("--as", "spartan", "task", "submit", tid, "--note", "done, with tests")
    gd.ok("--as", "spartan", "inbox")
    assert "done, with tests" in gd.ok("inbox").out
    gd.ok("task", "reject", tid, "--reason", "paginate: 50 per page")
    out = gd.ok("--as", "spartan", "inbox").out
    assert "paginate: 50 per page" in out


def test_the_unread_rule_names_the_cli_command(gd, team):
    gd.ok("send", "spartan", "-m", "hello")
    doc = gd.refused(3, "unread-before-send", "--as", "spartan", "send", "juno", "-m", "hi")
    assert "gitdrop --as spartan inbox" in doc["fix"] and "check_inbox" not in doc["fix"]


def test_a_target_that_has_not_acked_is_told_to_ack(gd, team):
    hid = gd.ok("handshake", "start", "--plan", "the plan", "--to", "spartan").out.strip()
    tid = gd.ok("task", "create", "bound", "--assign", "spartan", "--handshake", hid).out.strip()
    doc = gd.refused(3, "handshake-go", "--as", "spartan", "task", "start", tid)
    assert f"gitdrop --as spartan handshake ack {hid}" in doc["fix"] and "yourself" in doc["fix"]


def test_a_message_over_the_limit_is_sent_where_it_fits(gd, team):
    team.update_room("hub/admin", "room-settings", "small", settings={"max_message": 100})
    doc = gd.refused(3, "size-limit", "send", "spartan", "-m", "x" * 200)
    assert "task" in doc["fix"] and "context" not in doc["fix"]


def test_team_create_as_a_short_name_is_the_caller(gd, hub, team):
    doc = gd.refused(3, "lead-only", "--as", "juno", "team", "create", "web", "--lead", "ana")
    assert "not core/juno" in doc["reason"] and "web/juno" not in doc["reason"]
    assert "--as web/ana" in doc["fix"]
    doc = gd.js("--as", "juno", "team", "create", "core", "--lead", "juno", "--member", "kai")
    assert doc["team"]["members"] == ["core/juno", "core/kai"]
    log = git("log", "-1", "--format=%an", "hub", cwd=hub.path).stdout.strip()
    assert log == "core/juno"
    r = gd("--as", "nobody", "team", "create", "ops", "--lead", "ops/x", "--json")
    assert r.rc == 2 and "team/name" in r.json["fix"]


def test_the_pusher_is_told_how_to_recommit(hub, team, clone):
    c = clone("core/spartan")
    c.commit("not mine", allow_empty=True)
    p = subprocess.run(["git", "push", "origin", "HEAD:rooms/lobby"], cwd=c.path,
                       env=dict(os.environ, GITDROP_PUSHER="core/juno"),
                       capture_output=True, text=True)
    assert refused_rule(p.stderr) == "authenticated-pusher", p.stderr
    assert "--reset-author" in p.stderr
    git("config", "user.name", "core/juno", cwd=c.path)
    git("commit", "-q", "--amend", "--no-edit", "--allow-empty", "--reset-author", cwd=c.path)
    p = subprocess.run(["git", "push", "origin", "HEAD:rooms/lobby"], cwd=c.path,
                       env=dict(os.environ, GITDROP_PUSHER="core/juno"),
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def test_room_settings_from_the_command_line(gd, team):
    doc = gd.js("room", "settings")
    assert doc["settings"]["loop_cap"] == 60 and doc["overrides"] == {}
    # the lobby is open: its settings are the hub's operator's
    gd.refused(3, "lead-only", "room", "settings", "loop_cap", "5")
    doc = gd.js("--as", "hub/admin", "room", "settings", "loop_cap", "5", "loop_window=30")
    assert doc["overrides"] == {"loop_cap": 5, "loop_window": 30}
    assert team.view().settings["loop_cap"] == 5
    assert "(set here; default 60)" in gd.ok("room", "settings").out
    gd.refused(3, "lead-only", "--as", "spartan", "room", "settings", "loop_cap", "0")
    for bad in (["loop_cap"], ["loop_cap", "x"], ["bogus", "1"], ["loop_cap", "-1"]):
        r = gd("room", "settings", *bad, "--json")
        assert r.rc == 2 and r.json["fix"], (bad, r)
    assert team.view().settings["loop_cap"] == 5


def test_a_name_without_a_team_says_where_it_went(gd, hub):
    r = gd.ok("register", "bob")
    assert "default/bob" in r.err and "--team" in r.err
    assert hub.room("lobby").view().agent("default/bob")


def test_claiming_a_task_already_yours_says_what_you_may_do_with_it(gd, team):
    """The task's own assignee claiming it was told it was claimed by itself, and to
    pick another task; it is told its next moves."""
    tid = gd.ok("task", "create", "mine", "--assign", "kai").out.strip()
    r = gd.refused(3, "task-state-machine", "--as", "kai", "task", "claim", tid)
    assert "start" in r["fix"] and "pick another" not in r["fix"], r
    r = gd.refused(3, "task-state-machine", "--as", "spartan", "task", "claim", tid)
    assert "already claimed by core/kai" in r["reason"] and "pick another" in r["fix"]
