"""The hub's commands through the real `gitdrop` entry point: teams, the lifecycle
of rooms, reap and verify."""

import time

import pygit2
import pytest

from cli_helpers import Gitdrop
from conftest import git
from gitdrop import fmt, model
from gitdrop.hub import Hub
from gitdrop.store import signature

DAY = 86400


@pytest.fixture
def gd(hub, tmp_path):
    return Gitdrop(hub.path, str(tmp_path / "home"))


def test_teams_create_list_and_only_the_lead_changes_one(gd):
    doc = gd.js("team", "create", "core", "--lead", "juno", "--member", "spartan,ada")
    assert doc["team"]["lead"] == "core/juno"
    assert doc["team"]["members"] == ["core/ada", "core/juno", "core/spartan"]
    gd.ok("team", "create", "web", "--lead", "web/lin")
    teams = {t["name"]: t for t in gd.js("team", "list")["teams"]}
    assert set(teams) == {"core", "web"}
    assert "core/juno" in gd.ok("team", "list").out
    gd.refused(3, "lead-only", "--as", "web/lin", "team", "create", "core", "--lead", "lin")
    again = gd.js("--as", "core/juno", "team", "create", "core", "--lead", "juno", "-m", "kai")
    # added to the members it had: naming one new member dropped every other
    assert again["team"]["members"] == ["core/ada", "core/juno", "core/kai", "core/spartan"]
    out = gd.js("--as", "juno", "team", "remove", "core", "ada", "kai")["team"]["members"]
    assert out == ["core/juno", "core/spartan"]
    r = gd.refused(2, "usage", "--as", "juno", "team", "remove", "core", "juno")
    assert "hand the lead over" in r["fix"]   # never its lead


def test_room_create_list_show_join_leave(gd, hub):
    hub.register_team("core", "core/juno")
    hub.register_team("web", "web/lin")
    doc = gd.js("--as", "core/juno", "room", "create", "sprint", "--team", "core")
    assert doc["teams"] == ["core"] and doc["open"] is False
    gd.refused(3, "format", "room", "create", "sprint")  # exists
    gd.refused(2, "usage", "room", "create", "bad name")
    names = [r["room"] for r in gd.js("room", "list")["rooms"]]
    assert names == ["lobby", "sprint"]
    assert "sprint" in gd.ok("room", "list").out
    gd.ok("--room", "sprint", "register", "core/juno", "--role", "lead")
    # web is not a member: its agents cannot register
    gd.refused(3, "room-membership", "--room", "sprint", "register", "web/kai")
    joined = gd.js("--as", "core/juno", "room", "join", "sprint", "--team", "web")
    assert joined["joined"] is True
    assert [r["room"] for r in gd.js("room", "list", "--team", "web")["rooms"]] == ["sprint"]
    # a closed room: only those web's lead names as members
    r = gd.refused(3, "room-membership", "--room", "sprint", "register", "web/kai")
    assert "gitdrop team add web kai --as web/lin" in r["fix"]
    gd.refused(3, "lead-only", "team", "add", "web", "kai")   # no --as: nobody's lead
    gd.refused(3, "lead-only", "--as", "core/juno", "team", "add", "web", "kai")
    assert "web/kai" in gd.js("--as", "web/lin", "team", "add", "web", "kai")["team"]["members"]
    gd.ok("--room", "sprint", "register", "web/kai")
    st = gd.js("room", "show", "sprint")["room"]
    assert st["teams"] == ["core", "web"] and "web/kai" in st["agents"]
    assert "web/kai" in gd.ok("--room", "sprint", "room", "show").out
    # web leaves by its own lead's call (or the operator's), not by core's lead
    gd.refused(3, "lead-only", "--as", "core/juno", "room", "leave", "sprint", "--team", "web")
    gd.js("--as", "web/lin", "room", "leave", "sprint", "--team", "web")
    assert gd.js("room", "show", "sprint")["room"]["teams"] == ["core"]
    gd.refused(2, "usage", "room", "leave", "sprint")  # which team?


