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
    assert _outcome(lambda r: fmt._value(r, "here"), raw) == _outcome(_json_value, raw)


@settings(max_examples=1000, deadline=None)
@given(st.one_of(st.text(max_size=8), st.lists(st.text(max_size=4), max_size=3),
                 st.integers(), st.booleans()))
def test_toml_values_written_as_json_writes_them(v):
    want = json.dumps(str(v), ensure_ascii=False) if not isinstance(v, (bool, int, list)) \
        else None
    if want is not None:
        assert fmt._dump_value(v) == want
        assert fmt._dump_key(v) == json.dumps(v)


NAME_CHARS = st.sampled_from(list("aZ09_.-\n/ é١") + [".lock", ".."])


@settings(max_examples=3000, deadline=None)
@given(st.lists(NAME_CHARS, max_size=84).map("".join))
def test_name_patterns_match_as_re_did(s):
    """The whole string (no final newline), and safe as a git ref component."""
    for pat, n in ((model.NAME_RE, 39), (model.KEY_RE, 79)):
        ref_safe = ".." not in s and not s.endswith((".", ".lock"))
        assert bool(pat.match(s)) == bool(
            re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,%d}" % n, s) and ref_safe)


def test_a_fresh_process_walks_only_what_is_new(tmp_path):
    """An agent nothing concerns keeps an old cursor; after one long walk, later
    processes (CLI calls) read only the commits since, for send and inbox."""
    h = hubmod.init(str(tmp_path / "h"), room="", fsync=False)
    h.create_room("hub/admin", "r", open_=True, settings={"loop_cap": 0})
    room = h.room("r")
    for a in ("t/talk", "t/sink", "t/other"):
        room.register(a)
    for i in range(300):
        room.send("t/other", "t/sink", f"filler {i}")

    def reads(fn):
        fresh = hubmod.Hub(h.store.path)
        reader = fresh.store.reader
        seen = []
        real = reader.commit
        reader.commit = lambda oid: seen.append(oid) or real(oid)
        fn(fresh.room("r"))
        return len(seen)
    assert reads(lambda r: r.send("t/talk", "t/sink", "first")) > 300
    assert reads(lambda r: r.send("t/talk", "t/sink", "second")) < 20
    assert reads(lambda r: r.inbox("t/talk")) > 300
    assert reads(lambda r: r.inbox("t/talk")) < 20
    room.send("t/other", "t/talk", "now something concerns talk")
    got = hubmod.Hub(h.store.path).room("r").inbox("t/talk", peek=True)
    assert [m["text"] for m in got["messages"]] == ["now something concerns talk"]


def test_hook_reads_loose_and_packed_objects(tmp_path):
    """The hook reads loose objects from their files and packed ones through
    git cat-file: after a repack, pushes are still judged (one in, one out)."""
    import subprocess
    import time

    import pygit2

    from gitdrop.view import render_file
    h = hubmod.init(str(tmp_path / "hub.git"))
    h.room("lobby").register("t/ann")
    subprocess.run(["git", "--git-dir", h.store.path, "repack", "-adq"], check=True)
    client = str(tmp_path / "client.git")
    subprocess.run(["git", "clone", "-q", "--bare", h.store.path, client], check=True)
    repo = pygit2.Repository(client)
    ref = "refs/heads/rooms/lobby"
    tip = repo.references[ref].target
    now = int(time.time())

    def commit(author, files):
        tb = repo.TreeBuilder(repo[tip].tree)
        sub = repo.TreeBuilder()
        for name, text in files.items():
            sub.insert(name, repo.create_blob(text.encode()), pygit2.GIT_FILEMODE_BLOB)
        tb.insert("tasks", sub.write(), pygit2.GIT_FILEMODE_TREE)
        sig = pygit2.Signature(author, "x@t.gitdrop", now, 0)
        return repo.create_commit(None, sig, sig, "task 1 by hand\n", tb.write(), [tip])

    task = render_file("task", model.with_defaults("task", {
        "id": "1", "title": "by hand", "creator": "t/ann", "created": now, "updated": now}))
    bad = commit("t/nobody", {"1.md": task.replace("t/ann", "t/nobody")})
    p = subprocess.run(["git", "--git-dir", client, "push", h.store.path, f"{bad}:{ref}"],
                       capture_output=True, text=True)
    assert p.returncode != 0 and "registered-author" in p.stderr
    good = commit("t/ann", {"1.md": task})
    p = subprocess.run(["git", "--git-dir", client, "push", h.store.path, f"{good}:{ref}"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert hubmod.Hub(h.store.path).room("lobby").task("1")["title"] == "by hand"
