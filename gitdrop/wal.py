"""The hub's write-ahead log: a write is durable after one fdatasync.

A write logs its new objects (their loose bytes) and its ref updates as one record
in a preallocated file (`<hub>/gitdrop/wal`), fdatasyncs it, and only then writes
the loose objects and renames the ref into place, without fsync. Overwriting
blocks that are already allocated and written commits no metadata, so the
fdatasync costs one device write and flush, as a database's log does; the
per-file fsyncs git would need (object, directory, ref, directory) are gone.

After a crash, before anything reads the hub, `ensure` replays the log: objects
missing or damaged are written again, refs the crash left behind are moved
forward. A crash is known by the boot id: the header holds the boot it was last
made consistent in, and a different boot means the machine went down in between
(a process that dies leaves the page cache, and so every write, intact).

When the log is full, `syncfs` makes everything it names durable in git's own
form, and the log starts a new lap from the top. See docs/DURABILITY.md.
"""

import _thread
import os
import struct
import sys
import time
import zlib

from . import locks
from .files import NOFOLLOW

try:
    import fcntl
except ImportError:   # not POSIX: no log (supported() says so); hubs fsync every file
    fcntl = None

HEADER = 4096                         # header page; records start here
DEFAULT_SIZE = 4 << 20          # ~7,000 sends a lap
MAGIC = b"GDWAL\x00\x01\n"
_HEAD = struct.Struct("<8sQ36sQ")     # magic, lap, boot id, size (durable; crc follows)
_HINT_AT = 512                        # tail, next seq: hints, rebuilt by a replay
_HINT = struct.Struct("<QQ")
_SYNCED_AT = 528                      # every record below this seq is durable: a hint
_SYNCED = struct.Struct("<QI")        # and a crc32 of it: read without a lock (_synced)
_REC = struct.Struct("<4sQQII")       # magic, lap, seq, payload length, crc32
REC_MAGIC = b"GDR1"
ZERO = "0" * 40
_OPEN: dict = {}                      # (pid, path) -> Log
_libc = None


class TooBig(Exception):
    """A record larger than the log: the caller makes that write durable itself."""


def boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def supported() -> bool:
    """The log needs a boot id (Linux) to tell a crash from a process restart."""
    return fcntl is not None and bool(boot_id())


def path_for(git_dir: str) -> str:
    return os.path.join(git_dir, "gitdrop", "wal")


def for_hub(git_dir: str, size: int = DEFAULT_SIZE) -> "Log":
    """This process's handle on the hub's log, created if it has none yet."""
    log = _OPEN.get((os.getpid(), git_dir))
    if log is None:
        key = (os.getpid(), os.path.realpath(git_dir))
        log = _OPEN.get(key)
        if log is None:
            create(git_dir, size)
            log = _OPEN[key] = Log(git_dir)
        _OPEN[(os.getpid(), git_dir)] = log
    return log


def ensure(git_dir: str) -> None:
    """Replay the hub's log if the machine went down since it was last consistent.
    Every reader and writer calls this first; after the first call it is free."""
    if (os.getpid(), git_dir) in _OPEN:
        return
    if os.path.exists(path_for(git_dir)):
        for_hub(git_dir)


def create(git_dir: str, size: int = DEFAULT_SIZE) -> None:
    """A log of `size` bytes, every block written (zeros) and synced once, so that
    a record's fdatasync later has no allocation to commit."""
    path = path_for(git_dir)
    if os.path.exists(path):
        return
    size = max(size, HEADER * 4)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.new{os.getpid()}"
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | NOFOLLOW, 0o644)
    try:
        head = _header(1, boot_id(), size).ljust(_HINT_AT, b"\0") + _HINT.pack(HEADER, 0)
        os.write(fd, head.ljust(HEADER, b"\0"))
        chunk = b"\0" * (1 << 20)
        left = size - HEADER
        while left > 0:
            left -= os.write(fd, chunk[:left])
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)   # never over a log another process made meanwhile
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
    fsync_path(os.path.dirname(path))


