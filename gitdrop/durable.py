"""Loose objects and ref moves written by gitdrop itself.

Methods:
- "wal" (the default where it works): each write's objects and ref update go
  into the hub's write-ahead log (gitdrop.wal) with one fdatasync; the loose
  files and the ref are then written without fsync. After a crash the log is
  replayed before anything reads the hub.
- "fsync": every object file and its directory, the ref's lock and its
  directory are fsynced, as libgit2's fsync mode does.
- "none": the OS writes when it likes (gitdrop.fsync = false).

Objects are written in git's loose format and refs with git's lock protocol
(`<ref>.lock` created exclusively, old value compared under the lock, renamed
into place), so git, libgit2 and this writer exclude one another.
See docs/DURABILITY.md.
"""

import hashlib
import os
import zlib

from . import locks, wal
from .wal import damaged, is_oid, read_ref  # noqa: F401 (here since before the log had them)
from .wal import fsync_path as _fsync_path

METHODS = ("wal", "fsync", "none")


_renameat2 = None


def _into_place(lock: str, path: str, swap: bool = True) -> None:
    """Put the lock file in place of the ref. Swapping the two (renameat2 with
    RENAME_EXCHANGE), then removing the lock (now the old value), is as atomic for
    readers as rename and keeps the lock held to the end; ext4 flushes a file
    renamed over another at once (auto_da_alloc, ~0.2 ms), but not a swapped one.
    A crash between the swap and the removal leaves a stale lock, which the log's
    replay clears; without the log (swap=False) the ref is renamed over."""
    global _renameat2
    if not swap:
        os.rename(lock, path)
        return
    if _renameat2 is None:
        try:
            import ctypes
            fn = ctypes.CDLL(None, use_errno=True).renameat2
            fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                           ctypes.c_uint]
            _renameat2 = fn
        except (AttributeError, OSError):
            _renameat2 = False
    if _renameat2 and _renameat2(-100, lock.encode(), -100, path.encode(), 2) == 0:
        os.unlink(lock)
        return
    os.rename(lock, path)   # no ref yet, or no exchange here


def _deflate(raw: bytes) -> bytes:
    """The loose object's zlib stream. zlib's default state is ~260 KB, which
    malloc maps fresh for every call: 70-90 us to compress a 380-byte commit. An
    8 KB window covers a small object whole, so the output is the same size, in
    a tenth of the time; any inflate reads it (git, libgit2)."""
    if len(raw) <= 8192:
        c = zlib.compressobj(1, zlib.DEFLATED, 13, 6)
        return c.compress(raw) + c.flush()
    return zlib.compress(raw, 1)


