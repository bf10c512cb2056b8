"""A hub on another machine, reached by a git URL.

The client keeps a bare mirror of the hub (~/.gitdrop/remotes/<hash>, or under
$GITDROP_CACHE) and uses the ordinary core on it: every write is built and
checked locally, moved there with CAS, then pushed. The remote hub's hook has the
last word: a push that lost a race is redone on the fetched tip (so a claim of a
just-claimed task fails naming the winner), and a refusal by the hook comes back
as the same Refusal while the local ref is put back.
"""

import hashlib
import math
import os
import re
import time

from .. import model
from ..errors import GitdropError, NotFound, Refusal, UsageError
from ..hub import Hub
from ..store import Store

# A read fetches unless the mirror was refreshed this recently (seconds): one verb
# reads several times, and a write that raced is re-done on a fresh fetch anyway.
FRESH = float(os.environ.get("GITDROP_REMOTE_FRESH", "1.0"))
REFSPECS = ("+refs/heads/*:refs/heads/*", "+refs/archive/*:refs/archive/*")
_SCHEMES = ("file", "git", "http", "https", "ssh", "git+ssh", "ssh+git")
_SCP = re.compile(r"^(?:[^@/:]+@)?[^@/:]+:(?!//)")


class Unreachable(GitdropError):
    """The remote hub could not be reached (network, auth, no such repository)."""

    rule = "unreachable"
    exit_code = 7


def is_url(s: str) -> bool:
    """A git URL (scheme://… or scp-like [user@]host:path), not a local path."""
    if not s:
        return False
    scheme, sep, _ = s.partition("://")
    if sep:
        return scheme.lower() in _SCHEMES
    return bool(_SCP.match(s)) and not os.path.exists(s)


def mirror_path(url: str, cache: str = "") -> str:
    base = cache or os.environ.get("GITDROP_CACHE") or os.path.expanduser("~/.gitdrop/remotes")
    return os.path.join(base, hashlib.sha256(url.encode()).hexdigest()[:16] + ".git")


def public_url(url: str) -> str:
    """The URL without a password, for messages and the mirror's config."""
    return re.sub(r"^([a-z+]+://[^/@:]*):[^/@]*@", r"\1@", url)


def parse_refusal(stderr: str) -> Refusal | None:
    """The hook's `gitdrop: refused by rule X / commit / why / fix` block, as a Refusal."""
    lines = [re.sub(r"^remote: ?", "", ln).replace("\x1b[K", "").rstrip()
             for ln in stderr.splitlines()]
    for i, ln in enumerate(lines):
        m = re.search(r"gitdrop: refused by rule (\S+)", ln)
        if not m:
            continue
        fields = {"commit": "", "why": "", "fix": ""}
        key = None
        for nxt in lines[i + 1:]:
            k, sep, v = nxt.strip().partition(": ")
            if sep and k in fields:
                key, fields[k] = k, v
            elif key and nxt.strip() and not nxt.startswith(("gitdrop:", "error:", "To ")):
                fields[key] += "\n" + nxt.strip()   # a reason that spans lines
            else:
                break
        return Refusal(m.group(1), fields["why"], fields["fix"], fields["commit"])
    if "gitdrop: the hook failed" in stderr:
        text = next(ln for ln in lines if "gitdrop: the hook failed" in ln)
        return Refusal("hook", text.partition("gitdrop: ")[2], "report it to the hub's admin")
    return None


