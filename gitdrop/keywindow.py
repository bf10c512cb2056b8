"""Where an idempotency key is looked for, kept by a reader between keyed writes.

A key is looked for back along a room's first-parent history from the tip to the
first commit dated more than `seconds` before the write, once `least` commits
are read, and never past `most` (rules.keyed_before). A day of a busy room is
tens of thousands of commits: walked for every keyed write (and the commit cache
cleared on the way) it cost a server about a second a write. A window here keeps
the keyed commits and the dates of the commits it has walked, so the next write
reads only the commits made since.

It gives what the plain walk gives (tests/test_keywindow.py compares them): the
windows of later writes start no further back (their bound is later and their
tip newer), so what one walk read covers the next; a write dated earlier than
the last, or on a tip the room's windows do not lead to within `least` commits,
is walked plainly.
"""

import heapq

from . import fmt
from .view import first_parent_walk, reader_memo

KEEP = 4   # windows kept per room of a reader


class Window:
    def __init__(self, least: int, most: int, seconds: int):
        self.least, self.most, self.seconds = least, most, seconds
        self.tip = ""
        self.times: list[int] = []   # the dates of the commits walked, oldest first
        self.base = 0                # the position of times[0]
        self.keyed: dict = {}        # (author, key) -> (position, commit), the newest
        self.heap: list = []         # (date, position) of positions that may end a window
        self.queued = -1             # the newest position put in the heap
        self.stop = -1               # the newest position dated before the bound
        self.bound = None

    def top(self) -> int:
        return self.base + len(self.times) - 1

    def fill(self, tip: str, commits: list) -> None:
        """Start over at `tip` from `commits` walked back from it (newest first; the
        last may be the one dated before the bound that ended the walk: find() sees
        it end the window)."""
        self.__init__(self.least, self.most, self.seconds)
        self.tip = tip
        self._add(list(reversed(commits)))

    def _add(self, oldest_first: list) -> None:
        for c in oldest_first:
            self.times.append(c.time)
            key = fmt.may_have_trailer(c.message, "id") and _key(c)
            if key:
                self.keyed[(c.author, key)] = (self.top(), c)

    def extend(self, reader, tip: str) -> bool:
        """Move on to `tip`, reading the commits since this window's: False if
        this window's tip is not among its last `least` first-parent ancestors."""
        if tip == self.tip:
            return True
        new = []
        for c in first_parent_walk(reader, tip):
            if c.oid == self.tip:
                break
            new.append(c)
            if len(new) > self.least:   # far on, or elsewhere: a walk of its own
                return False
        else:
            return False
        self.tip = tip
        self._add(list(reversed(new)))
        if len(self.times) > 2 * self.most + 1000:   # what no window reaches any more
            drop = len(self.times) - self.most - 1
            self.times = self.times[drop:]
            self.base += drop
            self.keyed = {k: v for k, v in self.keyed.items() if v[0] >= self.base}
        return True

    def find(self, author: str, key: str, at: int):
        """The newest commit by `author` with `key` in the window of a write dated
        `at` on this window's tip, or None."""
        bound = at - self.seconds
        self.bound = bound
        last = self.top() - self.least   # positions past `least` from the tip
        if self.queued < last:
            first = max(self.queued + 1, self.base)
            more = [(self.times[p - self.base], p) for p in range(first, last + 1)]
            self.queued = last
            if len(more) > len(self.heap):
                self.heap += more
                heapq.heapify(self.heap)
            else:
                for x in more:
                    heapq.heappush(self.heap, x)
        while self.heap and self.heap[0][0] < bound:
            self.stop = max(self.stop, heapq.heappop(self.heap)[1])
        start = max(self.stop + 1, self.top() - self.most + 1)
        got = self.keyed.get((author, key))
        return got[1] if got is not None and got[0] >= start else None


def _key(c) -> str:
    return fmt.trailer(c.trailers, "id")


def plain(reader, tip: str, author: str, key: str, at: int, least: int, most: int,
          seconds: int):
    """The walk itself: back to the first commit dated before the bound once
    `least` are read, never past `most`. Returns (found, walked): the commits read,
    newest first, the one that ended the walk last."""
    found, walked, since = None, [], at - seconds
    for n, h in enumerate(first_parent_walk(reader, tip)):
        if n >= most:
            break
        walked.append(h)
        if n >= least and h.time < since:
            break
        if found is None and h.author == author and _key(h) == key:
            found = h
    return found, walked


def keyed_before(reader, tip: str, author: str, key: str, at: int, least: int, most: int,
                 seconds: int, room: str = ""):
    rooms = reader_memo(reader, "_key_windows")
    if room not in rooms and len(rooms) >= 64:
        rooms.clear()
    windows = rooms.setdefault(room, [])
    for w in windows:
        if w.bound is not None and at - seconds < w.bound:
            continue   # dated before the window's last write: walked plainly below
        if w.extend(reader, tip):
            windows.remove(w)
            windows.insert(0, w)
            return w.find(author, key, at)
    found, walked = plain(reader, tip, author, key, at, least, most, seconds)
    w = Window(least, most, seconds)
    w.fill(tip, walked)
    w.bound = at - seconds   # what it was walked for: a write dated earlier walks again
    windows.insert(0, w)
    del windows[KEEP:]
    return found
