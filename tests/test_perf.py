"""The speed-ups keep every verdict: the same operations on two hubs, one with
the per-process walk memo and one without, give the same commits (same ids)
and the same refusals, and re-validating the room agrees."""

import random

import pytest

from gitdrop import hub as hubmod
from gitdrop.errors import Refusal

AGENTS = ["t1/ann", "t1/bea", "t2/cal", "t2/dot"]
TARGETS = AGENTS + ["@t1", "@t2", "all"]


class Clock:
    def __init__(self, start):
        self.now = start

    def __call__(self):
        return self.now


def _hub(path, clock, settings, memo: bool):
    h = hubmod.init(str(path), room="", fsync=False)
    h.clock = clock
    h.create_room("hub/admin", "r", open_=True, settings=settings)
    if not memo:
        h.store.reader.walks = None
    room = h.room("r")
    room.register(AGENTS[0], ["lead"])
    for a in AGENTS[1:]:
        room.register(a)
    return h, room


def _play(room, clock, rng, steps):
    out = []
    for _ in range(steps):
        r = rng.random()
        clock.now += rng.choice([0, 0, 1, 5, 20, 61]) if r > 0.05 else -rng.randint(1, 200)
        who = rng.choice(AGENTS)
        try:
            if rng.random() < 0.7:
                res = room.send(who, rng.choice(TARGETS), f"m{len(out)}")
            else:
                res = room.inbox(who, limit=rng.choice([0, 1, 2, 5]))
                res = res.get("commit", "")
            out.append(("ok", res["commit"] if isinstance(res, dict) else res))
        except Refusal as e:
            out.append(("refused", e.rule, e.reason))
    return out


@pytest.mark.parametrize("seed,settings", [
    (1, {"loop_cap": 0}), (2, {"loop_cap": 3, "loop_window": 60}),
    (3, {"loop_cap": 2, "loop_window": 30}), (4, {"loop_cap": 5, "loop_window": 600}),
])
def test_memo_keeps_verdicts(tmp_path, seed, settings):
    start = 1_700_000_000
    runs = []
    for memo in (True, False):
        clock = Clock(start)
        h, room = _hub(tmp_path / f"hub-{memo}", clock, settings, memo)
        runs.append((h, _play(room, clock, random.Random(seed), 160)))
    (h1, a), (h2, b) = runs
    assert a == b
    kinds = {x[0] for x in a} | {x[1] for x in a if x[0] == "refused"}
    assert "ok" in kinds and "unread-before-send" in kinds
    if settings["loop_cap"]:
        assert "loop-guard" in kinds
    tip = h1.store.room_tip("r")
    assert tip == h2.store.room_tip("r")
    # Re-validation with and without the memo agrees with the history.
    h2.store.reader.walks = None
    assert h1.verify("r") == h2.verify("r")