class RemoteStore(Store):
    """A Store over a local mirror whose every accepted write is pushed to `url`."""

    def __init__(self, url: str, mirror: str, fresh: float = FRESH):
        import threading
        self.url = url
        self.fresh = fresh
        self.lost_races = 0   # pushes redone because someone else wrote first
        self._fetched = -math.inf
        self._mutex = threading.RLock()
        self._depth = 0
        self._lockf = None
        _make_mirror(mirror, url)
        super().__init__(mirror)
        self.publish = self._publish
        self.refresh(force=True)
        if not self.tip(model.HUB_REF) and not self.rooms():
            raise NotFound(f"no gitdrop hub at {public_url(url)} (it has no hub branch "
                           "and no rooms)", "create it on its machine with gitdrop init PATH")

    # --- talking to the remote ----------------------------------------------------
    def _git(self, *args):
        import subprocess
        env = dict(os.environ, GIT_TERMINAL_PROMPT="0", GIT_DIR=self.path)
        try:
            return subprocess.run(["git", *args], env=env, capture_output=True, text=True,
                                  stdin=subprocess.DEVNULL, timeout=300)
        except subprocess.TimeoutExpired:
            raise Unreachable(f"git {args[0]} to {public_url(self.url)} timed out",
                              "check the network and the server") from None

    def refresh(self, force: bool = False) -> None:
        """Fetch the hub's refs into the mirror (unless it was fetched just now)."""
        if not force and time.monotonic() - self._fetched < self.fresh:
            return
        with self.locked():
            self._fetch()

    def _fetch(self) -> None:
        p = self._git("fetch", "--prune", "--quiet", "--no-tags", "--no-write-fetch-head",
                      self.url, *REFSPECS)
        if p.returncode != 0:
            raise Unreachable(f"cannot fetch from {public_url(self.url)}: "
                              f"{_last_lines(p.stderr)}",
                              "check the URL, your credentials and that the hub exists")
        self._fetched = time.monotonic()

    def _push(self, ref: str, new: str) -> tuple[str, str]:
        """Push one ref: ("ok" | "stale" | "refused" | "failed", stderr)."""
        p = self._git("push", "--porcelain", "--no-verify", self.url, f"{new}:{ref}")
        for line in p.stdout.splitlines():
            parts = line.split("\t")
            if len(parts) < 3 or not parts[1].endswith(":" + ref):
                continue
            flag, summary = parts[0], parts[2]
            if flag != "!":
                return "ok", p.stderr
            if "hook declined" in summary or "refused by rule" in p.stderr:
                return "refused", p.stderr
            if "[rejected]" in summary or "update ref" in summary or "lock" in summary:
                return "stale", p.stderr    # fetch first / non-fast-forward / lost the ref lock
            return "refused", p.stderr
        return "failed", p.stderr

    # --- the Store extension point ------------------------------------------------
    def _publish(self, ref: str, old: str, new: str) -> bool:
        status, err = self._push(ref, new)
        if status == "ok":
            return True
        if status == "stale":
            self.lost_races += 1
            try:
                self._fetch()   # the forced refspec replaces our commit with the winner's
            except GitdropError:
                self._undo(ref, old, new)
                raise
            return False
        self._undo(ref, old, new)
        if status == "refused":
            refusal = parse_refusal(err) or Refusal(
                "remote-refused", f"{public_url(self.url)} refused the push: "
                f"{_last_lines(err)}", "read the server's message; fix the commit and retry")
            refusal.from_hub = True
            raise refusal
        self._fetched = -math.inf   # it may have landed: the next read (a retry's) fetches
        raise Unreachable(f"cannot push to {public_url(self.url)}: {_last_lines(err)}",
                          "check the URL, your credentials and that the hub exists")

    def _undo(self, ref: str, old: str, new: str) -> None:
        """Put the mirror's ref back where it was, if it still holds our commit."""
        import pygit2
        if self.tip(ref) != new:
            return
        if old:
            self._cas(ref, new, pygit2.Oid(hex=old), "undo (not accepted by the hub)")
        else:
            self.repo.references.delete(ref)

    # --- locking: one writer or fetcher per mirror at a time -------------------------
    def locked(self):
        return _MirrorLock(self)

    def write(self, ref, build, author, *args, **kwargs):
        """Store.write under the mirror's lock. A refusal or not-found built on a
        mirror older than this write is checked again on a fresh fetch: only the
        hub's latest state may refuse (the hook's own verdict is final)."""
        with self.locked():
            start = time.monotonic()
            try:
                return super().write(ref, build, author, *args, **kwargs)
            except (Refusal, NotFound) as e:
                if getattr(e, "from_hub", False) or self._fetched >= start:
                    raise
            self._fetch()
            return super().write(ref, build, author, *args, **kwargs)

    def write_many(self, ref, ops, *args, **kwargs):
        with self.locked():
            return super().write_many(ref, ops, *args, **kwargs)

    # --- reads fetch first ----------------------------------------------------------
    def room_tip(self, room: str) -> str:
        self.refresh()
        return super().room_tip(room)

    def rooms(self, prefix: str = model.ROOM_PREFIX) -> list[str]:
        self.refresh()
        return super().rooms(prefix)

    def move_ref(self, old_ref: str, new_ref: str) -> str:
        raise _hub_side("archive or restore a room")

    def delete_ref(self, ref: str) -> None:
        raise _hub_side("destroy a room")


