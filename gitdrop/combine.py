"""Writers of one room on this machine hand their writes to whoever has the turn.

A writer about to wait for the room's turn (writequeue.Turn) first leaves what it
wants written in a slot of a file the room's writers share, mapped in memory
(`<hub>/gitdrop/queue/<ref>.slots`): the room, the verb and its arguments, never
code. Whoever gets the turn makes its own write and every one waiting in a slot,
each its own commit built on the one before and checked by the rules, and moves
the ref once: one lock, one log record, one flush for the lot (flat combining).
A writer waiting sleeps on its slot (a futex on the mapped file, Linux): the
holder wakes it once its answer is there, so it returns without ever taking the
turn, or as the turn is let go, to take it. Without this, each writer in line
pays for a whole turn, so eight writers of one room were slower together than
one alone.

A slot goes FREE -> ASKED (its owner wrote the request) -> TAKEN (a turn's holder
took it) -> PENDING (the answer is written, the ref not yet moved) -> DONE (the
ref moved; the log record's number is beside the answer) -> FREE (its owner read
it). Requests are changed under a lock on the file; answers only by the turn's
holder. Kill safety: a holder killed before PENDING moved no ref, so its
requests' owners write for themselves; one killed at PENDING may have moved it,
so the owner looks for the batch's commit in the room's history before it trusts
or redoes the answer. A slot whose owner died is reused.
"""

import ctypes
import json
import os
import platform
import secrets
import struct
import threading
import zlib

try:
    import fcntl
    import mmap
except ImportError:   # not POSIX: every writer writes for itself
    fcntl = mmap = None

from .errors import GitdropError, Refusal
from . import errors, writequeue
from .files import NOFOLLOW

SLOTS, SIZE = 64, 16384
FREE, ASKED, TAKEN, PENDING, DONE = range(5)
_HEAD = struct.Struct("<B3xIQQIq")   # state, owner pid, its start time, nonce, length, seq
_WORD = SIZE - 4   # each slot's last 4 bytes: a counter its owner sleeps on (futex)
_BODY = SIZE - _HEAD.size - 4
MOST = _BODY   # the longest request a slot holds
_OPEN: dict = {}
_GUARD = threading.Lock()
# Where another core sees one process's stores in the order they were made, an
# asker may read its answer without the slots' lock (Slots.answer).
_STORES_IN_ORDER = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")
_TORN = object()


class Replayed(Exception):
    """An operation already in the room (its idempotency key): `result` is its answer
    and no commit is written."""

    def __init__(self, result: dict):
        super().__init__("replayed")
        self.result = result


class Recipe:
    """What travels to the turn's holder: `payload` (bytes naming the room, verb and
    arguments), and `rebuild(store, ref, payload, view) -> (build, author, now)`,
    which the holder calls for the requests it takes (the same function in every
    process; `view` is the tip as the turn found it)."""

    def __init__(self, payload: bytes, rebuild):
        self.payload, self.rebuild = payload, rebuild