def _synced_mark(seq: int) -> bytes:
    value = struct.pack("<Q", seq)
    return value + struct.pack("<I", zlib.crc32(value))


def _header(lap: int, boot: str, size: int) -> bytes:
    head = _HEAD.pack(MAGIC, lap, boot.encode().ljust(36, b"\0")[:36], size)
    return head + struct.pack("<I", zlib.crc32(head))


def fsync_path(path: str) -> None:
    """fsync a file or a directory by name."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _syncfs(fd: int) -> None:
    """Everything written on this filesystem reaches the device (data and names)."""
    global _libc
    if _libc is None:
        import ctypes
        _libc = ctypes.CDLL(None, use_errno=True)
    fn = getattr(_libc, "syncfs", None)
    if fn is None or fn(fd) != 0:
        os.sync()


def _encode(updates, objects) -> bytes:
    """updates: [(ref, old, new)] ("" = absent); objects: [(oid, loose bytes)]."""
    out = [struct.pack("<I", len(updates))]
    for ref, old, new in updates:
        r = ref.encode()
        out.append(struct.pack("<H", len(r)) + r + bytes.fromhex(old or ZERO) +
                   bytes.fromhex(new or ZERO))
    out.append(struct.pack("<I", len(objects)))
    for oid, data in objects:
        out.append(bytes.fromhex(oid) + struct.pack("<I", len(data)) + data)
    return b"".join(out)


def _decode(payload: bytes):
    at, updates, objects = 4, [], []
    (n,) = struct.unpack_from("<I", payload, 0)
    for _ in range(n):
        (rl,) = struct.unpack_from("<H", payload, at)
        ref = payload[at + 2:at + 2 + rl].decode()
        at += 2 + rl
        old, new = payload[at:at + 20].hex(), payload[at + 20:at + 40].hex()
        at += 40
        updates.append((ref, "" if old == ZERO else old, "" if new == ZERO else new))
    (n,) = struct.unpack_from("<I", payload, at)
    at += 4
    for _ in range(n):
        oid = payload[at:at + 20].hex()
        (ln,) = struct.unpack_from("<I", payload, at + 20)
        objects.append((oid, payload[at + 24:at + 24 + ln]))
        at += 24 + ln
    return updates, objects


class _Append:
    """The context of one logged write (a class, not contextlib: the hook imports
    this module, and contextlib costs it 5 ms)."""

    def __init__(self, log: "Log", payload: bytes, sync: bool = True):
        self.log, self.payload, self.sync = log, payload, sync

    def __enter__(self):
        log = self.log
        log._lock()
        try:
            self.tail, self.seq = log._write(self.payload, self.sync)
        except BaseException:
            log._unlock()
            raise
        return self

    def __exit__(self, kind, value, tb):
        log = self.log
        try:
            if kind is not None:
                _take_back(log, self.tail, self.seq)
        finally:
            log._unlock()
        return False


def _record(payload: bytes, lap: int, seq: int) -> bytes:
    return _REC.pack(REC_MAGIC, lap, seq, len(payload),
                     zlib.crc32(struct.pack("<QQ", lap, seq) + payload)) + payload


def _take_back(log: "Log", tail: int, seq: int) -> None:
    """Undo a record whose write did not happen (its header zeroed, durably)."""
    os.pwrite(log.fd, b"\0" * _REC.size, tail)
    os.fdatasync(log.fd)
    os.pwrite(log.fd, _HINT.pack(tail, seq), _HINT_AT)


class Damaged(Exception):
    """The log's file is not a whole gitdrop log (a bad header, cut short)."""


