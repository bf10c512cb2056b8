"""Loose objects and ref moves written by gitdrop itself, durable with one
journal commit per operation instead of two per file.

libgit2's fsync mode (pygit2.settings.enable_fsync_gitdir) fsyncs every loose
object and its directory, then the ref's lock file and the refs directory: a
send costs four journal commits, a task move about ten. On ext4 with a journal
the same guarantee takes one: each object's data is written back before the
object gets its name (sync_file_range, which writes the data and commits
nothing), the ref's lock file likewise, the lock is renamed over the ref, and
one fsync of the ref's directory commits the journal transaction holding every
allocation and rename (ext4 has one journal whose transactions commit in
order, and a commit flushes the device cache first). So nothing named is ever
without its data, and the ref is never durable before the objects it names.
See docs/DURABILITY.md.

Objects are written in git's loose format and refs with git's lock protocol
(`<ref>.lock` created exclusively, old value compared under the lock, renamed
into place), so git, libgit2 and this writer exclude one another.
"""

import hashlib
import os
import sys
import zlib

METHODS = ("batch", "fsync", "none")
_SYNC_START = 2                  # SYNC_FILE_RANGE_WRITE: start writing, do not wait
_SYNC_WAIT = 1 | 2 | 4           # WAIT_BEFORE | WRITE | WAIT_AFTER
_libc = None


def _sync_file_range(fd: int, flags: int) -> None:
    global _libc
    if _libc is None:
        import ctypes
        lib = ctypes.CDLL(None, use_errno=True)
        fn = lib.sync_file_range
        fn.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]
        _libc = (fn, ctypes)
    fn, ctypes = _libc
    if fn(fd, 0, 0, flags) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


_SUPPORTS: dict[str, bool] = {}


def supports_batch(path: str) -> bool:
    """Batch needs Linux (sync_file_range) and ext4 (or ext3) with its journal
    running: ext2, or ext4 mounted without a journal, has no ordering to lean on."""
    real = os.path.realpath(path)
    if real not in _SUPPORTS:
        _SUPPORTS[real] = sys.platform.startswith("linux") and _journaled_ext4(real)
    return _SUPPORTS[real]


def _journaled_ext4(real: str) -> bool:
    try:
        best, fstype, source = "", "", ""
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                mnt = left.split()[4].replace("\\040", " ")
                if (real + "/").startswith(mnt.rstrip("/") + "/") and len(mnt) >= len(best):
                    best, (fstype, source) = mnt, right.split()[:2]
        if fstype not in ("ext4", "ext3") or not source.startswith("/dev/"):
            return False
        dev = os.path.basename(os.path.realpath(source))
        return os.path.isdir(f"/proc/fs/jbd2/{dev}-8")
    except (OSError, ValueError, IndexError):
        return False


