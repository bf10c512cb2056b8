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


def _play(room, clock, rng, steps, reopen=None):
    out = []
    for step in range(steps):
        if reopen and step % 25 == 24:
            room = reopen()  # a fresh process: the memo comes back from the hub's file
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

        def reopen(h=h, clock=clock):
            return hubmod.Hub(h.store.path, clock=clock).room("r")
        runs.append((h, _play(room, clock, random.Random(seed), 160, reopen if memo else None)))
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


# --- the hook imports neither json nor re: the fast paths give what they gave ---

import json  # noqa: E402
import re  # noqa: E402

from hypothesis import given, settings, strategies as st  # noqa: E402

from gitdrop import fmt, model  # noqa: E402,F811


def _json_value(raw):
    """fmt._value as it was, through json."""
    raw = raw.strip()
    if raw in ("true", "false"):
        return raw == "true"
    if raw.startswith("[") and raw.endswith("]"):
        raw = "[" + raw[1:-1].strip().rstrip(",") + "]"
    value = json.loads(raw)
    if isinstance(value, (float, dict)) or value is None:
        raise ValueError("unsupported")
    return value


def _outcome(fn, raw):
    try:
        v = fn(raw)
        return "ok", repr(v), type(v).__name__
    except ValueError:
        return "refused", "", ""


TOKENS = st.sampled_from(list('"\\[], -+0123456789.eE \t\n\r\x0b\x00\x1f\x7fé١²a/_')
                         + ["true", "false", "null", '"x"', "12", "-0", "01", "\ufeff"])


@settings(max_examples=3000, deadline=None)
@given(st.lists(TOKENS, max_size=10).map("".join))
def test_toml_values_read_as_json_reads_them(raw):
    """Without json at hand, what fmt accepts, json reads the same (fmt refuses more:
    whatever TOML would read otherwise; tests/test_fuzz_formats.py holds it to tomllib)."""
    got = _outcome(lambda r: fmt._value(r, "here"), raw)
    if got[0] == "ok":
        assert got == _outcome(_json_value, raw)


@settings(max_examples=1000, deadline=None)
@given(st.one_of(st.text(max_size=8), st.lists(st.text(max_size=4), max_size=3),
                 st.integers(), st.booleans()))
def test_toml_values_written_as_json_writes_them(v):
    """A written string reads back equal in json (and in TOML: test_fuzz_formats.py)."""
    if isinstance(v, str):
        assert json.loads(fmt._dump_value(v)) == v


def test_a_reader_keeps_commits_up_to_a_size_not_only_a_count(tmp_path, monkeypatch):
    """Capped at 50,000 commits alone, a long-lived process that read 16 KB messages
    kept over 1 GB of them, growing with every commit it saw."""
    from gitdrop import hub as hubmod, view
    from gitdrop.view import first_parent_walk
    monkeypatch.setattr(view, "KEEP_BYTES", 200_000)
    h = hubmod.init(str(tmp_path / "hub.git"), fsync=False)
    r = h.room("lobby")
    r.register("core/juno", ["lead"])
    r.register("core/kai", [])
    for i in range(60):
        r.send("core/juno", "core/kai", f"{i} " + "x" * 15_000)
    reader = hubmod.Hub(h.path).store.reader   # a fresh process's reader
    most = 0
    for c in first_parent_walk(reader, h.store.room_tip("lobby")):
        most = max(most, sum(len(k.message) for k in reader._commits.values()))
    assert 0 < most <= 200_000 + 16_000, most
