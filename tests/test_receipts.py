"""Receipts: who a message reached and who has read it (from the read cursors), and a
send to an agent that looks dead says so, on the command line and over MCP."""

import json
import os
import subprocess
import sys
import time

import anyio

from gitdrop import hub as hubmod

from mcp_helpers import stdio_agent


def test_sent_tells_who_a_message_reached_and_who_read_it(hub, team):
    m1 = team.send("core/juno", ["spartan", "kai"], "hello both")["commit"]
    team.inbox("core/spartan")
    m2 = team.send("core/juno", ["@core"], "team news")["commit"]
    team.register("core/late")       # joined after both: counted for neither
    got = {m["id"]: m for m in team.sent("core/juno")}
    assert list(got) == [m2, m1]    # newest first
    first = {g["agent"]: (g["via"], g["read"]) for g in got[m1]["recipients"]}
    assert first == {"core/spartan": ("to", True), "core/kai": ("to", False)}
    assert got[m1]["read"] == 1
    second = {g["agent"]: (g["via"], g["read"]) for g in got[m2]["recipients"]}
    assert second == {"core/spartan": ("team", False), "core/kai": ("team", False)}
    team.inbox("core/kai")
    again = {g["agent"]: g["read"] for g in team.sent("core/juno", message=m2)[0]["recipients"]}
    assert again == {"core/spartan": False, "core/kai": True}
    # a lead gets a copy of every message in the room
    team.inbox("core/spartan")
    m3 = team.send("core/spartan", ["kai"], "between us")["commit"]
    via = {g["agent"]: g["via"] for g in team.sent("core/spartan", message=m3)[0]["recipients"]}
    assert via == {"core/kai": "to", "core/juno": "lead"}


class Clock:
    """An hour ago at first; then now."""

    def __init__(self):
        self.back = 3600

    def __call__(self):
        return int(time.time()) - self.back


def _room_an_hour_old(tmp_path):
    clock = Clock()
    h = hubmod.init(str(tmp_path / "old.git"), fsync=False, clock=clock)
    r = h.room("lobby")
    for a, roles in (("core/juno", ["lead"]), ("core/gone", []), ("core/spartan", [])):
        r.register(a, roles)
    clock.back = 0
    r.ping("core/spartan")
    return h, r


def test_a_send_to_an_agent_that_looks_dead_says_so(tmp_path):
    hub, team = _room_an_hour_old(tmp_path)
    r = team.send("core/juno", ["gone", "spartan"], "are you there?")
    assert r["hints"] == ["core/gone looks dead (last act 60 min ago): it may not read "
                          "this soon"]
    assert "hints" not in team.send("core/juno", ["spartan"], "and you?")
    env = dict(os.environ, GITDROP_HUB=hub.path, GITDROP_ROOM="lobby", GITDROP_AGENT="core/juno")
    p = subprocess.run([sys.executable, "-m", "gitdrop.cli.main", "send", "gone", "-m", "hi"],
                       env=env, capture_output=True, text=True)
    assert p.returncode == 0 and "note: core/gone looks dead" in p.stderr, p.stderr
    p = subprocess.run([sys.executable, "-m", "gitdrop.cli.main", "sent", "--json", "-n", "1"],
                       env=env, capture_output=True, text=True)
    m = json.loads(p.stdout)["messages"][0]
    assert [(g["agent"], g["read"]) for g in m["recipients"]] == [("core/gone", False)]
    p = subprocess.run([sys.executable, "-m", "gitdrop.cli.main", "sent", "-n", "1"],
                       env=env, capture_output=True, text=True)
    assert "0/1 read: gone UNREAD" in p.stdout, p.stdout


def test_an_agent_known_alive_looks_dead_once_its_time_has_passed(tmp_path):
    """A sender remembers until when a recipient is alive (its last act plus the
    limit) and does not read its file again before then; past it, it looks again."""
    hub, team = _room_an_hour_old(tmp_path)
    clock = hub.room("lobby").clock
    assert "hints" not in team.send("core/juno", ["spartan"], "alive?")
    assert "hints" not in team.send("core/juno", ["spartan"], "still?")
    clock.back = -700    # 11 minutes on, and spartan did nothing since its ping
    r = team.send("core/juno", ["spartan"], "and now?")
    assert r.get("hints", [""])[0].startswith("core/spartan looks dead"), r


def test_the_mcp_send_answer_carries_the_hint(tmp_path):
    hub, _room = _room_an_hour_old(tmp_path)

    async def go():
        async with stdio_agent(hub.path, "core/juno", "auto") as juno:
            r = await juno.ok("send", to_agent="gone", message="ping?")
            assert r["hints"] and r["hints"][0].startswith("core/gone looks dead")
            r = await juno.ok("send", to_agent="spartan", message="hi")
            assert "hints" not in r
    anyio.run(go)


def test_a_person_s_message_is_marked_as_theirs(hub, team):
    team.register("ops/ada", human=True)
    team.send("ops/ada", ["spartan"], "a person here: stop the deploy")
    team.inbox("core/juno")     # a lead reads every message of the room before sending
    team.send("core/juno", ["spartan"], "and a program")
    got = team.inbox("core/spartan", peek=True)["messages"]
    assert [(m["from"], m.get("person", False)) for m in got] == \
        [("ops/ada", True), ("core/juno", False)]
    env = dict(os.environ, GITDROP_HUB=hub.path, GITDROP_ROOM="lobby",
               GITDROP_AGENT="core/spartan", NO_COLOR="1")
    p = subprocess.run([sys.executable, "-m", "gitdrop.cli.main", "inbox", "--peek"],
                       env=env, capture_output=True, text=True)
    assert "ada (person) → you" in p.stdout and "juno → you" in p.stdout, p.stdout

    async def go():
        async with stdio_agent(hub.path, "core/spartan", "auto") as spartan:
            msgs = (await spartan.ok("check_inbox"))["messages"]
            assert [m.get("person") for m in msgs] == [True, None]
    anyio.run(go)


def test_a_handshake_whose_target_looks_dead_says_so(tmp_path):
    """Without --to a handshake targets everyone else in the room, the dead too, and
    waits for each one's ack: it may never reach GO, and nothing said why."""
    hub, team = _room_an_hour_old(tmp_path)
    r = team.start_handshake("core/juno", "ship the parser")
    assert set(r["targets"]) == {"core/gone", "core/spartan"}
    assert r["hints"] == ["core/gone looks dead (last act 60 min ago): GO waits for its ack, "
                          "which may not come soon"]
    env = dict(os.environ, GITDROP_HUB=hub.path, GITDROP_ROOM="lobby", GITDROP_AGENT="core/juno")
    p = subprocess.run([sys.executable, "-m", "gitdrop.cli.main", "handshake", "start", "--plan",
                        "and again"], env=env, capture_output=True, text=True)
    assert p.returncode == 0 and "note: core/gone looks dead" in p.stderr, p.stderr