class Writer:
    """Writes the objects of one or more commits, then moves a ref with CAS."""

    def __init__(self, git_dir: str, method: str = "wal"):
        if method not in METHODS:
            raise ValueError(f"unknown fsync method {method!r}")
        self.git_dir = git_dir
        self.method = method
        self.log = wal.for_hub(git_dir) if method == "wal" else None
        self.logged: dict[str, bytes] = {}   # oid -> loose bytes, for the log
        self.pending: list = []              # (kind, oid, loose bytes) not yet in files
        self.named: list[str] = []           # object files this writer made (wal)
        self.new_dirs: set[str] = set()      # object directories made (fsync)
        # Group commit (set by the write loop): a ref moves before its record is
        # synced, and sync() makes it durable once the room's queue is let go.
        self.defer_sync = False
        self.unsynced: int | None = None     # the last record's seq, not yet synced

    # --- objects --------------------------------------------------------------
    def write(self, kind: str, data: bytes) -> str:
        """Store one object in the loose format; returns its id (hex). Under the
        log every object of the write is logged, present or not (a file another
        writer left, a lost race, may not be on the device yet), and its loose
        file is written while the log syncs (move_ref), or by settle()."""
        raw = b"%s %d\0" % (kind.encode(), len(data)) + data
        oid = hashlib.sha1(raw).hexdigest()
        if oid in self.logged:
            return oid
        loose = _deflate(raw)
        if self.log is not None:
            self.logged[oid] = loose
            self.pending.append((kind, oid, loose))
        else:
            self._put(kind, oid, loose)
        return oid

    def settle(self) -> None:
        """Write the loose files of the objects logged so far: before anything
        reads them back (the next commit of a group commit is built on this one)."""
        pending, self.pending = self.pending, []
        for kind, oid, loose in pending:
            self._put(kind, oid, loose)

    def _put(self, kind: str, oid: str, loose: bytes) -> None:
        d = os.path.join(self.git_dir, "objects", oid[:2])
        path = os.path.join(d, oid[2:])
        # A new commit (its time, parent and message) is as good as never there
        # already: the check is for blobs and trees.
        if kind != "commit" and os.path.exists(path):
            return
        tmp = os.path.join(d, f"tmp_obj_{os.getpid()}_{os.urandom(6).hex()}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)
        except FileNotFoundError:   # the first object in its directory
            os.makedirs(d, exist_ok=True)
            self.new_dirs.add(d)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)
        try:
            os.write(fd, loose)
            if self.method == "fsync":
                os.fsync(fd)
        except BaseException:   # a full disk, say: leave no half file behind
            os.close(fd)
            os.unlink(tmp)
            raise
        os.close(fd)
        os.replace(tmp, path)   # named only once whole: readers never see part of it
        if self.method == "fsync":
            _fsync_path(d)
        elif self.log is not None:
            self.named.append(path)

    def blob(self, data: bytes) -> str:
        return self.write("blob", data)

    def tree(self, entries) -> str:
        """entries: (name, mode int, oid hex); sorted here as git sorts them."""
        def key(e):
            return e[0] + "/" if e[1] == 0o040000 else e[0]
        body = b"".join(b"%s %s\0%s" % (f"{mode:o}".encode(), name.encode(), bytes.fromhex(oid))
                        for name, mode, oid in sorted(entries, key=key))
        return self.write("tree", body)

    def commit(self, tree: str, parents, author: str, email: str, when: int,
               message: str) -> str:
        """The bytes libgit2's create_commit writes for a +0000 signature."""
        who = f"{author} <{email}> {when} +0000".encode()
        head = b"tree %s\n" % tree.encode() + b"".join(b"parent %s\n" % p.encode() for p in parents)
        return self.write("commit", head + b"author %s\ncommitter %s\n\n" % (who, who)
                          + message.encode())

    def _fsync_named(self) -> None:
        """A write too big for the log is made durable file by file instead."""
        for path in self.named:
            _fsync_path(path)
        for d in {os.path.dirname(p) for p in self.named}:
            _fsync_path(d)
        for d in self.new_dirs:
            _fsync_path(os.path.dirname(d))

    def sync(self) -> None:
        """Make the refs this writer moved with a deferred sync durable (one
        fdatasync, often shared with the writers queued behind it)."""
        if self.unsynced is not None:
            self.log.sync_through(self.unsynced)
            self.unsynced = None

    # --- refs -------------------------------------------------------------------
    def current(self, ref: str) -> str:
        return read_ref(self.git_dir, ref)

    def move_ref(self, ref: str, expected: str, new: str) -> bool:
        """Compare-and-swap `ref` from `expected` ("" = absent) to `new`, after
        making every object written so far durable. False if it moved or is locked
        (a lock whose owner is dead is cleared first: gitdrop.locks)."""
        path = os.path.join(self.git_dir, ref)
        lock = path + ".lock"
        d = os.path.dirname(path)
        fd = locks.take(lock)   # flocked until it is renamed or removed
        if fd is None:
            # Someone's lock: a live writer's (a lost race), or a dead one's, cleared
            # here once it is old enough (waiting for that, so the next write after
            # a kill goes through). Either way the ref may have moved: build again.
            wal.clear_lock(self.git_dir, ref)
            return False
        try:
            if self.current(ref) != expected:
                return False
            os.write(fd, new.encode() + b"\n")
            if self.log is not None:
                try:
                    # The loose files go first: once the ref moves, readers open them.
                    self.settle()
                    deferred = self.defer_sync
                    with self.log.append([(ref, expected, new)], self.logged.items(),
                                         sync=not deferred) as rec:
                        _into_place(lock, path)
                    lock = ""
                    if deferred:
                        self.unsynced = rec.seq
                    return True
                except wal.TooBig:
                    self.settle()
                    self._fsync_named()
                    os.fsync(fd)
            elif self.method == "fsync":
                os.fsync(fd)
                for nd in self.new_dirs:
                    _fsync_path(os.path.dirname(nd))
            # Renamed over, not swapped: outside the log's lock, the lock's path must
            # never name an unlocked file while its owner lives.
            _into_place(lock, path, swap=False)
            lock = ""
            self.new_dirs.clear()
            if self.method != "none":
                _fsync_path(d)
            return True
        finally:
            try:
                if lock:
                    os.unlink(lock)
            except FileNotFoundError:
                pass
            finally:
                os.close(fd)


def method_for(cfg, path: str) -> str:
    """How a hub's in-process writes are made durable: "wal", "fsync" (libgit2's
    fsync of every file) or "none". gitdrop.fsync = false gives none;
    gitdrop.fsyncMethod = auto (the default) or wal gives the log wherever gitdrop
    writes the refs itself (no reflogs, no shared permissions, SHA-1), else fsync."""
    def get(key, default=""):
        return str(cfg[key]).lower() if key in cfg else default
    if get("gitdrop.fsync", "true") == "false":
        return "none"
    method = get("gitdrop.fsyncmethod", "auto")
    if method == "fsync" or get("core.logallrefupdates") in ("true", "always") or \
            get("core.sharedrepository") not in ("", "false", "umask", "0") or \
            get("extensions.objectformat", "sha1") != "sha1" or not wal.supported():
        return "fsync"
    return "wal"
