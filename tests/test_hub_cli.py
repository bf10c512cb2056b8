"""The hub's commands as a user runs them: real `gitdrop` subprocesses on a real hub."""

import json
import os
import subprocess
import sys

import pytest

GITDROP = os.path.join(os.path.dirname(sys.executable), "gitdrop")
DAY = 86400


@pytest.fixture
def run(tmp_path):
    env = dict(os.environ, GITDROP_HUB=str(tmp_path / "hub.git"))
    for k in ("GITDROP_AGENT", "GITDROP_ROOM"):
        env.pop(k, None)

    def gd(*args, stdin="", code=0):
        p = subprocess.run([GITDROP, *args], env=env, input=stdin, capture_output=True,
                           text=True, timeout=60)
        assert p.returncode == code, (args, p.returncode, p.stdout, p.stderr)
        return json.loads(p.stdout) if "--json" in args and code == 0 else p
    gd("init")
    return gd


def test_teams_and_rooms_from_the_command_line(run, tmp_path):
    run("team", "create", "core", "--lead", "juno", "--member", "spartan", "--as", "core/juno")
    run("team", "create", "web", "--lead", "ana", "--member", "spartan", "--as", "web/ana")
    p = run("team", "create", "core", "--lead", "spartan", "--as", "core/spartan", code=3)
    assert "refused by rule lead-only" in p.stderr and "core/juno" in p.stderr
    teams = run("team", "list", "--json")["teams"]
    assert {t["name"]: t["lead"] for t in teams} == {"core": "core/juno", "web": "web/ana"}

    run("room", "create", "proj", "--team", "core", "--as", "hub/admin")
    p = run("room", "join", "proj", "--team", "web", "--as", "web/ana", code=3)
    assert "room-membership" in p.stderr and "core/juno" in p.stderr
    run("room", "join", "proj", "--team", "web", "--as", "core/juno")
    for agent in ("core/spartan", "web/spartan"):
        run("--room", "proj", "register", agent)
    p = run("--room", "proj", "send", "spartan", "-m", "hi", "--as", "web/spartan", code=5)
    assert "AMBIGUOUS" in p.stderr and "Use full name (team/agent): core/spartan or web/spartan" \
        in p.stderr
    show = run("room", "show", "proj", "--json")["room"]
    assert show["teams"] == ["core", "web"]
    assert show["leads"] == {"core": "core/juno", "web": "web/ana"}

    p = run("room", "destroy", "proj", "--yes", "--as", "core/spartan", stdin="proj\n", code=3)
    assert "refused by rule lead-only" in p.stderr and "core/juno or web/ana" in p.stderr
    assert os.path.exists(os.path.join(tmp_path, "hub.git", "refs", "heads", "rooms", "proj"))


def test_reap_with_a_given_time_and_the_config_keys(run, tmp_path):
    from gitdrop.hub import Hub
    hub = str(tmp_path / "hub.git")
    run("team", "create", "core", "--lead", "juno", "--as", "core/juno")
    run("room", "create", "old", "--team", "core", "--as", "hub/admin")
    created = run("room", "list", "--json")["rooms"][0]["last_activity"]
    later = created + 400 * DAY
    assert run("reap", "--now", str(later), "--json")["archived"] == []   # off by default
    subprocess.run(["git", "config", "gitdrop.idleArchiveDays", "30"], cwd=hub, check=True)
    got = run("reap", "--now", str(later), "--json")   # ahead of the clock: a dry run
    assert sorted(got["archived"]) == ["lobby", "old"] and got["idle_archive_days"] == 30
    assert got["dry_run"] is True and run("room", "list", "--archived", "--json")["rooms"] == []
    then = Hub(hub, clock=lambda: created - 40 * DAY)   # as if both were archived then
    for room in ("lobby", "old"):
        then.archive_room(room, "hub/admin")
    archived = run("room", "list", "--archived", "--json")["rooms"]
    assert {r["room"] for r in archived} == {"lobby", "old"}
    run("room", "pin", "old", "--as", "core/juno")
    subprocess.run(["git", "config", "gitdrop.archiveExpiryDays", "10"], cwd=hub, check=True)
    got = run("reap", "--json")
    assert got["destroyed"] == ["lobby"] and got["spared"] == ["old"] and not got["dry_run"]
    log = subprocess.run(["git", "log", "--format=%an %s", "hub"], cwd=hub, text=True,
                         capture_output=True, check=True).stdout.splitlines()
    assert log[0] == "hub/reaper room lobby destroyed by reaper (archived over 10 days)"
