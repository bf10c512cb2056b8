"""Writers of one room on this machine hand their writes to whoever has the turn.

A writer about to wait for the room's turn (writequeue.Turn) first leaves what it
wants written in a slot of a file the room's writers share, mapped in memory
(`<hub>/gitdrop/queue/<ref>.slots`): the room, the verb and its arguments, never
code. Whoever gets the turn makes its own write and every one waiting in a slot,
each its own commit built on the one before and checked by the rules, and moves
the ref once: one lock, one log record, one flush for the lot (flat combining).
A writer that gets the turn and finds its answer in its slot returns it without
writing. Without this, each writer in line pays for a whole turn, so eight
writers of one room were slower together than one alone.

A slot goes FREE -> ASKED (its owner wrote the request) -> TAKEN (a turn's holder
took it) -> PENDING (the answer is written, the ref not yet moved) -> DONE (the
ref moved; the log record's number is beside the answer) -> FREE (its owner read
it). Requests are changed under a lock on the file; answers only by the turn's
holder. Kill safety: a holder killed before PENDING moved no ref, so its
requests' owners write for themselves; one killed at PENDING may have moved it,
so the owner looks for the batch's commit in the room's history before it trusts
or redoes the answer. A slot whose owner died is reused.
"""

import json
import os
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
from . import errors

SLOTS, SIZE = 64, 16384
FREE, ASKED, TAKEN, PENDING, DONE = range(5)
_HEAD = struct.Struct("<B3xIQQIq")   # state, owner pid, its start time, nonce, length, seq
_OPEN: dict = {}
_GUARD = threading.Lock()


class Replayed(Exception):
    """An operation already in the room (its idempotency key): `result` is its answer
    and no commit is written."""

    def __init__(self, result: dict):
        super().__init__("replayed")
        self.result = result


class Recipe:
    """What travels to the turn's holder: `payload` (bytes naming the room, verb and
    arguments), and `rebuild(store, ref, payload) -> (build, author, now)`, which the
    holder calls for the requests it takes (the same function in every process)."""

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
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o664)
        if os.fstat(self.fd).st_size < SLOTS * SIZE:
            os.ftruncate(self.fd, SLOTS * SIZE)   # only ever grows to this: idempotent
        self.map = mmap.mmap(self.fd, SLOTS * SIZE)

    def _head(self, i: int) -> list:
        return list(_HEAD.unpack_from(self.map, i * SIZE))

    def _put(self, i: int, state: int, pid: int, start: int, nonce: int, body: bytes | None,
             seq: int = -1) -> None:
        if body is not None:
            self.map[i * SIZE + _HEAD.size: i * SIZE + _HEAD.size + len(body)] = body
        _HEAD.pack_into(self.map, i * SIZE, state, pid, start, nonce,
                        len(body) if body is not None else self._head(i)[4], seq)

    def _body(self, i: int) -> bytes:
        n = self._head(i)[4]
        return bytes(self.map[i * SIZE + _HEAD.size: i * SIZE + _HEAD.size + n])

    def _locked(self):
        return _FileLock(self.fd)

    # --- the asker ------------------------------------------------------------
    def ask(self, payload: bytes) -> tuple[int, int] | None:
        """Leave a request; returns (slot, nonce), or None (no room for it: write
        for yourself)."""
        if len(payload) > SIZE - _HEAD.size:
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
        """With the turn held: ("done", answer, seq), ("pending", answer) from a
        holder killed before it could say whether the ref moved, or None: nobody
        wrote it (or the holder was killed first), so write it yourself. The slot
        is freed in every case."""
        i, nonce = mine
        got = None
        with self._locked():
            state, _, _, n, _, seq = self._head(i)
            if n != nonce:   # not ours any more (cannot happen while we live)
                return None
            if state in (DONE, PENDING):
                try:
                    got = ("done" if state == DONE else "pending", json.loads(self._body(i)), seq)
                except ValueError:
                    got = None
            self._put(i, FREE, 0, 0, 0, b"")
        return got

    # --- the turn's holder ----------------------------------------------------
    def take(self) -> list[tuple[tuple[int, int], bytes]]:
        """Every waiting request, as ((slot, nonce), request), now TAKEN by the
        caller (who holds the turn); one whose owner has died since is written all
        the same, as if it had died just after. A TAKEN or PENDING slot left by a
        holder that was killed is cleared if its owner is dead too (a live owner
        reads it when its turn comes)."""
        out = []
        with self._locked():
            for i, state in enumerate(self._states()):
                if state == ASKED:
                    _, pid, start, nonce = self._head(i)[:4]
                    out.append(((i, nonce), self._body(i)))
                    self._put(i, TAKEN, pid, start, nonce, None)
                elif state in (TAKEN, PENDING) and not _alive(*self._head(i)[1:3]):
                    self._put(i, FREE, 0, 0, 0, b"")
        return out

    def pending(self, taken: tuple[int, int], answer: dict) -> None:
        """The answer to a taken request, before the ref moves."""
        body = json.dumps(answer).encode()
        if len(body) > SIZE - _HEAD.size:
            body = json.dumps({"self": True}).encode()
        self._answer(taken, (TAKEN, PENDING), PENDING, body, -1)

    def done(self, taken: tuple[int, int], seq: int) -> None:
        """The ref moved: the answer holds, durable once the log is synced through
        `seq` (-1: nothing to sync)."""
        self._answer(taken, (PENDING,), DONE, None, seq)

    def _answer(self, taken, states, state, body, seq) -> None:
        i, nonce = taken
        with self._locked():   # the slot must still hold the request taken
            st, pid, start, n = self._head(i)[:4]
            if st in states and n == nonce:
                self._put(i, state, pid, start, nonce, body, seq)


