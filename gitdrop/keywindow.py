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
import os
import sys
import zlib

from . import fmt
from .files import read_plain, write_whole
from .view import first_parent_walk, reader_memo

KEEP = 4   # windows kept per room of a reader
# A room's newest window is kept in the hub too (<hub>/gitdrop/keys/), for a fresh
# process (a CLI call with --key, the hook): it walked the whole day, 0.6-0.8 s in a
# room of 50,000 commits a day, for its one keyed write. Saved again once this many
# commits were read since: the next process then reads fewer than `least` to reach it.
SAVE_EVERY = 500
MAGIC = b"gitdrop-key-window 1"


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
        self.saved = -1              # the top when last saved in the hub

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

    def dump(self) -> bytes:
        """The window as a file: what load() takes back (the keyed commits by id)."""
        import array
        import json
        times = array.array("q", self.times).tobytes()
        keyed = json.dumps([[a, k, pos, c if isinstance(c, str) else c.oid]
                            for (a, k), (pos, c) in self.keyed.items()]).encode()
        body = times + keyed
        head = json.dumps([self.least, self.most, self.seconds, self.tip, self.base,
                           self.bound, len(self.times), sys.byteorder, zlib.crc32(body)])
        return MAGIC + b"\n" + head.encode() + b"\n" + body

    @classmethod
    def load(cls, data: bytes, least: int, most: int, seconds: int):
        """A window dump() wrote for these bounds, or None (another version, other
        bounds, damaged or cut short: the walk is made again)."""
        import array
        import json   # here, not at the top: the hook starts without it
        try:
            magic, head, body = data.split(b"\n", 2)
            if magic != MAGIC:
                return None
            lst, mst, sec, tip, base, bound, n, order, crc = json.loads(head)
            if [lst, mst, sec, order] != [least, most, seconds, sys.byteorder] or \
                    zlib.crc32(body) != crc or not _is_oid(tip) or \
                    not isinstance(base, int) or not isinstance(n, int) or \
                    not (bound is None or isinstance(bound, int)) or not 0 < n <= len(body) // 8:
                return None
            times = array.array("q")
            times.frombytes(body[:8 * n])
            w = cls(least, most, seconds)
            w.tip, w.times, w.base, w.bound = tip, times.tolist(), base, bound
            for a, k, pos, oid in json.loads(body[8 * n:]):
                if not (isinstance(a, str) and isinstance(k, str) and isinstance(pos, int)
                        and base <= pos <= w.top() and _is_oid(oid)):
                    return None
                w.keyed[(a, k)] = (pos, oid)
            w.saved = w.top()
            return w
        except (ValueError, TypeError, UnicodeDecodeError):
            return None


def _is_oid(x) -> bool:
    return isinstance(x, str) and len(x) == 40 and not x.strip("0123456789abcdef")


def _path(reader, room: str) -> str:
    import hashlib
    name = hashlib.sha1(room.encode("utf-8", "surrogateescape")).hexdigest()[:20]
    return os.path.join(reader.git_dir, "gitdrop", "keys", name)


def _loaded(reader, room: str, least: int, most: int, seconds: int) -> list:
    """The window kept in the hub for `room` ([] if none to be had)."""
    try:
        data = read_plain(_path(reader, room), 64 << 20)
    except AttributeError:   # a reader without a hub folder
        return []
    w = Window.load(data, least, most, seconds) if data else None
    return [w] if w is not None else []


def _save(reader, room: str, w: Window) -> None:
    """Keep `w` in the hub, where a fresh process finds it (not from the hook: what
    it reads may be a push it refuses; never worth failing a write for)."""
    if not getattr(reader, "keeps_memos", False) or w.top() - w.saved < SAVE_EVERY:
        return
    try:
        path = _path(reader, room)
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        write_whole(path, w.dump(), 0o600)
        w.saved = w.top()
    except (OSError, AttributeError):
        pass


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
    if room not in rooms:
        if len(rooms) >= 64:
            rooms.clear()
        rooms[room] = _loaded(reader, room, least, most, seconds)
    windows = rooms[room]
    for w in windows:
        if w.bound is not None and at - seconds < w.bound:
            continue   # dated before the window's last write: walked plainly below
        if w.extend(reader, tip):
            windows.remove(w)
            windows.insert(0, w)
            _save(reader, room, w)
            got = w.find(author, key, at)
            return reader.commit(got) if isinstance(got, str) else got
    found, walked = plain(reader, tip, author, key, at, least, most, seconds)
    w = Window(least, most, seconds)
    w.fill(tip, walked)
    w.bound = at - seconds   # what it was walked for: a write dated earlier walks again
    windows.insert(0, w)
    del windows[KEEP:]
    if len(walked) >= least:
        _save(reader, room, w)
    return found