class _MirrorLock:
    """Re-entrant across threads of this process, exclusive across processes (flock)."""

    def __init__(self, store: RemoteStore):
        self.s = store

    def __enter__(self):
        import fcntl
        s = self.s
        s._mutex.acquire()
        if s._depth == 0:
            s._lockf = open(os.path.join(s.path, "gitdrop-remote.lock"), "a")
            fcntl.flock(s._lockf, fcntl.LOCK_EX)
        s._depth += 1
        return self

    def __exit__(self, *exc):
        s = self.s
        s._depth -= 1
        if s._depth == 0:
            s._lockf.close()   # closing releases the flock
            s._lockf = None
        s._mutex.release()


class RemoteHub(Hub):
    """gitdrop.hub.Hub for a hub behind a git URL: same methods, same rules."""

    def __init__(self, url: str, cache: str = "", clock=None, fresh: float = FRESH):
        self.url = url
        self.store = RemoteStore(url, mirror_path(url, cache), fresh)
        self.path = self.store.path   # the local mirror (a bare repository)
        self.clock = clock or (lambda: int(time.time()))

    def refresh(self) -> None:
        self.store.refresh(force=True)

    def _hub_view(self):
        self.store.refresh()
        return super()._hub_view()

    def archive_room(self, room, by, why=""):
        raise _hub_side("archive a room")

    def restore_room(self, room, by):
        raise _hub_side("restore a room")

    def destroy_room(self, room, by, why=""):
        raise _hub_side("destroy a room")

    def reap(self, now=None):
        raise _hub_side("reap idle rooms")

    def _move(self, ref, to, why, tries=50):
        raise _hub_side("move or delete a room's ref")


def _hub_side(what: str) -> UsageError:
    # Pushes cannot delete or rename refs on a hub (receive.denyDeletes and the hook).
    return UsageError(f"cannot {what} through a remote hub: it moves refs, which a push "
                      "may not do", "run it on the hub's machine: gitdrop --hub /path/to/hub.git …")


def _make_mirror(path: str, url: str) -> None:
    """Create the bare mirror once (atomically, so concurrent first uses agree)."""
    if os.path.exists(os.path.join(path, "HEAD")):
        return
    import pygit2
    import tempfile
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".new-", dir=os.path.dirname(path))
    repo = pygit2.init_repository(tmp, bare=True, initial_head="hub")
    repo.config["gitdrop.url"] = public_url(url)
    # A cache: a write counts once the hub took the push, and a crash here is mended
    # by the next fetch, so the mirror needs no fsync (and no write-ahead log).
    repo.config["gitdrop.fsync"] = "false"
    try:
        os.rename(tmp, path)
    except OSError:   # another process made it first
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)


def _last_lines(text: str, n: int = 3) -> str:
    lines = [re.sub(r"^remote: ?", "", ln).strip() for ln in text.strip().splitlines()]
    return " / ".join(ln for ln in lines[-n:] if ln) or "no output"