class Log:
    def __init__(self, git_dir: str):
        self.git_dir = git_dir
        self.path = path_for(git_dir)
        self.recovered = ""   # where a damaged log was kept, once this handle replaced it
        self._threads = _thread.allocate_lock()
        self._syncing = _thread.allocate_lock()
        self._sync_fd = None
        try:
            self.fd = os.open(self.path, os.O_RDWR | NOFOLLOW)
        except OSError as e:
            from .errors import Damaged as Unusable
            raise Unusable(
                f"cannot open the hub's write-ahead log {self.path}: {e.strerror}",
                "give the user running gitdrop read and write access to it" if
                isinstance(e, PermissionError) else
                f"move it aside (mv {self.path} {self.path}.bad); the next gitdrop "
                f"command makes a new one") from None
        self._check_boot()

    # --- the header ---------------------------------------------------------------
    def _head(self) -> tuple[int, str, int]:
        raw = os.pread(self.fd, _HEAD.size + 4, 0)
        if len(raw) < _HEAD.size + 4:
            raise Damaged("cut short: no header")
        magic, lap, boot, size = _HEAD.unpack_from(raw)
        if magic != MAGIC or struct.unpack_from("<I", raw, _HEAD.size)[0] != zlib.crc32(
                raw[:_HEAD.size]):
            raise Damaged("bad header")
        return lap, boot.rstrip(b"\0").decode(), size

    def _whole_head(self) -> tuple[int, str, int]:
        """The header, and the file as long as the header says (checked on open)."""
        head = self._head()
        if os.fstat(self.fd).st_size < head[2]:
            raise Damaged(f"cut short: {os.fstat(self.fd).st_size} of {head[2]} bytes")
        return head

    def _new_lap(self, lap: int, seq: int) -> None:
        """Start lap `lap` at the top; the caller has made every record before it
        durable in git's form."""
        _, _, size = self._head()
        os.pwrite(self.fd, _header(lap, boot_id(), size), 0)
        os.fdatasync(self.fd)
        os.pwrite(self.fd, _HINT.pack(HEADER, seq), _HINT_AT)
        os.pwrite(self.fd, _synced_mark(seq), _SYNCED_AT)

    def _lock(self) -> None:
        # flock excludes other processes only (threads share this descriptor).
        self._threads.acquire()
        try:
            while True:
                fcntl.flock(self.fd, fcntl.LOCK_EX)
                if self._current():
                    return
                # Another process put a new log in place of a damaged one (or the
                # file was removed): use the one at the path now.
                try:
                    fd = os.open(self.path, os.O_RDWR | NOFOLLOW)
                except FileNotFoundError:
                    _syncfs(self.fd)   # the records go with the old file: as a lap ends
                    create(self.git_dir)
                    fd = os.open(self.path, os.O_RDWR | NOFOLLOW)
                fcntl.flock(self.fd, fcntl.LOCK_UN)
                os.close(self.fd)
                self.fd = fd
        except BaseException:
            self._threads.release()
            raise

    def _current(self) -> bool:
        """Does the log's path still name the file this handle has open?"""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False
        own = os.fstat(self.fd)
        return st.st_ino == own.st_ino and st.st_dev == own.st_dev

    def _unlock(self) -> None:
        try:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        finally:
            self._threads.release()

    def _check_boot(self) -> None:
        try:
            if self._whole_head()[1] == boot_id():
                return
        except Damaged:
            pass   # looked at again under the lock, and mended there
        self._lock()
        try:
            try:
                boot = self._whole_head()[1]
            except Damaged as e:
                self._recover(str(e))
                boot = self._head()[1]
            if boot != boot_id():
                n = self.replay()
                sys.stderr.write(f"gitdrop: the machine restarted since this hub was last "
                                 f"written; replayed {n} logged write(s) from "
                                 f"{self.path}\n")
        finally:
            self._unlock()

    # --- a damaged log ------------------------------------------------------------
    def _recover(self, why: str) -> None:
        """Put a new log in place of this damaged one (the caller holds its lock),
        keeping the damaged file beside it, and say so on stderr.

        The log only matters after a crash: refs and objects never depend on it
        while the machine runs (a process that dies leaves the page cache, and so
        every write, intact). So if the damaged log was last written in this boot,
        nothing is lost: what its records name is synced to the device first, as
        when a lap ends. If the machine restarted since, the records that are still
        whole are carried into the new log and replayed; a write whose record was
        damaged may be lost, and the message says what to check."""
        st = os.fstat(self.fd)
        raw = os.pread(self.fd, HEADER, 0)
        boot = ""
        if len(raw) >= _HEAD.size and raw[:len(MAGIC)] == MAGIC:
            b = raw[16:52].rstrip(b"\0")
            if len(b) == 36 and not b.decode("latin-1").strip("0123456789abcdef-"):
                boot = b.decode()
        restarted = boot != boot_id() if boot else st.st_mtime < _boot_time()
        size = DEFAULT_SIZE
        if len(raw) >= _HEAD.size and raw[:len(MAGIC)] == MAGIC:
            declared = _HEAD.unpack_from(raw)[3]
            if HEADER * 4 <= declared <= 1 << 34:
                size = declared
        records, lap, end = ([], 1, HEADER)
        if not restarted:
            # As when a lap ends: what the old records name reaches the device in git's
            # own form before they are dropped (a write they made durable stays so).
            _syncfs(self.fd)
        else:
            try:   # a whole header (the file was cut short) says which lap is current
                known = self._head()[0]
            except Damaged:
                known = None
            records, end, lap = _scan(self.fd, known, min(size, st.st_size))
            lap = lap or 1
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        aside = f"{self.path}.damaged-{stamp}"
        if os.path.exists(aside):
            aside += f"-{os.getpid()}"
        os.link(self.path, aside)   # the damaged file stays at the path until replaced
        # The new log: the surviving records at the top, and a header that says
        # "replay me" (no boot id) if there are any.
        tmp = f"{self.path}.new{os.getpid()}"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | NOFOLLOW, 0o644)
        try:
            seq = records[-1][0] + 1 if records else 0
            head = _header(lap, "" if records else boot_id(), size).ljust(_HINT_AT, b"\0") + \
                _HINT.pack(end, seq)
            os.write(fd, head.ljust(HEADER, b"\0"))
            if end > HEADER:
                os.write(fd, os.pread(self.fd, end - HEADER, HEADER))
            chunk = b"\0" * (1 << 20)
            left = size - end
            while left > 0:
                left -= os.write(fd, chunk[:left])
            os.fsync(fd)
            fcntl.flock(fd, fcntl.LOCK_EX)   # ours before anyone can open it
            os.rename(tmp, self.path)
        except BaseException:
            os.close(fd)
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        fsync_path(os.path.dirname(self.path))
        old, self.fd = self.fd, fd
        fcntl.flock(old, fcntl.LOCK_UN)     # waiters find the new file (_lock)
        os.close(old)
        self.recovered = aside
        head = f"gitdrop: the hub's log {self.path} was damaged ({why}); it is kept as " \
               f"{aside} and a new log took its place."
        if not restarted:
            sys.stderr.write(f"{head} Nothing was lost: the machine has not restarted "
                             f"since the log was last written, so every logged write is in "
                             f"the refs and objects already.\n")
            return
        n = self.replay()
        sys.stderr.write(f"{head} The machine restarted since it was last written: "
                         f"{n} logged write(s) survived and were replayed; a write whose "
                         f"record was damaged may be lost. Check the hub with: git "
                         f"--git-dir {self.git_dir} fsck --full; then gitdrop --hub "
                         f"{self.git_dir} repair\n")

    # --- writing ------------------------------------------------------------------
    def append(self, updates, objects=(), sync: bool = True) -> "_Append":
        """`with log.append(updates, objects):` logs one write, durably, on entry;
        the body moves the refs while the log is held, so a new lap (which only
        syncs what came before) never outruns a rename. If the body fails, the
        record is taken back.

        sync=False is group commit: the record is written but not synced, and the
        writer calls `sync_through(seq)` before it answers anyone. Records after it
        (other writers') share that one fdatasync: it syncs all written so far."""
        return _Append(self, _encode(updates, list(objects)), sync)

    def sync_through(self, seq: int) -> None:
        """Make every record up to `seq` durable: one fdatasync covers all records
        written so far, so a writer that finds a later sync already done (the
        mark at _SYNCED_AT) returns without one."""
        if self._synced() > seq:
            return
        self._syncing.acquire()
        try:
            if self._sync_fd is None:
                self._sync_fd = os.open(self.path + ".sync", os.O_RDWR | os.O_CREAT | NOFOLLOW,
                                        0o644)
            fcntl.flock(self._sync_fd, fcntl.LOCK_EX)
            try:
                if self._synced() > seq:
                    return
                self._lock()   # the writers' hint, whole: never a seq not yet written
                try:
                    written = _HINT.unpack(os.pread(self.fd, _HINT.size, _HINT_AT))[1]
                finally:
                    self._unlock()
                os.fdatasync(self.fd)
                if written > self._synced():
                    os.pwrite(self.fd, _synced_mark(written), _SYNCED_AT)
            finally:
                fcntl.flock(self._sync_fd, fcntl.LOCK_UN)
        finally:
            self._syncing.release()

    def _synced(self) -> int:
        """The durable mark, or 0 (sync again) if it does not check: read while
        another process rewrote it, written without its crc, or ahead of the next
        record's number (a gitdrop that knows no mark, and starts a lap's numbers
        at 0, replayed the log: the mark left behind said unsynced records were
        durable, and writes skipped their fdatasync)."""
        raw = os.pread(self.fd, _SYNCED.size, _SYNCED_AT)
        if len(raw) != _SYNCED.size:
            return 0
        value, crc = _SYNCED.unpack(raw)
        if crc != zlib.crc32(raw[:8]):
            return 0
        return value if value <= _HINT.unpack(os.pread(self.fd, _HINT.size, _HINT_AT))[1] else 0

    def _write(self, payload: bytes, sync: bool = True) -> tuple[int, int]:
        """Write one record after the last and sync it (the caller holds the lock),
        or leave the sync to `sync_through`. Returns where it went (offset,
        sequence number), for a take-back."""
        try:
            lap, _, size = self._head()
        except Damaged as e:   # damaged while this process had it open
            self._recover(str(e))
            lap, _, size = self._head()
        tail, seq = _HINT.unpack(os.pread(self.fd, _HINT.size, _HINT_AT))
        rec = _record(payload, lap, seq)
        if HEADER + len(rec) > size:
            raise TooBig(f"{len(rec)} bytes")
        if tail < HEADER or tail + len(rec) > size:
            _syncfs(self.fd)
            lap += 1
            self._new_lap(lap, seq)
            tail = HEADER
            rec = _record(payload, lap, seq)
        os.pwrite(self.fd, rec, tail)
        try:
            if sync:
                os.fdatasync(self.fd)
        except BaseException:
            _take_back(self, tail, seq)
            raise
        # Past this record before the ref moves: a writer killed in between must
        # not have its record (and the objects a later commit builds on) overwritten.
        os.pwrite(self.fd, _HINT.pack(tail + len(rec), seq + 1), _HINT_AT)
        return tail, seq

    def last_update(self, ref: str) -> str | None:
        """The value the current lap's last record for `ref` gave it ("" = deleted),
        or None if no record of the lap names it."""
        last = None
        for _seq, updates, _objects in self.records()[0]:
            for r, _old, new in updates:
                if r == ref:
                    last = new
        return last

    # --- after a crash --------------------------------------------------------------
    def records(self):
        """The records of the current lap, in order: [(seq, updates, objects)], and
        where they end."""
        lap, _, size = self._head()
        records, end, _ = _scan(self.fd, lap, size)
        return records, end

    def replay(self) -> int:
        """Bring objects and refs up to the log (caller holds the lock); start a new
        lap. Returns how many records were replayed."""
        records, _ = self.records()
        stale = _boot_time()
        _clear_stale(self.git_dir, stale)
        from .catfile import CatFile
        reader = CatFile(git_dir=self.git_dir)
        last = {}
        try:
            for _seq, updates, objects in records:
                for oid, data in objects:
                    _restore_object(self.git_dir, oid, data)
                for ref, old, new in updates:
                    last[ref] = (old, new)
            for ref, (old, new) in last.items():
                _restore_ref(self.git_dir, reader, ref, old, new)
        finally:
            reader.close()
        _syncfs(self.fd)
        lap = self._head()[0]
        seq = records[-1][0] + 1 if records else 0
        self._new_lap(lap + 1, seq)
        return len(records)