def _start_time(pid: int) -> int:
    """When `pid` started (clock ticks since boot), to tell it from a later process
    with its number; -1 if it is gone, 0 where /proc does not say."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except FileNotFoundError:
        return -1
    except (OSError, ValueError, IndexError):
        try:
            os.kill(pid, 0)
            return 0
        except ProcessLookupError:
            return -1
        except OSError:
            return 0


_ME = (0, 0)


def _me() -> tuple[int, int]:
    global _ME
    if _ME[0] != os.getpid():
        _ME = (os.getpid(), _start_time(os.getpid()))
    return _ME


def _alive(pid: int, start: int) -> bool:
    now = _start_time(pid)
    return now != -1 and (now == start or now == 0 or start == 0)


class Slots:
    """The request slots of one ref (one per process, opened once)."""

    def __init__(self, path: str):
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | NOFOLLOW, 0o664)
        if os.fstat(self.fd).st_size < SLOTS * SIZE:
            os.ftruncate(self.fd, SLOTS * SIZE)   # only ever grows to this: idempotent
        self.map = mmap.mmap(self.fd, SLOTS * SIZE)
        self._words = None
        self._threads = threading.Lock()

    def _head(self, i: int) -> list:
        return list(_HEAD.unpack_from(self.map, i * SIZE))

    def _put(self, i: int, state: int, pid: int, start: int, nonce: int, body: bytes | None,
             seq: int = -1) -> None:
        at = i * SIZE
        if body is not None:
            self.map[at + _HEAD.size: at + _HEAD.size + len(body)] = body
        head = _HEAD.pack(state, pid, start, nonce,
                          len(body) if body is not None else self._head(i)[4], seq)
        # The state byte last, by itself: an asker reads its slot without the lock
        # once it says DONE (answer). pack_into zeroes the header before it fills
        # it in, so an asker could see DONE beside a nonce and a seq of 0.
        self.map[at + 1: at + _HEAD.size] = head[1:]
        self.map[at] = state

    def _body(self, i: int) -> bytes:
        n = self._head(i)[4]
        return bytes(self.map[i * SIZE + _HEAD.size: i * SIZE + _HEAD.size + n])

    def _locked(self):
        return _FileLock(self.fd, self._threads)

    # --- sleeping on a slot (Linux futex on the shared mapping) ----------------
    def word(self, i: int) -> int:
        return struct.unpack_from("<I", self.map, i * SIZE + _WORD)[0]

    def state(self, i: int) -> int:
        return self.map[i * SIZE]

    def sleep(self, i: int, seen: int, seconds: float) -> None:
        """Until slot `i`'s word is no longer `seen` (woken), or `seconds` pass."""
        _futex(self._addr(i), _WAIT, seen, seconds)

    def wake(self, i: int) -> None:
        """Change slot `i`'s word and wake whoever sleeps on it. Two wakers racing
        may change it once: the word still differs from what a sleeper saw."""
        if _SYSCALL is None:
            return
        struct.pack_into("<I", self.map, i * SIZE + _WORD, (self.word(i) + 1) & 0xFFFFFFFF)
        _futex(self._addr(i), _WAKE, 0x7FFFFFFF, None)

    def wake_asking(self) -> None:
        """The turn was let go: wake the first writer still asking, to take it (the
        others stay asleep; it takes their requests)."""
        i = self._states().find(ASKED)
        if i >= 0:
            self.wake(i)

    def _addr(self, i: int) -> int:
        if self._words is None:
            self._words = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
        return self._words + i * SIZE + _WORD

    # --- the asker ------------------------------------------------------------
    def ask(self, payload: bytes) -> tuple[int, int] | None:
        """Leave a request; returns (slot, nonce), or None (no room for it: write
        for yourself)."""
        if len(payload) > _BODY:
            return None
        pid, start = _me()
        nonce = secrets.randbits(63)
        with self._locked():
            states = self._states()
            i = states.find(FREE)
            if i < 0:   # none free: a dead owner's request or answer is nobody's (a
                # TAKEN or PENDING one is the turn holder's to finish, or take()'s)
                i = next((k for k, st in enumerate(states) if st in (ASKED, DONE)
                          and not _alive(*self._head(k)[1:3])), -1)
            if i < 0:
                return None
            self._put(i, ASKED, pid, start, nonce, payload)
            return i, nonce

    def _states(self) -> bytes:
        return self.map[0:SLOTS * SIZE:SIZE]   # each slot's first byte

    def answer(self, mine: tuple[int, int]):
        """With the turn held, or once the slot is DONE: ("done", answer, seq),
        ("pending", answer) from a holder killed before it could say whether the
        ref moved, or None: nobody wrote it (or the holder was killed first), so
        write it yourself. The slot is freed in every case.

        No lock where the processor keeps stores in order (x86): then nobody else
        changes this slot (a turn's holder only takes ASKED ones, and the turn is
        ours or done with it; ask() only reuses a FREE one, or a dead owner's), the
        holder writes the state byte after the rest (_put), and freeing it is one
        byte, written last. What does not add up is read again under the lock."""
        if _STORES_IN_ORDER:
            got = self._answer_of(mine, False)
            if got is not _TORN:
                return got
        with self._locked():   # as the holder wrote it, whatever the processor
            return self._answer_of(mine, True)

    def _answer_of(self, mine, locked: bool):
        i, nonce = mine
        state, _, _, n, _, seq = self._head(i)
        if n != nonce:   # not ours any more (cannot happen while we live)
            return None if locked else _TORN
        got = None
        if state in (DONE, PENDING):
            try:
                got = ("done" if state == DONE else "pending", json.loads(self._body(i)), seq)
            except ValueError:
                if not locked:
                    return _TORN
        self.map[i * SIZE] = FREE
        return got

    # --- the turn's holder ----------------------------------------------------
    def take(self) -> list[tuple[tuple[int, int], bytes]]:
        """Every waiting request, as ((slot, nonce), request), now TAKEN by the
        caller (who holds the turn); one whose owner has died since is written all
        the same, as if it had died just after. A TAKEN or PENDING slot left by a
        holder that was killed is cleared if its owner is dead too (a live owner
        reads it when its turn comes)."""
        out = []
        states = self._states()
        if states.count(FREE) + states.count(DONE) == SLOTS:
            return out   # nobody asks (a glance without the lock: the lock decides)
        with self._locked():
            for i, state in enumerate(self._states()):
                if state == ASKED:
                    _, pid, start, nonce = self._head(i)[:4]
                    out.append(((i, nonce), self._body(i)))
                    self._put(i, TAKEN, pid, start, nonce, None)
                elif state in (TAKEN, PENDING) and not _alive(*self._head(i)[1:3]):
                    self._put(i, FREE, 0, 0, 0, b"")
        return out

    def pending(self, answers) -> None:
        """[(taken request, its answer)], before the ref moves."""
        items = []
        for taken, answer in answers:
            body = json.dumps(answer).encode()
            if len(body) > _BODY:
                body = json.dumps({"self": True}).encode()
            items.append((taken, body))
        self._answer(items, (TAKEN, PENDING), PENDING, -1)

    def done(self, taken, seq: int) -> None:
        """The ref moved: the answers to the `taken` requests hold, durable once
        the log is synced through `seq` (-1: nothing to sync). The caller wakes
        their owners (`wake`) once it has let go of the turn: a woken process may
        take the CPU at once."""
        self._answer([(t, None) for t in taken], (PENDING,), DONE, seq)

    def _answer(self, items, states, state, seq) -> None:
        if not items:
            return
        with self._locked():   # each slot must still hold the request taken
            for (i, nonce), body in items:
                st, pid, start, n = self._head(i)[:4]
                if st in states and n == nonce:
                    self._put(i, state, pid, start, nonce, body, seq)