def test_archive_pin_restore_and_who_may(gd, hub, lobby):
    hub.register_team("core", "core/juno", ["kai"])
    hub.create_room("core/juno", "old", ["core"])
    room = hub.room("old")
    room.register("core/juno", ["lead"])
    room.register("core/kai", [])
    gd.refused(3, "lead-only", "--as", "core/kai", "room", "archive", "old")
    for title in ("open", "done"):
        room.create_task("core/juno", title, assignee="core/kai", review=False)
    room.move_task("core/juno", "2", "cancel")
    doc = gd.js("--as", "juno", "--room", "old", "room", "archive")
    assert doc["archived"] is True and doc["open_tasks"] == 1   # said: the work it stops
    gd.js("--as", "core/juno", "room", "restore", "old")
    out = gd.ok("--as", "juno", "room", "archive", "old").out
    assert "1 task not done goes with it; gitdrop" in out, out
    assert [r["room"] for r in gd.js("room", "list")["rooms"]] == ["lobby"]
    everything = {r["room"]: r for r in gd.js("room", "list", "--all")["rooms"]}
    assert everything["old"]["status"] == "archived"
    assert [r["room"] for r in gd.js("room", "list", "--archived")["rooms"]] == ["old"]
    # archived history stays readable with plain git
    assert "core/kai" in git("--git-dir", hub.path, "log", "--format=%an",
                             model.ARCHIVE_PREFIX + "old").stdout
    assert gd.js("--as", "core/juno", "room", "pin", "old")["pinned"] is True
    assert gd.js("room", "list", "--archived")["rooms"][0]["pinned"] is True
    gd.js("--as", "core/juno", "room", "restore", "old")
    assert "old" in [r["room"] for r in gd.js("room", "list")["rooms"]]
    assert gd.js("--as", "core/juno", "room", "pin", "old", "--unpin")["pinned"] is False


def test_destroy_asks_twice_and_only_leads_may(gd, hub):
    hub.register_team("core", "core/juno", ["kai"])
    hub.create_room("core/juno", "tmp", ["core"])
    hub.room("tmp").register("core/juno", ["lead"])
    hub.room("tmp").register("core/kai", [])
    r = gd("--as", "core/juno", "room", "destroy", "tmp")  # no --yes
    assert r.rc == 2 and "--yes" in r.err
    r = gd("--as", "core/juno", "room", "destroy", "tmp", "--yes", input="lobby\n")
    assert r.rc == 2 and "not confirmed" in r.err
    r = gd("--as", "core/juno", "room", "destroy", "tmp", "--yes", input="")
    assert r.rc == 2
    assert "tmp" in [x["room"] for x in gd.js("room", "list")["rooms"]]
    gd.refused(3, "lead-only", "--as", "core/kai", "room", "destroy", "tmp", "--yes",
               input="tmp\n")
    doc = gd.js("--as", "core/juno", "room", "destroy", "tmp", "--yes", input="tmp\n")
    assert doc["destroyed"] is True
    assert "tmp" not in [x["room"] for x in gd.js("room", "list", "--all")["rooms"]]
    assert git("--git-dir", hub.path, "rev-parse", "--verify", "-q", "rooms/tmp",
               check=False).returncode != 0


def test_reap_expires_old_archives_but_spares_pinned(gd, hub):
    hub.register_team("core", "core/juno")
    for name in ("a", "b"):
        hub.create_room("core/juno", name, ["core"])
        hub.room(name).register("core/juno", ["lead"])
    then = Hub(hub.path, clock=lambda: int(time.time()) - 31 * DAY)   # archived a month ago
    for name in ("a", "b"):
        then.archive_room(name, "core/juno")
    hub.pin_room("b", "core/juno")
    # a time ahead of the hub's clock is a dry run: what would be done then, nothing done
    git("--git-dir", hub.path, "config", "gitdrop.archiveExpiryDays", "60")
    ahead = gd.js("reap", "--now", str(hub.clock() + 30 * DAY))
    assert ahead["dry_run"] is True and ahead["destroyed"] == ["a"] and ahead["spared"] == ["b"]
    assert "a" in [r["room"] for r in gd.js("room", "list", "--all")["rooms"]]
    out = gd.ok("reap", "--now", str(hub.clock() * 1000)).out   # milliseconds, by mistake
    assert out.startswith("dry run") and "destroy: a" in out
    assert gd.js("reap")["destroyed"] == []
    git("--git-dir", hub.path, "config", "gitdrop.archiveExpiryDays", "30")
    later = gd.js("reap")
    assert later["destroyed"] == ["a"] and later["dry_run"] is False
    left = [r["room"] for r in gd.js("room", "list", "--all")["rooms"]]
    assert "a" not in left and "b" in left
    out = gd.ok("reap").out  # b is pinned: spared
    assert "archived: none; destroyed: none" in out