def _scan(fd: int, lap: int | None, size: int):
    """The records from the top of the log while they follow on (one lap, one
    sequence, whole; `lap` None: the first record's lap): (records, end, lap)."""
    out, at, want = [], HEADER, None
    while at + _REC.size <= size:
        head = os.pread(fd, _REC.size, at)
        if len(head) < _REC.size:
            break
        magic, rlap, seq, ln, crc = _REC.unpack(head)
        if lap is None and magic == REC_MAGIC:
            lap = rlap
        if magic != REC_MAGIC or rlap != lap or (want is not None and seq != want) or \
                at + _REC.size + ln > size:
            break
        payload = os.pread(fd, ln, at + _REC.size)
        if len(payload) < ln or zlib.crc32(struct.pack("<QQ", rlap, seq) + payload) != crc:
            break   # torn: its fdatasync never returned, so nothing came after it
        out.append((seq,) + _decode(payload))
        at += _REC.size + ln
        want = seq + 1
    return out, at, lap


def _boot_time() -> float:
    try:
        with open("/proc/stat") as f:
            for line in f:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except OSError:
        pass
    return time.time() - time.monotonic()


def _clear_stale(git_dir: str, before: float) -> None:
    """Lock files and half-written objects from before this boot: no process of an
    earlier boot is alive to finish them, and a stale lock would block its ref."""
    for top, suffix in (("refs", ".lock"), ("objects", "")):
        for d, _dirs, files in os.walk(os.path.join(git_dir, top)):
            for f in files:
                if f.endswith(".lock") if suffix else f.startswith("tmp_obj_"):
                    p = os.path.join(d, f)
                    try:
                        if os.stat(p).st_mtime < before:
                            os.unlink(p)
                    except FileNotFoundError:
                        pass
    for f in ("packed-refs.lock",):
        p = os.path.join(git_dir, f)
        if os.path.exists(p) and os.stat(p).st_mtime < before:
            os.unlink(p)