class _FileLock:
    """The slots' lock: flock for the other processes, and a thread lock first,
    since flock does not tell one process's threads apart (a worker renews its
    task's lease from a thread while it writes from another)."""

    def __init__(self, fd, threads):
        self.fd, self.threads = fd, threads

    def __enter__(self):
        self.threads.acquire()
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except BaseException:
            self.threads.release()
            raise

    def __exit__(self, *exc):
        try:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        finally:
            self.threads.release()
        return False


_WAIT, _WAKE = 0, 1   # FUTEX_WAIT, FUTEX_WAKE, not private: other processes map it
_SYS_FUTEX = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}.get(
    platform.machine().lower())   # the syscall's number on Linux


class _Timespec(ctypes.Structure):
    _fields_ = [("sec", ctypes.c_long), ("nsec", ctypes.c_long)]


def _libc_syscall():
    if _SYS_FUTEX is None or not platform.system() == "Linux":
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None


_SYSCALL = _libc_syscall()
CAN_SLEEP = _SYSCALL is not None   # else a writer waits for the turn to read its answer


def _futex(addr: int, op: int, val: int, seconds: float | None) -> None:
    ts = None
    if seconds is not None:
        ts = ctypes.byref(_Timespec(int(seconds), int((seconds % 1) * 1e9)))
    # ctypes lets go of the GIL for the call. EAGAIN (the word already changed),
    # ETIMEDOUT and EINTR all mean: look again.
    _SYSCALL(_SYS_FUTEX, ctypes.c_void_p(addr), op, ctypes.c_uint(val), ts, None, 0)


