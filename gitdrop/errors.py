"""Typed refusals: every one names the rule, the commit and the next step."""

import errno


class GitdropError(Exception):
    """Base for errors a face reports to its user."""

    rule = "error"
    exit_code = 1

    def __init__(self, reason: str, fix: str = "", commit: str = ""):
        super().__init__(reason)
        self.reason = reason
        self.fix = fix
        self.commit = commit

    def to_dict(self) -> dict:
        return {"error": self.rule, "rule": self.rule, "reason": self.reason,
                "fix": self.fix, "commit": self.commit}

    def render(self) -> str:
        lines = [f"gitdrop: refused by rule {self.rule}"]
        if self.commit:
            lines.append(f"  commit: {self.commit}")
        lines.append(f"  why: {self.reason}")
        if self.fix:
            lines.append(f"  fix: {self.fix}")
        return "\n".join(lines)

    def __str__(self) -> str:
        text = f"{self.rule}: {self.reason}"
        return f"{text} Next: {self.fix}" if self.fix else text


class Refusal(GitdropError):
    """A rule said no. `rule` is the rule's stable name (see docs/PROTOCOL.md)."""

    exit_code = 3

    def __init__(self, rule: str, reason: str, fix: str = "", commit: str = ""):
        super().__init__(reason, fix, commit)
        self.rule = rule


class NotFound(GitdropError):
    rule = "not-found"
    exit_code = 4


class Ambiguous(GitdropError):
    rule = "ambiguous"
    exit_code = 5


class Conflict(GitdropError):
    """The ref kept moving: CAS retries were exhausted."""

    rule = "conflict"
    exit_code = 6


class Damaged(GitdropError):
    """A file of the hub is damaged or unusable (a ref that names no commit, a log
    that cannot be opened): the reason says which, the fix what to do (gitdrop
    repair puts a ref back)."""

    rule = "damaged"
    exit_code = 8


class UsageError(GitdropError):
    rule = "usage"
    exit_code = 2


class Storage(GitdropError):
    """The operating system would not store a write: the disk is full or failing,
    a quota is reached, the hub is read-only or not ours to write."""

    rule = "storage"
    exit_code = 9


_STORAGE = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO, errno.EACCES,
            errno.EPERM, errno.ELOOP}


def storage(e: OSError, landed: bool = False) -> "Storage | None":
    """The Storage error an OSError met while writing a hub stands for, or None for
    any other (a bug: it is raised as it is). `landed`: the ref had moved already."""
    if e.errno not in _STORAGE:
        return None
    what = f"{e.strerror}" + (f" ({e.filename})" if e.filename else "")
    if e.errno == errno.ELOOP:   # planted: gitdrop's own files are never followed
        return Storage(f"a hub file is a symbolic link, which gitdrop does not follow: "
                       f"{what}; " + ("the write is in the room, but not made durable"
                                      if landed else "nothing was written"),
                       "remove the link (gitdrop makes the file again); find out who "
                       "put it there: anyone who can write the hub's folders can")
    if landed:
        return Storage(f"the write is in the room, but the disk did not confirm that it "
                       f"is durable: {what}", "check the disk (dmesg, df -h); once it is "
                       "sound, read the room back (gitdrop log) before you write it again")
    return Storage(f"the system refused a hub file: {what}; nothing was written",
                   "free space on the disk that holds the hub (df -h), or fix its "
                   "permissions or mount, then try again")