def _intact(path: str, oid: str) -> bool:
    try:
        with open(path, "rb") as f:
            raw = zlib.decompress(f.read())
    except (OSError, zlib.error):
        return False
    import hashlib   # replay only: the hook imports this module, and hashlib costs 5 ms
    return hashlib.sha1(raw).hexdigest() == oid


def _restore_object(git_dir: str, oid: str, data: bytes) -> None:
    d = os.path.join(git_dir, "objects", oid[:2])
    path = os.path.join(d, oid[2:])
    if _intact(path, oid):
        return
    os.makedirs(d, exist_ok=True)
    tmp = os.path.join(d, f"tmp_obj_{os.getpid()}_{os.urandom(6).hex()}")
    with open(tmp, "wb") as f:
        f.write(data)
    os.chmod(tmp, 0o444)
    os.replace(tmp, path)


def _read_ref(git_dir: str, ref: str) -> str | None:
    """The ref's value, "" if absent, None if its file is damaged."""
    from .errors import Damaged
    try:
        with open(os.path.join(git_dir, ref), "rb") as f:
            raw = f.read(64).split(b"\n", 1)[0].strip()
    except (FileNotFoundError, NotADirectoryError):
        try:
            return read_ref(git_dir, ref)
        except Damaged:
            return None
    value = raw.decode("ascii", "replace")
    if len(value) == 40 and all(c in "0123456789abcdef" for c in value):
        return value
    return None