def for_ref(git_dir: str, ref: str) -> Slots | None:
    """This process's slots for `ref`, or None where they cannot be had (not
    POSIX, a read-only hub)."""
    return _shared(git_dir, ref, ".slots", Slots)


def forget(git_dir: str, ref: str) -> list:
    """Take `ref`'s slots and briefs out of this process's cache (writequeue.Using,
    once no write of the room runs here); returns what closes them."""
    out = []
    with _GUARD:
        for suffix in (".slots", ".briefs"):
            got = _OPEN.pop(_path(git_dir, ref, suffix), None)
            if got is not None and got[0] == os.getpid() and got[1] is not None:
                out += [got[1].map.close, lambda fd=got[1].fd: os.close(fd)]
    return out


def _path(git_dir: str, ref: str, suffix: str) -> str:
    return os.path.join(git_dir, "gitdrop", "queue", ref.replace("/", "%") + suffix)


def _shared(git_dir: str, ref: str, suffix: str, kind):
    """This process's `kind` over `<hub>/gitdrop/queue/<ref><suffix>` (opened once
    per process; None where it cannot be: not POSIX, a read-only hub)."""
    if fcntl is None or mmap is None:
        return None
    path = _path(git_dir, ref, suffix)
    with _GUARD:
        got = _OPEN.get(path)
        if got is None or got[0] != os.getpid():
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                got = _OPEN[path] = (os.getpid(), kind(path))
            except (OSError, ValueError):
                _OPEN[path] = got = (os.getpid(), None)
        return got[1]


# --- answers ------------------------------------------------------------------

def encode(outcome, tip: str) -> dict:
    """An operation's outcome as the holder writes it: (commit, result), a
    GitdropError, a Replayed, or anything else (the asker then writes it itself)."""
    if isinstance(outcome, tuple):
        return {"ok": [outcome[0], outcome[1]], "tip": tip}
    if isinstance(outcome, Replayed):
        return {"replayed": outcome.result, "tip": tip}
    if isinstance(outcome, GitdropError):
        return {"error": [type(outcome).__name__, outcome.rule, outcome.reason, outcome.fix,
                          outcome.commit], "tip": tip}
    return {"self": True}


def decode(answer: dict):
    """The outcome an answer names (raises nothing: an error is returned), or None
    for "write it yourself"."""
    if "ok" in answer:
        return tuple(answer["ok"])
    if "replayed" in answer:
        return Replayed(answer["replayed"])
    if "error" in answer:
        kind, rule, reason, fix, commit = answer["error"]
        cls = getattr(errors, kind, None)
        if cls is Refusal:
            return Refusal(rule, reason, fix, commit)
        if isinstance(cls, type) and issubclass(cls, GitdropError):
            return cls(reason, fix, commit)
        return Refusal(rule, reason, fix, commit)
    return None


class Ticket:
    """A write another process made for us: durable once its log record is."""

    def __init__(self, log, seq: int):
        self.log, self.unsynced = log, seq

    def sync(self) -> None:
        if self.unsynced is not None and self.log is not None:
            self.log.sync_through(self.unsynced)
            self.unsynced = None


# --- what each new commit says, shared -----------------------------------------

_BRIEFS, _BSIZE = 4096, 512
_FRESH = 256   # entries a process reads when it first opens the ring
_BCOUNT = struct.Struct("<Q")      # entries written so far
_BHEAD = struct.Struct("<QIH")     # entry number + 1, crc32 of the text, its length


