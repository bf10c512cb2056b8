"""The writers of one ref on this machine take turns, so a local write never
fails because others are writing.

Each writer holds a lock on a file for its ref (flock) while it builds on the tip
and moves the ref: the next one builds on what it left, instead of racing for the
tip and starting over, as compare-and-swap alone makes them do (that stays, for
git's own writers: a push). The turn ends as soon as the ref has moved; the
write's log record is synced after (durable.Writer.sync), so the next writer
builds while this one waits on the disk, and one fdatasync serves every writer
that came through meanwhile (group commit). A writer killed in its turn lets go
of the lock with its last file descriptor.
"""

import _thread
import collections
import contextvars
import os
import time

from .files import NOFOLLOW

try:
    import fcntl
except ImportError:   # not POSIX: compare-and-swap alone
    fcntl = None

# Per process: {"writes", "retries" (lost compare-and-swaps), "waited" (seconds in
# line), "carried" (others' writes made in this process's turns, gitdrop.combine),
# "answered" (own writes another process made)}.
STATS = {"writes": 0, "retries": 0, "waited": 0.0, "carried": 0, "answered": 0}
_FILES: dict = {}     # lock path -> (pid, thread lock, fd)
_GUARD = _thread.allocate_lock()
# A process keeps the files of at most KEEP rooms open between their writes (each
# room: its turn's lock here, its slots and briefs in gitdrop.combine: 5 descriptors).
# One process writing to hundreds of rooms (a web board, a reaper) ran out of them.
KEEP = 64
_USERS: "collections.OrderedDict[tuple[str, str], int]" = collections.OrderedDict()
FORGET: list = []   # fn(git_dir, ref) -> closers of its files (gitdrop.combine adds one)
_LATER: contextvars.ContextVar = contextvars.ContextVar("gitdrop_sync_later", default=None)
# The turn for making a room on this hub (not a ref): a new room's name is checked
# against the others' (case twins) and made inside it.
NEW_ROOMS = "gitdrop/new-rooms"


def _lock_path(git_dir: str, ref: str) -> str:
    return os.path.join(git_dir, "gitdrop", "queue", ref.replace("/", "%"))


def _handle(path: str):
    with _GUARD:
        got = _FILES.get(path)
        if got is None or got[0] != os.getpid():   # none yet, or forked
            d = os.path.dirname(path)
            try:
                os.makedirs(d, exist_ok=True)
                fd = os.open(path, os.O_RDWR | os.O_CREAT | NOFOLLOW, 0o664)
            except OSError:
                return None   # a read-only place: compare-and-swap alone
            got = _FILES[path] = (os.getpid(), _thread.allocate_lock(), fd)
        return got


class Using:
    """`with Using(git_dir, ref):` around every use of a room's files in this process
    (the write loop): past KEEP rooms, those of the rooms used longest ago, and by
    no write now, are closed (a room used again opens them again)."""

    def __init__(self, git_dir: str, ref: str):
        self.key = (git_dir, ref)

    def __enter__(self):
        with _GUARD:
            _USERS[self.key] = _USERS.get(self.key, 0) + 1
            _USERS.move_to_end(self.key)
        return self

    def __exit__(self, kind, value, tb):
        closing = []
        with _GUARD:
            _USERS[self.key] -= 1
            extra = len(_USERS) - KEEP
            if extra > 0:
                for key in [k for k, n in _USERS.items() if n == 0][:extra]:
                    del _USERS[key]
                    closing += _forget(*key)
        _close(closing)   # out of every cache: nobody here reaches them any more
        return False


def forget_room(git_dir: str, ref: str) -> None:
    """Close this process's files of `ref` (they were removed: a room gone), unless a
    write of it runs here now; the next write opens new ones."""
    with _GUARD:
        if _USERS.get((git_dir, ref)):
            return
        _USERS.pop((git_dir, ref), None)
        closing = _forget(git_dir, ref)
    _close(closing)


def _close(closing) -> None:
    for close in closing:
        try:
            close()
        except (OSError, ValueError, BufferError):
            pass


def _forget(git_dir: str, ref: str) -> list:
    """With _GUARD held: take `ref`'s files out of the caches (a write that starts
    next opens new ones); returns what closes them."""
    got = _FILES.pop(_lock_path(git_dir, ref), None)
    out = [lambda fd=got[2]: os.close(fd)] if got is not None and got[0] == os.getpid() else []
    for fn in FORGET:
        out += fn(git_dir, ref)
    return out


class Turn:
    """`with Turn(git_dir, ref):` waits for this ref's turn (threads of this process
    too: flock does not tell them apart, so a thread lock goes first)."""

    def __init__(self, git_dir: str, ref: str):
        self.handle = _handle(_lock_path(git_dir, ref)) if fcntl else None

    def __enter__(self):
        if self.handle is None:
            return self
        start = time.perf_counter()
        _, threads, fd = self.handle
        threads.acquire()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            threads.release()
            raise
        STATS["waited"] += time.perf_counter() - start
        return self

    def try_enter(self) -> bool:
        """Take the turn if nobody has it; False at once if somebody does."""
        if self.handle is None:
            return True
        _, threads, fd = self.handle
        if not threads.acquire(False):
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            threads.release()
            return False
        except BaseException:
            threads.release()
            raise
        return True

    def __exit__(self, kind, value, tb):
        if self.handle is not None:
            _, threads, fd = self.handle
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                threads.release()
        return False


class SyncLater:
    """`with SyncLater() as writers:` the writes made inside return before their
    records are synced, and `writers` holds them: for a server on an event loop,
    which answers the call only after `sync_all(writers)` ran on a thread, and
    meanwhile serves other calls (whose syncs that one fdatasync may cover)."""

    def __enter__(self) -> list:
        self.writers: list = []
        self.token = _LATER.set(self.writers)
        return self.writers

    def __exit__(self, kind, value, tb):
        _LATER.reset(self.token)
        return False


def sync_later(writer) -> bool:
    """Hand `writer`'s sync to the enclosing SyncLater, if any."""
    later = _LATER.get()
    if later is None:
        return False
    later.append(writer)
    return True


def sync_all(writers) -> None:
    for w in writers:
        w.sync()