def _descends(reader, new: str, old: str, stop: str = "", limit: int = 200000) -> bool:
    """Is `old` on `new`'s first-parent line (rooms and the hub branch are linear)?
    Reaching `stop` (a commit older than `old`) ends the walk early."""
    oid = new
    for _ in range(limit):
        if oid == old:
            return True
        if oid == stop:
            return False
        try:
            oid = reader.commit(oid).parent
        except Exception:   # a missing or damaged object: not a line we can trust
            return False
        if not oid:
            return False
    return False


def _whole(git_dir: str, tip: str, base: str) -> bool:
    """Is every object of the commits after `base` up to `tip` present and sound?
    Under group commit a ref moves a moment before its record is synced, so after
    a crash it may name commits no record holds, whose files the device may have
    lost (a push on top, which git made durable, passes)."""
    import subprocess
    listed = subprocess.run(["git", "--git-dir", git_dir, "rev-list", "--objects", tip,
                             "--not", base], capture_output=True, text=True)
    if listed.returncode != 0:
        return False
    for line in listed.stdout.splitlines():
        oid = line[:40]
        path = os.path.join(git_dir, "objects", oid[:2], oid[2:])
        if os.path.exists(path):
            if not _intact(path, oid):
                return False
        elif subprocess.run(["git", "--git-dir", git_dir, "cat-file", "-e", oid],
                            capture_output=True).returncode != 0:
            return False
    return True