class Briefs:
    """The last commits written to one ref on this machine, each as the walk back
    to a read cursor needs it (parent, author, time, whether it is a message, to,
    cc: rules._brief), in a ring mapped in memory (`<ref>.briefs`). The writer
    whose turn it is adds the commits it wrote; every writer reads what was added
    since it last looked before it builds. Without it each writer read every other
    writer's commits from their files, inside its turn. Beside a commit whose
    check walked back to its author's read cursor goes where that walk ended (the
    walk memo's entry, rules._quick_ok): the next turn's holder, often another
    process, starts that author's next walk there instead of at its own older
    entry. Keyed by commit id, so an entry is never stale; a torn or overwritten
    one fails its check and the commit is read from its file instead."""

    def __init__(self, path: str):
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | NOFOLLOW, 0o664)
        size = _BCOUNT.size + _BRIEFS * _BSIZE
        if os.fstat(self.fd).st_size < size:
            os.ftruncate(self.fd, size)
        self.map = mmap.mmap(self.fd, size)
        # A new process (a CLI command) starts near the end: decoding the whole ring
        # cost it 20 ms a write; what its first walk reaches past this is read from files.
        self.seen = max(0, _BCOUNT.unpack_from(self.map, 0)[0] - _FRESH)
        self.newest: dict = {}   # author -> number of its newest entry not yet used

    def add(self, briefs) -> None:
        """With the turn held: `briefs` is [(oid, (parent, author, time, message,
        to, cc), walk)] of the commits just written, in order; `walk` is the entry
        the unread check left in the walk memo (rules._quick_ok) or None."""
        n = _BCOUNT.unpack_from(self.map, 0)[0]
        for oid, (parent, author, when, message, to, cc), walk in briefs:
            fields = [oid, parent, author, str(when), "1" if message else "",
                      ",".join(to), ",".join(cc)]
            if walk is not None:
                fields.append(_walk_text(walk))
            text = "\t".join(fields).encode()
            at = _BCOUNT.size + (n % _BRIEFS) * _BSIZE
            if len(text) <= _BSIZE - _BHEAD.size:   # a longer one: read from its file
                self.map[at + _BHEAD.size: at + _BHEAD.size + len(text)] = text
                _BHEAD.pack_into(self.map, at, n + 1, zlib.crc32(text), len(text))
            else:
                _BHEAD.pack_into(self.map, at, 0, 0, 0)
            n += 1
        _BCOUNT.pack_into(self.map, 0, n)

    def since(self, known: dict) -> None:
        """Add to `known` ({commit id: brief}) the commits added since this process
        last looked, and note each author's newest entry, for walk_for."""
        n = _BCOUNT.unpack_from(self.map, 0)[0]
        if n <= self.seen:   # nothing new (or a count read while add() rewrote it)
            return
        for k in range(max(self.seen, n - _BRIEFS + 1), n):
            f = self._fields(k)
            if f is not None:
                known[f[0]] = (f[1], f[2], int(f[3]), f[4] == "1",
                               frozenset(f[5].split(",")) - {""},
                               frozenset(f[6].split(",")) - {""})
                self.newest[f[2]] = k
        self.seen = n

    def _fields(self, k: int) -> list | None:
        at = _BCOUNT.size + (k % _BRIEFS) * _BSIZE
        number, crc, length = _BHEAD.unpack_from(self.map, at)
        text = bytes(self.map[at + _BHEAD.size: at + _BHEAD.size + length])
        if number != k + 1 or zlib.crc32(text) != crc:
            return None   # overwritten since, or torn: read from the commit's file
        f = text.decode().split("\t")
        return f if len(f) in (7, 8) else None

    def walk_for(self, author: str):
        """The walk memo entry (key, value) beside `author`'s newest commit noted by
        since(), once (later ones are this process's own), or None."""
        k = self.newest.pop(author, None)
        f = self._fields(k) if k is not None else None
        return _walk_from(author, f[7]) if f is not None and len(f) == 8 else None


def _walk_text(walk) -> str:
    """A walk memo entry ((author, cursor, lead), (tip, found, unread, floor,
    own times)) as one field of a brief (its author is the brief's)."""
    (_, cursor, lead), (tip, found, unread, floor, own) = walk
    return " ".join([cursor or "-", "1" if lead else "0", tip, "1" if found else "0",
                     str(unread), "-" if floor is None else str(floor)] + [str(t) for t in own])


def _walk_from(author: str, text: str):
    try:
        cursor, lead, tip, found, unread, floor, *own = text.split(" ")
        return ((author, "" if cursor == "-" else cursor, lead == "1"),
                (tip, found == "1", int(unread), None if floor == "-" else int(floor),
                 [int(t) for t in own]))
    except ValueError:
        return None


def briefs_for(git_dir: str, ref: str) -> Briefs | None:
    return _shared(git_dir, ref, ".briefs", Briefs)


writequeue.FORGET.append(forget)
