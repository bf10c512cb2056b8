"""What a walk back through a room's history found, kept between processes.

The unread-before-send check and the inbox walk back from the tip to an agent's
read cursor. An agent that nothing concerns never moves its cursor, so in a
long-lived room every CLI call (a fresh process) would walk the whole history
since it registered. The rules and the inbox keep, per (agent, cursor, ...),
what they found up to a tip T; this module keeps those entries in
`<hub>/gitdrop/walks`, so the next process walks only what is newer than T.

It is derived data: keyed by commit ids (a commit's ancestry never changes), so
an entry is either used exactly or, when its T is not on the walk, ignored.
Losing the file, or a racing writer's entries, only means walking again. The
format is tab-separated text (no json: the pre-receive hook reads it too).
"""

import os
import time
import zlib

from .files import NOFOLLOW, write_whole

try:
    import fcntl
except ImportError:   # not POSIX: no compaction (the file only grows; a cache)
    fcntl = None

MAX_KEEP = 2000          # entries kept when the file is compacted
COMPACT_AT = 4 * MAX_KEEP  # lines in the file that trigger a compaction


def path_for(git_dir: str) -> str:
    return os.path.join(git_dir, "gitdrop", "walks")


class WalkMemo(dict):
    """A dict of walk results that loads from and flushes to one file.

    Flushing appends what changed since the last flush (one write, O_APPEND, so
    processes' lines do not interleave); a later line for a key wins on loading.
    Only when the file has grown to COMPACT_AT lines is it rewritten with the
    newest MAX_KEEP entries: a long-lived server pays for what it adds, not for
    the whole file every time."""

    def __init__(self, path: str = ""):
        super().__init__()
        self.path = path
        self.dirty = False
        self._flushed = 0.0
        self._new: dict = {}
        self._lines = 0
        if path:
            loaded, self._lines = _load(path)
            self.update(loaded)   # dict.update: loaded entries are not new

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        self._new[key] = value
        self.dirty = True

    def flush(self, every: float = 0.5) -> None:
        """Write what changed (at most every `every` seconds)."""
        if not self.path or not self.dirty or time.monotonic() - self._flushed < every:
            return
        self._flushed = time.monotonic()
        self.dirty = False
        new, self._new = self._new, {}
        try:
            text = "".join(_line(k, v) for k, v in list(new.items()))
        except RuntimeError:  # another thread changed it meanwhile: next time
            self._new.update(new)
            self.dirty = True
            return
        try:
            os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
            lock = self._lock(fcntl.LOCK_SH) if fcntl else None
            if lock is False:   # being compacted: these lines go with the next flush
                self._new = {**new, **self._new}
                self.dirty = True
                return
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | NOFOLLOW, 0o600)
                try:
                    os.write(fd, text.encode())
                    size = os.fstat(fd).st_size
                finally:
                    os.close(fd)
            finally:
                if lock:
                    os.close(lock)
            self._lines += len(new)
            if self._lines >= COMPACT_AT or size > COMPACT_AT * 200:
                self._compact()
        except OSError:
            pass  # a cache: never worth failing a write for

    def _lock(self, how):
        """A file descriptor holding `how` on the memo's lock (appends share it, a
        compaction takes it alone), False if it is held the other way, None if
        there is no lock to be had."""
        try:
            fd = os.open(self.path + ".compact", os.O_RDWR | os.O_CREAT | NOFOLLOW, 0o600)
        except OSError:
            return None
        try:
            fcntl.flock(fd, how | fcntl.LOCK_NB)
            return fd
        except OSError:
            os.close(fd)
            return False

    def _compact(self) -> None:
        """Keep the newest MAX_KEEP entries, by each line's key as written (values
        are not decoded). Only while nobody appends, and one process at a time: the
        others go on (every writer of a busy room got here at once, and each spent
        hundreds of milliseconds); appends made meanwhile wait for the next flush."""
        lock = self._lock(fcntl.LOCK_EX) if fcntl else None
        if not lock:
            return   # another process is compacting or appending: later
        try:
            latest: dict = {}
            with open(self.path, encoding="utf-8", errors="replace") as f:
                lines = f.readlines()
            if len(lines) < COMPACT_AT:   # another process has just done it
                self._lines = len(lines)
                return
            for line in lines:
                body, _, crc = line.rstrip("\n").rpartition("\t#")
                if crc == f"{zlib.crc32(body.encode()):08x}":
                    key = body.partition("\t|")[0]
                    latest.pop(key, None)   # keep the order of the last write
                    latest[key] = line if line.endswith("\n") else line + "\n"
            # nobody appends meanwhile (the lock)
            write_whole(self.path, "".join(list(latest.values())[-MAX_KEEP:]).encode(), 0o600)
            self._lines = min(len(latest), MAX_KEEP)
        finally:
            os.close(lock)


# One entry per line: the key's fields, "|", the value's fields. Values are
# strings, ints, booleans, None and lists of those (see rules._quick_ok and
# core.Room._events_since for what they hold).

def _enc(x) -> str:
    if x is None:
        return "~"
    if x is True or x is False:
        return "T" if x else "F"
    if isinstance(x, int):
        return f"i{x}"
    if isinstance(x, (list, tuple)):
        return "l" + ",".join(_enc(y).replace(",", "%2C") for y in x)
    return "s" + str(x).replace("%", "%25").replace("\t", "%09").replace("\n", "%0A")


def _dec(s: str):
    tag, body = s[:1], s[1:]
    if tag == "~":
        return None
    if tag in "TF" and not body:
        return tag == "T"
    if tag == "i":
        return int(body)
    if tag == "l":
        return [_dec(y.replace("%2C", ",")) for y in body.split(",")] if body else []
    if tag == "s":
        return body.replace("%0A", "\n").replace("%09", "\t").replace("%25", "%")
    raise ValueError(s)


def _line(key, value) -> str:
    body = "\t".join([_enc(k) for k in key] + ["|"] + [_enc(v) for v in value])
    return f"{body}\t#{zlib.crc32(body.encode()):08x}\n"


def _load(path: str) -> tuple[dict, int]:
    """The entries (a later line for a key wins) and the number of lines."""
    out, lines = {}, 0
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                lines += 1
                body, _, crc = line.rstrip("\n").rpartition("\t#")
                # A line cut short by a crash runs into the next one appended:
                # the checksum tells, and such a line is skipped.
                if crc != f"{zlib.crc32(body.encode()):08x}":
                    continue
                fields = body.split("\t")
                try:
                    bar = fields.index("|")
                    key = tuple(_dec(x) for x in fields[:bar])
                    out.pop(key, None)   # keep the order of the last write
                    out[key] = [_dec(x) for x in fields[bar + 1:]]
                except ValueError:
                    continue  # a line from another version, damaged, or half-written
    except (OSError, UnicodeDecodeError):
        pass
    return out, lines