def _restore_ref(git_dir: str, reader, ref: str, old: str, new: str) -> None:
    """Put `ref` where the last logged update for it left it (`old` -> `new`),
    unless the ref is already further on with whole commits (a push on top, which
    git made durable; a group commit whose ref moved just before the crash)."""
    cur = _read_ref(git_dir, ref)
    if cur == new:
        return
    if not new:   # a logged delete (room archive/destroy)
        if cur == old or cur is None:
            try:
                os.unlink(os.path.join(git_dir, ref))
            except FileNotFoundError:
                pass
        return
    if cur and _descends(reader, cur, new, stop=old) and _whole(git_dir, cur, new):
        return
    path = os.path.join(git_dir, ref)
    lock = path + ".lock"
    deadline = time.monotonic() + 10
    while True:
        fd = locks.take(lock)
        if fd is not None:
            break
        # A live writer of this boot (a push) holds it a moment; a dead one's is
        # cleared (not through the log: this is the log's replay).
        if locks.clear(git_dir, ref) in ("held", "young"):
            if time.monotonic() > deadline:
                raise OSError(f"{lock} stays locked: cannot replay the log onto {ref}; "
                              "remove the lock if no git process is running, and retry")
            time.sleep(0.005)
    try:
        os.write(fd, new.encode() + b"\n")
        os.replace(lock, path)
    finally:
        os.close(fd)


def clear_lock(git_dir: str, ref: str, wait: float | None = None) -> str:
    """gitdrop.locks.clear, telling the log before a dead writer's lock goes."""
    return locks.clear(git_dir, ref, wait, settle=settle_dead)


def settle_dead(git_dir: str, ref: str, unlink) -> bool:
    """A lock on `ref` whose owner is dead is being removed (`unlink()`, which says
    whether it removed it). The dead writer may have logged its write and died
    before moving the ref: left in the log, that record would be replayed after a
    later crash and put the ref back on a commit nobody acknowledged, over what
    came after it (a push, which is not logged). So, under the log's lock, if the
    lap's last record for the ref gives it another value than it holds, a record
    that the ref holds its present value goes after it, durably, before the lock
    goes (the dead write is dropped, as it was never acknowledged)."""
    if not os.path.exists(path_for(git_dir)):
        return unlink()
    log = for_hub(git_dir)
    log._lock()
    try:
        cur = _read_ref(git_dir, ref)
        if cur is not None:
            try:
                last = log.last_update(ref)
            except Damaged as e:   # damaged meanwhile: a new log holds no record yet
                log._recover(str(e))
                last = None
            if last is not None and last != cur:
                log._write(_encode([(ref, cur, cur)], []))
        return unlink()
    finally:
        log._unlock()


def last_logged(git_dir: str, ref: str) -> str | None:
    """The last value gitdrop logged for `ref` in the log's current lap ("" for a
    delete), or None: what a damaged ref can be put back to."""
    if not os.path.exists(path_for(git_dir)):
        return None
    try:
        return for_hub(git_dir).last_update(ref)
    except (OSError, Damaged):
        return None