class _FileLock:
    def __init__(self, fd):
        self.fd = fd

    def __enter__(self):
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc):
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        return False


def for_ref(git_dir: str, ref: str) -> Slots | None:
    """This process's slots for `ref`, or None where they cannot be had (not
    POSIX, a read-only hub)."""
    return _shared(git_dir, ref, ".slots", Slots)


def _shared(git_dir: str, ref: str, suffix: str, kind):
    """This process's `kind` over `<hub>/gitdrop/queue/<ref><suffix>` (opened once
    per process; None where it cannot be: not POSIX, a read-only hub)."""
    if fcntl is None or mmap is None:
        return None
    path = os.path.join(git_dir, "gitdrop", "queue", ref.replace("/", "%") + suffix)
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
    writer's commits from their files, inside its turn. Keyed by commit id, so an
    entry is never stale; a torn or overwritten one fails its check and the commit
    is read from its file instead."""

    def __init__(self, path: str):
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o664)
        size = _BCOUNT.size + _BRIEFS * _BSIZE
        if os.fstat(self.fd).st_size < size:
            os.ftruncate(self.fd, size)
        self.map = mmap.mmap(self.fd, size)
        # A new process (a CLI command) starts near the end: decoding the whole ring
        # cost it 20 ms a write; what its first walk reaches past this is read from files.
        self.seen = max(0, _BCOUNT.unpack_from(self.map, 0)[0] - _FRESH)

    def add(self, briefs) -> None:
        """With the turn held: `briefs` is [(oid, (parent, author, time, message,
        to, cc))] of the commits just written, in order."""
        n = _BCOUNT.unpack_from(self.map, 0)[0]
        for oid, (parent, author, when, message, to, cc) in briefs:
            text = "\t".join([oid, parent, author, str(when), "1" if message else "",
                              ",".join(to), ",".join(cc)]).encode()
            at = _BCOUNT.size + (n % _BRIEFS) * _BSIZE
            if len(text) <= _BSIZE - _BHEAD.size:   # a longer one: read from its file
                self.map[at + _BHEAD.size: at + _BHEAD.size + len(text)] = text
                _BHEAD.pack_into(self.map, at, n + 1, zlib.crc32(text), len(text))
            else:
                _BHEAD.pack_into(self.map, at, 0, 0, 0)
            n += 1
        _BCOUNT.pack_into(self.map, 0, n)

    def since(self) -> dict:
        """{oid: brief} of the entries added since this process last looked."""
        n = _BCOUNT.unpack_from(self.map, 0)[0]
        out = {}
        for k in range(max(self.seen, n - _BRIEFS + 1), n):
            at = _BCOUNT.size + (k % _BRIEFS) * _BSIZE
            number, crc, length = _BHEAD.unpack_from(self.map, at)
            text = bytes(self.map[at + _BHEAD.size: at + _BHEAD.size + length])
            if number != k + 1 or zlib.crc32(text) != crc:
                continue
            f = text.decode().split("\t")
            if len(f) == 7:
                out[f[0]] = (f[1], f[2], int(f[3]), f[4] == "1",
                             frozenset(f[5].split(",")) - {""},
                             frozenset(f[6].split(",")) - {""})
        self.seen = n
        return out


def briefs_for(git_dir: str, ref: str) -> Briefs | None:
    return _shared(git_dir, ref, ".briefs", Briefs)