def _fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Writer:
    """Writes the objects of one or more commits, then moves a ref with CAS.

    method: "batch" (writeback per file, one fsync at the ref), "fsync" (fsync
    per file and directory, as libgit2 does) or "none" (the OS decides).
    defer (batch): objects stay unnamed (temporary files being written back)
    until move_ref, which waits for all of them and the ref's lock at once; use
    it when nothing reads the new objects before the ref moves (one commit).
    """

    def __init__(self, git_dir: str, method: str = "batch", defer: bool = False):
        if method not in METHODS:
            raise ValueError(f"unknown fsync method {method!r}")
        self.git_dir = git_dir
        self.method = method
        self.defer = defer and method == "batch"
        self.pending: dict[str, tuple[int, str]] = {}  # final path -> (fd, temporary path)
        self.new_dirs: set[str] = set()  # object directories made (fsync method)

    # --- objects --------------------------------------------------------------
    def write(self, kind: str, data: bytes) -> str:
        """Store one object in the loose format; returns its id (hex). An object
        gets its name only once its data is on the device (batch: written back;
        fsync: fsynced), so a crash never leaves a named object without content."""
        raw = b"%s %d\0" % (kind.encode(), len(data)) + data
        oid = hashlib.sha1(raw).hexdigest()
        d = os.path.join(self.git_dir, "objects", oid[:2])
        path = os.path.join(d, oid[2:])
        if path in self.pending:
            return oid
        if os.path.exists(path):
            if self.method == "batch":
                self._written_back(path)  # cheap if it already is (it should be)
            return oid
        if not os.path.isdir(d):
            os.makedirs(d, exist_ok=True)
            self.new_dirs.add(d)
        tmp = os.path.join(d, f"tmp_obj_{os.getpid()}_{os.urandom(6).hex()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)
        try:
            os.write(fd, zlib.compress(raw, 1))
            if self.defer:
                _sync_file_range(fd, _SYNC_START)
                self.pending[path] = (fd, tmp)
                return oid
            if self.method == "batch":
                _sync_file_range(fd, _SYNC_WAIT)
            elif self.method == "fsync":
                os.fsync(fd)
        finally:
            if path not in self.pending:
                os.close(fd)
        os.replace(tmp, path)
        if self.method == "fsync":
            _fsync_path(d)
        return oid

    @staticmethod
    def _written_back(path: str) -> None:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            _sync_file_range(fd, _SYNC_WAIT)
        finally:
            os.close(fd)

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

    def close(self) -> None:
        """Drop deferred objects the ref did not take (a lost race, a refusal)."""
        while self.pending:
            _path, (fd, tmp) = self.pending.popitem()
            os.close(fd)
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass

    def _name_pending(self) -> None:
        """Wait for the deferred objects' data, then give them their names."""
        for fd, _tmp in self.pending.values():
            _sync_file_range(fd, _SYNC_WAIT)
        while self.pending:
            path, (fd, tmp) = self.pending.popitem()
            os.close(fd)
            os.replace(tmp, path)

    # --- refs -------------------------------------------------------------------
    def current(self, ref: str) -> str:
        return read_ref(self.git_dir, ref)

    def move_ref(self, ref: str, expected: str, new: str) -> bool:
        """Compare-and-swap `ref` from `expected` ("" = absent) to `new`, after
        making every object written so far durable. False if it moved or is locked."""
        path = os.path.join(self.git_dir, ref)
        lock = path + ".lock"
        d = os.path.dirname(path)
        try:
            try:
                fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            except FileNotFoundError:  # the first ref in its directory
                os.makedirs(d, exist_ok=True)
                fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            self.close()
            return False
        try:
            try:
                if self.current(ref) != expected:
                    self.close()
                    return False
                os.write(fd, new.encode() + b"\n")
                if self.method == "batch":
                    _sync_file_range(fd, _SYNC_START)
                    self._name_pending()  # their writes and the lock's overlap
                    _sync_file_range(fd, _SYNC_WAIT)
                elif self.method == "fsync":
                    os.fsync(fd)
                    for nd in self.new_dirs:
                        _fsync_path(os.path.dirname(nd))
            finally:
                os.close(fd)
            os.rename(lock, path)
            lock = ""
            self.new_dirs.clear()
            if self.method != "none":
                _fsync_path(d)  # commits the journal: objects, lock data, rename
            return True
        finally:
            if lock:
                try:
                    os.unlink(lock)
                except FileNotFoundError:
                    pass


def batch_ok(cfg, path: str) -> bool:
    """Batch durability (gitdrop.durable) where it is as durable as fsync per file
    and nothing else is asked of a ref write: gitdrop.fsyncMethod = auto (the
    default: ext4 with a journal), batch (trust the filesystem) or fsync (libgit2's
    fsync of every file). Reflogs, shared permissions and SHA-256 stay with libgit2."""
    def get(key, default=""):
        return str(cfg[key]).lower() if key in cfg else default
    method = get("gitdrop.fsyncmethod", "auto")
    if method == "fsync" or get("core.logallrefupdates") in ("true", "always") or \
            get("core.sharedrepository") not in ("", "false", "umask", "0") or \
            get("extensions.objectformat", "sha1") != "sha1":
        return False
    return method == "batch" or (method == "auto" and supports_batch(path))


def read_ref(git_dir: str, ref: str) -> str:
    """The ref's value: its loose file, else packed-refs, else ""."""
    try:
        with open(os.path.join(git_dir, ref), "rb") as f:
            return f.read(64).split(b"\n", 1)[0].strip().decode()
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        pass
    try:
        with open(os.path.join(git_dir, "packed-refs"), "rb") as f:
            want = b" " + ref.encode()
            for line in f:
                line = line.rstrip(b"\n")
                if line.endswith(want) and not line.startswith((b"#", b"^")):
                    return line[:-len(want)].decode()
    except FileNotFoundError:
        pass
    return ""