# --- reading a ref as git wrote it ---------------------------------------------------

def read_ref(git_dir: str, ref: str) -> str:
    """The ref's value: its loose file, else packed-refs, else "". A value that is
    no object id raises Damaged (what it holds, and how to put it back)."""
    try:
        with open(os.path.join(git_dir, ref), "rb") as f:
            raw = f.read(100)
        value = raw.split(b"\n", 1)[0].strip().decode("ascii", "replace")
        if not is_oid(value):
            raise damaged(git_dir, ref, raw)
        return value
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        pass
    try:
        with open(os.path.join(git_dir, "packed-refs"), "rb") as f:
            want = b" " + ref.encode()
            for line in f:
                line = line.rstrip(b"\n")
                if line.endswith(want) and not line.startswith((b"#", b"^")):
                    value = line[:-len(want)].decode("ascii", "replace")
                    if not is_oid(value):
                        raise damaged(git_dir, ref, line, "packed-refs")
                    return value
    except FileNotFoundError:
        pass
    return ""


def ref_names(git_dir: str, prefix: str) -> list[str]:
    """The names of the refs under `prefix` (e.g. refs/heads/rooms/), loose or packed."""
    out = set()
    top = os.path.join(git_dir, prefix)
    for d, _dirs, files in os.walk(top):
        for f in files:
            if not f.endswith(".lock"):
                out.add(os.path.relpath(os.path.join(d, f), top).replace(os.sep, "/"))
    try:
        with open(os.path.join(git_dir, "packed-refs"), "rb") as f:
            want = b" " + prefix.encode()
            for line in f:
                at = line.find(want)
                if at > 0 and not line.startswith((b"#", b"^")):
                    out.add(line[at + len(want):].rstrip(b"\n").decode("utf-8", "replace"))
    except FileNotFoundError:
        pass
    return sorted(out)


def is_oid(value: str) -> bool:
    """A full object id (SHA-1 or SHA-256), as git writes it in a ref."""
    return len(value) in (40, 64) and not value.strip("0123456789abcdef")


def damaged(git_dir: str, ref: str, raw: bytes, where: str = ""):
    """The error for a ref whose file holds no object id: what it holds, and the
    value gitdrop last logged for it, to put back with gitdrop repair."""
    shown = raw[:60].decode("utf-8", "replace").rstrip("\n")
    what = f"{ref} (in {where})" if where else ref
    reason = (f"{what} is damaged: it holds {shown!r}, not a commit id" if shown.strip()
              else f"{what} is damaged: its file is empty")
    from .errors import Damaged
    logged = last_logged(git_dir, ref)
    hub = f"gitdrop --hub {git_dir} repair"
    if logged:
        fix = (f"put back {logged}, the last value gitdrop logged for it, or the newest "
               f"commit pushed on top of it: {hub} --apply (or see first: {hub})")
    else:
        fix = f"see what can be put back: {hub}"
    return Damaged(reason, fix)


def is_hub(path: str) -> bool:
    """A gitdrop hub: a bare repository whose config has gitdrop's settings (which
    gitdrop init writes). A project's repository or any other folder is not one,
    and nothing is written into it."""
    return os.path.isfile(os.path.join(path, "HEAD")) and os.path.isdir(
        os.path.join(path, "objects")) and any(
        k.startswith("gitdrop.") for k in read_config(path))


def read_config(git_dir: str) -> dict:
    """The repository's config as {"section.key": value} (lower-case names; the
    simple `[section]` / `key = value` form gitdrop and git write)."""
    out, section = {}, ""
    try:
        with open(os.path.join(git_dir, "config"), encoding="utf-8") as f:
            for line in f:
                s = line.strip()
                if not s or s[0] in "#;":
                    continue
                if s.startswith("["):
                    section = s[1:s.index("]")].split()[0].lower() if "]" in s else ""
                    continue
                key, eq, value = s.partition("=")
                out[f"{section}.{key.strip().lower()}"] = value.strip().strip('"') if eq else "true"
    except FileNotFoundError:
        pass
    return out