def test_verify_replays_a_room_and_names_a_bad_commit(gd, hub, lobby):
    lobby.register("core/juno", ["lead"])
    lobby.send("core/juno", "all", "hello")
    doc = gd.js("verify")
    # create, core joins (juno took the lead), juno registers, the message
    assert doc["verified"] is True and doc["commits"] == 4
    assert "4 commits" in gd.ok("verify", "lobby").out
    gd.refused(4, "not-found", "verify", "nowhere")
    gd.ok("room", "create", "old")
    gd.ok("room", "archive", "old")
    doc = gd.refused(4, "not-found", "verify", "old")   # it said to list the rooms
    assert doc["fix"] == "it is archived: gitdrop verify old --archived", doc
    assert gd.js("verify", "old", "--archived")["verified"] is True
    # a commit slipped past the rules (written straight into the repository)
    repo = pygit2.Repository(hub.path)
    ref = repo.references[model.ROOM_PREFIX + "lobby"]
    tip = repo[ref.target]
    sig = signature("core/ghost", tip.commit_time + 1)
    bad = repo.create_commit(None, sig, sig, fmt.format_message(
        "ghost → all: boo", "boo", [("op", "send"), ("to", "all")]), tip.tree_id, [tip.id])
    ref.set_target(bad)
    doc = gd.refused(3, "registered-author", "verify")
    assert str(bad)[:12] in doc["commit"]


def test_the_room_lifecycle_needs_no_agent_on_the_hubs_machine(gd, hub):
    """room create and room settings acted as the hub's operator without --as; room
    archive, beside them, said 'this command acts as an agent'."""
    gd.ok("room", "create", "tmp")
    assert "archived" in gd.ok("room", "archive", "tmp").out
    assert "(archived: gitdrop room restore tmp" in gd.ok("room", "show", "tmp").out
    assert "pinned" in gd.ok("room", "pin", "tmp").out
    assert "restored" in gd.ok("room", "restore", "tmp").out
    log = git("--git-dir", hub.path, "log", "--format=%an", "-3", "hub").stdout.split()
    assert set(log) == {"hub/admin"}, log


def test_adding_a_member_whose_name_has_a_token_says_so(gd, hub):
    """A name registered before its team named it (an open MCP registration) has a
    token its registrant holds: added to the team, that holder would join the team's
    closed rooms. The lead is told, and how to take the name back."""
    from gitdrop import tokens
    hub.register_team("core", "core/juno")
    tokens.mint(hub.path, "core/kai")
    r = gd.ok("--as", "core/juno", "team", "add", "core", "kai")
    assert "core/kai has a token already" in r.err and "gitdrop token core/kai" in r.err
    assert "core/kai" in hub.team("core")["members"]
    assert "has a token" not in gd.ok("--as", "core/juno", "team", "add", "core", "ada").err


def test_the_operator_and_short_names_where_a_newcomer_meets_them(gd, hub, tmp_path):
    """`room create --as ana` was refused as nobody; `--as hub/admin send` said to
    register hub/admin, which is refused; an install for an agent its team never named
    wrote a config whose first call was refused."""
    hub.register_team("web", "web/ana")
    assert gd.js("--as", "ana", "room", "create", "r1", "--team", "web")["teams"] == ["web"]
    r = gd("--as", "hub/admin", "send", "ana", "-m", "hi", "--json")
    assert r.rc == 4 and "hub's own identity" in r.json["reason"] and \
        "gitdrop register hub" not in r.json["fix"], r
    project = tmp_path / "project"
    project.mkdir()
    r = gd.refused(3, "room-membership", "--room", "r1", "mcp", "install", "--client",
                   "claude-code", "--as", "web/zed", cwd=str(project))
    assert "gitdrop team add web zed --as web/ana" in r["fix"]
    assert not (project / ".mcp.json").exists()
