"""`gitdrop demo` tells the whole story, and each step turns out as the story says."""

import os
import shutil
import time

import pytest

from cli_helpers import Gitdrop
from gitdrop.cli.demo import STEPS

# (words in the step's title, the outcome it must have: "ok" or the rule that refuses)
STORY = [
    ("create the hub", "ok"),
    ("juno registers as the lead", "ok"),
    ("spartan registers", "ok"),
    ("ada registers", "ok"),
    ("handshake", "ok"),
    ("creates task 1", "ok"),
    ("creates task 2", "ok"),
    ("start task 1 before the plan is agreed", "handshake-go"),
    ("spartan reads the inbox", "ok"),
    ("spartan acks", "ok"),
    ("GO", "ok"),
    ("contract api.users", "ok"),
    ("tells both coders", "ok"),
    ("spartan starts task 1", "ok"),
    ("without reading", "unread-before-send"),
    ("spartan reads the inbox", "ok"),
    ("sends again", "ok"),
    ("submits task 1", "ok"),
    ("rejects", "ok"),
    ("reworks and submits again", "ok"),
    ("approves task 1", "ok"),
    ("starts task 2", "ok"),
    ("illegal move", "task-state-machine"),
    ("juno approves", "ok"),
    ("pushes", "ok"),
    ("claims task 3", "ok"),
    ("re-checks", "ok"),
    # act 2: a second team in a closed room, a cross-team task both leads sign
    ("creates team ui", "ok"),
    ("creates room launch", "ok"),
    ("leads", "ok"),
    ("finn (ui) joins", "ok"),
    ("max, of team ops", "room-membership"),
    ("crosses teams", "ok"),
    ("before both leads have signed", "dual-sign"),
    ("juno signs", "ok"),
    ("lyra signs", "ok"),
    ("finn starts it", "ok"),
    # act 3: the loop guard
    ("loop_cap 3", "ok"),
    ("finn reads the inbox", "ok"),
    ("update 1", "ok"),
    ("update 2", "ok"),
    ("update 3", "ok"),
    ("a 4th", "loop-guard"),
    ("room launch re-checks", "ok"),
]


@pytest.fixture
def gd(tmp_path):
    return Gitdrop(str(tmp_path / "unused.git"), str(tmp_path / "home"))


def test_demo_steps_turn_out_as_the_story_says(gd):
    t = time.monotonic()
    doc = gd.js("demo")
    assert time.monotonic() - t < 60  # about a second on a quiet machine; generous under load
    steps = doc["steps"]
    assert len(steps) == len(STORY) == STEPS
    assert doc["failed"] == 0, [s for s in steps if not s["ok"]]
    assert len(steps) == len(STORY)
    for step, (words, outcome) in zip(steps, STORY):
        assert words in step["title"], (step, words)
        assert step["outcome"] == outcome and step["ok"], step
    go = next(s for s in steps if "GO" in s["title"])
    assert "status: go" in go["detail"]
    refused = next(s for s in steps if s["outcome"] == "handshake-go")
    assert "waiting for core/spartan, core/ada" in refused["detail"]
    unread = next(s for s in steps if s["outcome"] == "unread-before-send")
    assert "1 unread" in unread["detail"] and "inbox" in unread["fix"]
    assert "completed" in next(s for s in steps if "approves task 1" in s["title"])["detail"]
    assert "state: assigned" in next(s for s in steps if "claims task 3" in s["title"])["detail"]
    closed = next(s for s in steps if s["outcome"] == "room-membership")
    assert "team 'ops' is not a member of room 'launch'" in closed["detail"]
    sign = next(s for s in steps if s["outcome"] == "dual-sign")
    assert "core/juno, ui/lyra" in sign["detail"] and "gitdrop task sign" in sign["fix"]
    assert "state: in_progress" in next(s for s in steps if "finn starts" in s["title"])["detail"]
    burst = next(s for s in steps if s["outcome"] == "loop-guard")
    assert "sent 3 messages" in burst["detail"] and "room cap 3" in burst["detail"]
    assert "loop_cap" in burst["fix"]
    # the throwaway hub is gone afterwards, and GITDROP_HUB was not the demo's to use
    hub_path = steps[0]["detail"].split("id: ", 1)[1]
    assert hub_path.endswith("hub.git") and not os.path.exists(hub_path)
    assert doc["kept"] is False and doc["hub"] == "" and not os.path.exists(gd.hub)


def test_demo_narrates_and_ends_with_the_rooms_git_log(gd):
    r = gd.ok("demo")
    out = r.out
    assert "refused by rule handshake-go" in out
    assert "refused by rule unread-before-send" in out
    assert "refused by rule task-state-machine" in out
    assert "refused by rule room-membership" in out
    assert "refused by rule dual-sign" in out
    assert "refused by rule loop-guard" in out
    assert "next step:" in out
    assert "Act 2:" in out and "Act 3:" in out
    assert "\x1b[" not in out   # not a terminal: no colour
    # the log is read before the throwaway hub goes, and not offered as a command to run
    # on a hub that is gone
    head, log = out.split("' rooms/lobby\n", 1)  # after the git log command line
    assert "--git-dir" not in head.splitlines()[-1] and "--keep" in head
    lines = [x for x in log.strip().splitlines() if x.strip()]
    assert "room lobby created" in lines[0]
    subjects = "\n".join(lines)
    for s in ("juno joined lobby as lead", "handshake 1 acked by ada — GO",
              "task 1 review → in_progress by juno", "task 1 review → completed by juno",
              "task 3: document GET /users", "task 3 pending → assigned by ada"):
        assert s in subjects, s
    assert f"{len(STORY)} of {len(STORY)} steps went as expected" in out
    assert "task 3 pending → assigned by ada" in out.rstrip().splitlines()[-1]  # ends with the log


def test_demo_colours_only_a_terminal_or_on_request(gd):
    forced = gd.ok("demo", env={"FORCE_COLOR": "1"}).out
    assert "\x1b[1m" in forced and "\x1b[32m✔" in forced
    assert "\x1b[" not in gd.ok("demo", env={"FORCE_COLOR": "1", "NO_COLOR": "1"}).out


def test_demo_builds_its_hub_where_hub_says_and_keeps_it(gd, tmp_path):
    where = tmp_path / "demo.git"
    r = gd.ok("demo", "--hub", where)
    assert f"The hub is kept at {where}" in r.out
    assert f"$ git --git-dir {where} log" in r.out
    assert (where / "HEAD").exists()
    assert {r["room"] for r in gd.js("--hub", where, "room", "list")["rooms"]} == \
        {"lobby", "launch"}
    tasks = gd.js("--hub", where, "--room", "launch", "task", "list", "--all")["tasks"]
    assert [(t["assignee"], t["state"]) for t in tasks] == [("ui/finn", "in_progress")]
    # a hub that exists is not the demo's: refused before anything runs
    r = gd("demo", "--hub", where, "--json")
    assert r.rc == 2 and "not empty" in r.json["reason"], r
    empty = tmp_path / "empty"
    empty.mkdir()
    assert gd.js("demo", "--hub", empty)["kept"] is True and (empty / "HEAD").exists()


def test_demo_keep_keeps_the_throwaway_hub(gd):
    doc = gd.js("demo", "--keep")
    try:
        assert doc["kept"] is True and doc["failed"] == 0
        assert os.path.exists(os.path.join(doc["hub"], "HEAD"))
    finally:
        shutil.rmtree(os.path.dirname(doc["hub"]), ignore_errors=True)
