"""Writing gitdrop's own files in folders others may write (a shared hub's group).

Only os: the pre-receive hook imports what imports this module.
"""

import os

# A file is opened without following a symbolic link: one planted in a hub's folder
# would have the next writer write to, or truncate, a file of the planter's choosing.
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def read_plain(path: str, most: int) -> bytes | None:
    """At most `most` bytes of the plain file at `path`, or None (none there, or not
    a plain file). A FIFO planted there is not waited on (O_NONBLOCK), a link not
    followed, and a device such as /dev/zero not read until memory runs out."""
    import stat
    try:
        fd = os.open(path, os.O_RDONLY | NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        out = bytearray()
        while len(out) < most:
            chunk = os.read(fd, most - len(out))
            if not chunk:
                break
            out += chunk
        return bytes(out)
    except OSError:
        return None
    finally:
        os.close(fd)


def write_whole(path: str, data: bytes, mode: int = 0o644, exact: bool = False,
                sync: bool = False) -> None:
    """Put `data` at `path` whole (readers see the old file or the new one) through a
    temporary file of an unguessable name, made new: a link planted at a predictable
    one had the write, and a chmod, land on the link's target. `exact`: `mode` as it
    is, whatever the umask (a token file's 0600, a hook's 0755)."""
    tmp = f"{path}.{os.getpid()}-{os.urandom(6).hex()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, mode)
    try:
        if exact:
            os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if sync:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, path)   # a link at `path` is replaced, not followed


def never_world_writable() -> None:
    """What a gitdrop process makes, no other user may write, whatever umask it was
    started with (0 in some service managers and containers): a world-writable hub
    let anyone replace its hook, which runs on every push."""
    mask = os.umask(0)
    os.umask(mask | 0o002)
