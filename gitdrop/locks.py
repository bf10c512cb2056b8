"""Ref lock files (`<ref>.lock`, git's protocol), and the ones their owner left.

git, libgit2 and gitdrop move a ref by creating `<ref>.lock` exclusively, writing
the new value into it and renaming it over the ref. A process killed in between
leaves the lock behind, and every later write of that ref would fail until
someone removed it. gitdrop's own writers therefore hold an flock on their lock
file for its whole life (`take`): the kernel drops it when the process dies, so
a lock file in the way (`clear`) is one of

- held (its flock is taken): a live gitdrop writer; a lost race: wait for its
  write to end (milliseconds), then build again on what it wrote;
- not held and younger than the grace period: git or libgit2 (they take no
  flock; their locks live milliseconds), a gitdrop writer between creating the
  file and locking it, or an owner that died a moment ago: wait and look again;
- not held and older than the grace period: its owner is dead (or stalled that
  long); it is removed, by whoever holds its flock, after the write-ahead log has
  been told what the ref holds (`wal.settle_dead`: a record the dead writer logged
  must not be replayed after a later crash).

Only os, fcntl and time: the pre-receive hook imports this module.
"""

import os
import time

try:
    import fcntl
except ImportError:   # not POSIX: no flock, so no lock is ever taken for dead
    fcntl = None

GRACE = 2.0          # seconds; gitdrop.staleLockSeconds in the hub's config
HELD_WAIT = 0.25     # seconds a held lock is waited for (a write takes milliseconds)
_GRACE: dict = {}    # git_dir -> seconds, read once a process


def take(lock: str) -> int | None:
    """Create `lock` exclusively and flock it: its descriptor, held until the caller
    has renamed or removed the file (then closes it); None if the lock exists."""
    try:
        try:
            fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileNotFoundError:   # the first ref in its directory
            os.makedirs(os.path.dirname(lock), exist_ok=True)
            fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except FileExistsError:
        return None
    if fcntl is None:
        return fd
    try:
        # Blocking: only someone looking at it (clear) can hold it, for microseconds.
        fcntl.flock(fd, fcntl.LOCK_EX)
        if _names(lock, os.fstat(fd)):
            return fd
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)    # not ours any more (never seen: no one removes a young lock)
    return None


def _names(path: str, st) -> bool:
    """Does `path` still name the file `st` describes?"""
    try:
        now = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    return now.st_ino == st.st_ino and now.st_dev == st.st_dev


def grace(git_dir: str) -> float:
    """How old an unheld lock must be to be taken for dead: gitdrop.staleLockSeconds
    in the hub's config, else GRACE. Read only when a lock is in the way."""
    value = _GRACE.get(git_dir)
    if value is None:
        value = GRACE
        try:
            with open(os.path.join(git_dir, "config"), encoding="utf-8") as f:
                section = ""
                for line in f:
                    s = line.strip()
                    if s.startswith("["):
                        section = s[1:].split("]")[0].strip().lower()
                    elif section == "gitdrop" and "=" in s:
                        key, _, v = s.partition("=")
                        if key.strip().lower() == "stalelockseconds":
                            value = max(0.0, float(v.strip().strip('"')))
        except (OSError, ValueError):
            pass
        _GRACE[git_dir] = value
    return value


def clear(git_dir: str, ref: str, wait: float | None = None, settle=None) -> str:
    """Wait for the lock on `ref` (a ref name, e.g. refs/heads/rooms/x) to go, and
    clear it if its owner is dead. A held lock is waited for until its writer lets
    it go (its write is done: the caller builds again on what it wrote), at most
    HELD_WAIT; an unheld one until it goes or is older than the grace period, at
    most `wait` seconds: by default a little over the grace period, so that the
    first write after a kill goes through. Returns
      "free"    no lock there (now);
      "held"    a live gitdrop writer still holds it;
      "young"   unheld, still younger than the grace period;
      "cleared" its owner was dead: it is gone.
    `settle(git_dir, ref, unlink)`, if given, removes a dead lock by calling unlink()
    once it has told the hub's write-ahead log (gitdrop.wal.settle_dead; none while
    replaying the log)."""
    lock = os.path.join(git_dir, ref + ".lock")
    limit = grace(git_dir)
    now = time.monotonic()
    deadline = now + (limit + 0.25 if wait is None else wait)
    held_until = now + HELD_WAIT
    delay = 0.0005
    while True:
        state = _look(git_dir, ref, lock, limit, settle)
        now = time.monotonic()
        if state in ("free", "cleared") or now >= deadline or \
                (state == "held" and now >= held_until):
            return state
        time.sleep(delay)
        # a live writer's lock lasts one write (milliseconds): look again soon
        delay = min(delay * 2, 0.002 if state == "held" else 0.05)


def _look(git_dir: str, ref: str, lock: str, limit: float, settle) -> str:
    try:
        fd = os.open(lock, os.O_RDONLY)
    except (FileNotFoundError, NotADirectoryError):
        return "free"
    try:
        if fcntl is None:
            return "young"
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return "held"
        st = os.fstat(fd)
        if not _names(lock, st):
            return "free"           # removed (and perhaps taken again) meanwhile
        if abs(time.time() - st.st_mtime) < limit:
            return "young"
        # Dead. We hold its flock: no other clearer acts on it, and a writer that
        # finds it finds it held.
        def unlink() -> bool:
            if not _names(lock, st):
                return False
            os.unlink(lock)
            return True
        done = settle(git_dir, ref, unlink) if settle else unlink()
        return "cleared" if done else "free"
    finally:
        os.close(fd)


def find(git_dir: str) -> list[str]:
    """Every lock file of the hub's refs (relative names, e.g.
    refs/heads/rooms/x.lock; packed-refs.lock too)."""
    out = []
    top = os.path.join(git_dir, "refs")
    for d, _dirs, files in os.walk(top):
        for f in files:
            if f.endswith(".lock"):
                out.append(os.path.relpath(os.path.join(d, f), git_dir))
    if os.path.exists(os.path.join(git_dir, "packed-refs.lock")):
        out.append("packed-refs.lock")
    return sorted(out)


def hold(git_dir: str, ref: str) -> int | None:
    """Flock the lock file libgit2 just made for `ref` (a transaction's), so that it
    is seen as held while this process lives: its descriptor (close it once the
    transaction is over), or None if that could not be done."""
    if fcntl is None:
        return None
    try:
        fd = os.open(os.path.join(git_dir, ref + ".lock"), os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd
    except OSError:
        os.close(fd)
        return None
