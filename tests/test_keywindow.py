"""The idempotency key window kept between keyed writes (gitdrop.keywindow) answers
what a plain walk of the history answers, write after write, dates out of order
and all; and a keyed write in a room of a busy day reads only what is new."""

import random
import time

import pytest

from gitdrop import fmt, keywindow
from gitdrop.view import CommitData


class Reader:
    """Commits in memory: enough for a first-parent walk."""

    def __init__(self):
        self.commits, self.reads = {}, 0

    def commit(self, oid):
        self.reads += 1
        return self.commits[oid]

    def add(self, parent, author, when, key=""):
        oid = f"{len(self.commits) + 1:040x}"
        trailers = [("op", "send")] + ([("id", key)] if key else [])
        msg = fmt.format_message(f"{author}: x", "x", trailers)
        self.commits[oid] = CommitData(oid, "t", [parent] if parent else [], author, "", when,
                                       msg)
        return oid


def plain(reader, tip, author, key, at, least, most, seconds):
    return keywindow.plain(reader, tip, author, key, at, least, most, seconds)[0]


@pytest.mark.parametrize("least, most, seconds", [
    (20, 150, 100),      # the date ends most windows
    (20, 60, 10_000),    # the count does
    (5, 400, 40)])       # a short least: dates out of order end them early
def test_the_window_answers_as_the_walk_does(least, most, seconds):
    rng = random.Random(7)
    for trial in range(30):
        r = Reader()
        tip, now, tips = "", 1000, []
        authors, keys = ["a", "b", "c"], ["k1", "k2", "k3", "k4"]
        for i in range(400):
            now += rng.choice([0, 1, 1, 2, 5])
            when = now + rng.randint(-30, 30)   # dates within a skew, out of order
            key = rng.choice(keys) if rng.random() < 0.2 else ""
            tip = r.add(tip, rng.choice(authors), when, key)
            tips.append((tip, now))
        # keyed writes asked as they come (later tips and dates), some skipped,
        # some asked again, now and then one dated earlier or on an older tip
        asked = 0
        for i in range(0, 400, rng.choice([1, 3, 7])):
            t, when = tips[i]
            if rng.random() < 0.05:
                t, when = tips[rng.randrange(0, i + 1)]
            for _ in range(2):
                a, k = rng.choice(authors), rng.choice(keys)
                want = plain(r, t, a, k, when, least, most, seconds)
                got = keywindow.keyed_before(r, t, a, k, when, least, most, seconds)
                assert got is want, (trial, i, a, k)
                asked += 1
        assert asked > 100


def test_a_keyed_write_after_a_busy_day_reads_only_what_is_new():
    """50,000 commits in the day: the first keyed write walks them, the next ones
    the few commits since (the plain walk took a second a write once the commit
    cache was cleared on the way)."""
    r = Reader()
    tip, now = "", int(time.time()) - 50_000
    for i in range(50_000):
        tip = r.add(tip, "a", now + i, "k-early" if i == 10 else "")
    first = keywindow.keyed_before(r, tip, "a", "k-early", now + 50_000, 2000, 100_000, 86400)
    assert first is not None and first.time == now + 10
    r.reads = 0
    for i in range(100):
        tip = r.add(tip, "b", now + 50_000 + i)
        assert keywindow.keyed_before(r, tip, "a", "k-early", now + 50_000 + i, 2000,
                                      100_000, 86400) is first
        assert keywindow.keyed_before(r, tip, "b", f"new-{i}", now + 50_000 + i, 2000,
                                      100_000, 86400) is None
    assert r.reads < 1000, r.reads


def test_keyed_writes_in_two_rooms_by_turns_read_only_what_is_new():
    """One process writing to two rooms by turns: a room's window is not walked for
    the other's tip (each walk went a whole window back before it gave up)."""
    r = Reader()
    tips, now = {"a": "", "b": ""}, int(time.time()) - 20_000
    for i in range(20_000):
        room = "ab"[i % 2]
        tips[room] = r.add(tips[room], "x", now + i)
    for room in "ab":
        assert keywindow.keyed_before(r, tips[room], "x", "k", now + 20_000, 2000, 100_000,
                                      86400, room) is None
    r.reads = 0
    for i in range(50):
        for room in "ab":
            tips[room] = r.add(tips[room], "x", now + 20_000 + i, f"{room}{i}")
            got = keywindow.keyed_before(r, tips[room], "x", f"{room}{i}", now + 20_001 + i,
                                         2000, 100_000, 86400, room)
            assert got is not None and got.oid == tips[room]
    assert r.reads < 500, r.reads


def test_a_write_dated_before_the_walk_that_made_the_window_walks_again():
    """A window just made by a plain walk had no bound: the next keyed write, dated a
    little earlier (within the clock skew), was answered from it, though its own day
    reaches further back, to a key the walk had stopped short of."""
    day, t = 86400, 1_800_000_000
    r = Reader()
    tip = r.add("", "core/a", t - day - 40)
    tip = r.add(tip, "core/a", t - day - 20, "K")
    tip = r.add(tip, "core/b", t - day + 10)   # ends the walk of a write dated t + 30
    for i in range(2100):
        tip = r.add(tip, "core/b", t - 1000 + i // 10)
    assert keywindow.keyed_before(r, tip, "core/a", "other", t + 30, 2000, 100_000, day,
                                  "room") is None
    want = plain(r, tip, "core/a", "K", t - 30, 2000, 100_000, day)
    assert want is not None
    assert keywindow.keyed_before(r, tip, "core/a", "K", t - 30, 2000, 100_000, day,
                                  "room") is want


@pytest.mark.parametrize("message", [
    "a: x\n\nx\n\nGitdrop-Op: send\nGitdrop-Id: K\n",
    "a: x\r\n\r\nGitdrop-ID: K\r\n",                 # CRLF, the key in capitals
    "Gitdrop-iD: K\n",                               # trailers alone, no subject
    "\nGitdrop-Id: K",                               # an empty first line
    "s\n\nbody\n\nGitdrop-Op: send\nGitdrop-Id:   K  \n"])
def test_the_quick_look_for_a_key_never_misses_what_the_parser_reads(message):
    """The window looks for a Gitdrop-Id line before it parses a message: it must say
    yes wherever parse_message finds one."""
    assert fmt.trailer(fmt.parse_message(message)[2], "id") == "K"
    assert fmt.may_have_trailer(message, "id")
    assert not fmt.may_have_trailer(message.replace("Id", "Ix").replace("ID", "IX")
                                    .replace("iD", "iX"), "id")
