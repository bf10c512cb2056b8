"""`gitdrop demo` tells the whole story, and each step turns out as the story says."""

import os
import time

import pytest

from cli_helpers import Gitdrop

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
]


@pytest.fixture
def gd(tmp_path):
    return Gitdrop(str(tmp_path / "unused.git"), str(tmp_path / "home"))


def test_demo_steps_turn_out_as_the_story_says(gd):
    t = time.monotonic()
    doc = gd.js("demo")
    assert time.monotonic() - t < 60  # seconds on a quiet machine; generous under load
    steps = doc["steps"]
    assert doc["failed"] == 0, [s for s in steps if not s["ok"]]
    assert len(steps) == len(STORY)
    for step, (words, outcome) in zip(steps, STORY):
        assert words in step["title"], (step, words)
        assert step["outcome"] == outcome and step["ok"], step
    go = next(s for s in steps if "GO" in s["title"])
    assert "status=go" in go["detail"]
    refused = next(s for s in steps if s["outcome"] == "handshake-go")
    assert "waiting for core/spartan, core/ada" in refused["detail"]
    unread = next(s for s in steps if s["outcome"] == "unread-before-send")
    assert "1 unread" in unread["detail"] and "inbox" in unread["fix"]
    assert "completed" in next(s for s in steps if "approves task 1" in s["title"])["detail"]
    assert "state=assigned" in next(s for s in steps if "claims task 3" in s["title"])["detail"]
    # the throwaway hub is gone afterwards
    hub_path = steps[0]["detail"].split("id=", 1)[1]
    assert hub_path.endswith("hub.git") and not os.path.exists(hub_path)


def test_demo_narrates_and_ends_with_the_rooms_git_log(gd):
    r = gd.ok("demo")
    out = r.out
    assert "refused by rule handshake-go" in out
    assert "refused by rule unread-before-send" in out
    assert "refused by rule task-state-machine" in out
    assert "next step:" in out
    log = out.split("' rooms/lobby\n", 1)[1]  # after the git log command line
    lines = [x for x in log.strip().splitlines() if x.strip()]
    assert "room lobby created" in lines[0]
    subjects = "\n".join(lines)
    for s in ("juno joined lobby as lead", "handshake 1 acked by ada — GO",
              "task 1 review → in_progress by juno", "task 1 review → completed by juno",
              "task 3: document GET /users", "task 3 pending → assigned by ada"):
        assert s in subjects, s
    assert f"{len(STORY)} of {len(STORY)} steps went as expected" in out
    assert "task 3 pending → assigned by ada" in out.rstrip().splitlines()[-1]  # ends with the log
