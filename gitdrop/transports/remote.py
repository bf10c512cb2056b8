"""A hub on another machine, reached by a git URL.

The client keeps a bare mirror of the hub (~/.gitdrop/remotes/<hash>, or under
$GITDROP_CACHE) and uses the ordinary core on it: every write is built and
checked locally, moved there with CAS, then pushed. The remote hub's hook has the
last word: a push that lost a race is redone on the fetched tip (so a claim of a
just-claimed task fails naming the winner), and a refusal by the hook comes back
as the same Refusal while the local ref is put back.

A push that loses a race is retried with exponential backoff and full jitter for
a bounded time (GITDROP_RACE_SECONDS, and at least 12 tries) before a Conflict. With GITDROP_OFFLINE=queue
a write the hub cannot take (unreachable) stays in the mirror, queued
(transports/queue.py), and reads fall back to the mirror; `sync` pushes the queue
in order, each write rebased onto the hub's tip and checked again.

Every git command the client runs is stopped once the hub has sent nothing for
GITDROP_REMOTE_TIMEOUT seconds (a host that drops packets, a port that accepts and
never answers): it would otherwise hold the mirror's lock for git's own timeouts.
Each runs in a process group of its own (with the ssh or helper it starts), which
ends with the client: end_git_commands() is what the command line calls on SIGTERM.
"""

import hashlib
import math
import os
import random
import re
import selectors
import signal
import subprocess
import sys
import threading
import time

import pygit2

from .. import files, fmt, model
from ..errors import Conflict, Damaged, GitdropError, NotFound, Refusal, UsageError
from ..hub import Hub
from ..store import Store
from ..view import RoomView
from .queue import Queue

# A read fetches unless the mirror was refreshed this recently (seconds): one verb
# reads several times, and a write that raced is re-done on a fresh fetch anyway.
FRESH = float(os.environ.get("GITDROP_REMOTE_FRESH", "1.0"))
# Where every fetch also records the hub's tips (a room with writes queued keeps its
# last), and sync reads them, leaving the mirror's refs (and the queued writes on
# them, which reads show) alone until each write has landed.
HUB_TIPS = "refs/gitdrop/tips/"
HUB_ARCHIVED = "refs/gitdrop/archived/"   # the hub's archived rooms, as sync fetched them
SYNC_REFSPECS = (f"+refs/heads/*:{HUB_TIPS}*", f"+refs/archive/*:{HUB_ARCHIVED}*")
REFSPECS = ("+refs/heads/*:refs/heads/*", "+refs/archive/*:refs/archive/*", SYNC_REFSPECS[0])
# Commits a mirror's ref may hold that no queued write names, walked back at most.
ADOPT_MOST = 1000
# A lost push race: retried after a sleep drawn from [0, min(CAP, BASE * 2**n)]
# (full jitter: racing writers spread out instead of colliding again) until
# RACE_SECONDS have passed and at least RACE_TRIES pushes were lost: a slow server
# (seconds a push) gets as many tries as a fast one.
RACE_SECONDS = float(os.environ.get("GITDROP_RACE_SECONDS", "30"))
RACE_TRIES = 12
BACKOFF_BASE, BACKOFF_CAP = 0.05, 1.0
# Working offline, a read tries the hub again after this many seconds.
OFFLINE_RETRY = 5.0
# Re-dated at sync when older than this: the hub takes commits dated near its clock
# (a room's clock_skew, 30 s by default).
REDATE_AFTER = 5
ERR_KEPT = 1 << 20   # bytes of a git command's stderr kept (the end: a refusal is there)
# Where sync keeps the ids its writes landed under when they were not the ones queued
# (gitdrop-landed in the mirror: "queued landed" lines), and how many.
LANDED, LANDED_KEPT = "gitdrop-landed", 2000
_OID = re.compile(r"(?<![0-9a-f])[0-9a-f]{40}(?![0-9a-f])")
# Seconds a git command may wait for the hub's first answer, and, times BUSY, go
# without a byte once it has answered (a loaded hub's hook checking a push is
# silent a while; one that never answers is no busier for waiting on it). 10 s was
# too short for Apache running git http-backend with 30 agents pushing at once.
TIMEOUT = 30.0
BUSY = 6
WHOLE = 40   # times TIMEOUT one git command may take in all, however it trickles
_SCHEMES = ("file", "git", "http", "https", "ssh", "git+ssh", "ssh+git")
_SCP = re.compile(r"^(?:[^@/:]+@)?[^@/:]+:(?!//)")


class Unreachable(GitdropError):
    """The remote hub could not be reached (network, auth, no such repository)."""

    rule = "unreachable"
    exit_code = 7
    slow = False   # the hub answered, too slowly to finish in WHOLE timeouts

    @classmethod
    def whole(cls, reason: str, fix: str) -> "Unreachable":
        e = cls(reason, fix)
        e.slow = True
        return e


class SyncStopped(Unreachable):
    """A sync stopped at a write the hub neither took nor refused by a rule (it
    stopped answering, turned the push away for another reason, or serves a room
    the rules refuse, so the write cannot be judged): that write and those after
    it stay queued, in order. `rule` says which: unreachable, hub-rejected, damaged."""

    def __init__(self, rule: str, reason: str, fix: str, synced: list, queued: list):
        super().__init__(reason, fix)
        self.rule, self.synced, self.queued = rule, synced, queued
        if rule == Damaged.rule:   # the hub's state, not the network: exit 8 as elsewhere
            self.exit_code = Damaged.exit_code

    def to_dict(self) -> dict:
        return dict(super().to_dict(), synced=self.synced, queued=self.queued)


def is_url(s: str) -> bool:
    """A git URL (scheme://… or scp-like [user@]host:path), not a local path."""
    if not s:
        return False
    scheme, sep, _ = s.partition("://")
    if sep:
        return scheme.lower() in _SCHEMES
    return bool(_SCP.match(s)) and not os.path.exists(s)


def mirror_path(url: str, cache: str = "") -> str:
    """The local mirror of hub `url` (its offline queue inside): one per hub and user,
    however the URL is spelled. Keyed by the whole URL, a password changed while
    writes waited, or a trailing "/", opened another, empty mirror: its status said
    every write was on the hub, and the queued ones were never sent. A mirror made
    under the old key is moved to the new one."""
    base = cache or os.environ.get("GITDROP_CACHE") or os.path.expanduser("~/.gitdrop/remotes")
    key = public_url(url).rstrip("/")
    path = os.path.join(base, hashlib.sha256(key.encode()).hexdigest()[:16] + ".git")
    old = os.path.join(base, hashlib.sha256(url.encode()).hexdigest()[:16] + ".git")
    if old != path and os.path.isdir(old) and not os.path.lexists(path):
        try:
            os.rename(old, path)
        except OSError:   # another process moved it first, or it could not be moved
            return path if os.path.isdir(path) else old
    return path


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
        # the hub's words, shown as such: they may hold anything (terminal commands too)
        return Refusal(fmt.shown(m.group(1)), fmt.shown(fields["why"]),
                       fmt.shown(fields["fix"]), fmt.shown(fields["commit"]))
    if "gitdrop: the hook failed" in stderr:
        text = next(ln for ln in lines if "gitdrop: the hook failed" in ln)
        return Refusal("hook", fmt.shown(text.partition("gitdrop: ")[2]),
                       "report it to the hub's admin")
    return None


def offline_default() -> bool:
    """GITDROP_OFFLINE=queue: keep working while the hub is unreachable."""
    return os.environ.get("GITDROP_OFFLINE", "").strip().lower() == "queue"


def remote_timeout() -> float:
    """GITDROP_REMOTE_TIMEOUT: how many seconds of silence from the hub stop a git
    command (default TIMEOUT)."""
    raw = os.environ.get("GITDROP_REMOTE_TIMEOUT", "").strip()
    try:
        value = float(raw) if raw else TIMEOUT
    except ValueError:
        value = -1.0
    if not value > 0 or math.isinf(value):
        raise UsageError(f"GITDROP_REMOTE_TIMEOUT={raw!r} is not a number of seconds",
                         f"set it to a number above 0, e.g. {TIMEOUT:g}, or unset it")
    return value


# The process groups of the git commands running now, whichever thread started
# them: a signal reaches one thread, and every group must end with the process.
_RUNNING: set = set()


def end_git_commands() -> None:
    """Kill every git command of this process still running, with what it started
    (ssh, a remote helper): each has a session of its own, so nothing else would."""
    for pid in tuple(_RUNNING):
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# git's progress lines: asked for (--progress) only to show the hub is still talking
_PROGRESS = re.compile(r"^(?:remote: )?(?:(?:Enumerating|Counting|Compressing|Writing|"
                       r"Receiving|Resolving|Unpacking) objects|Total \d+ )")


def run_git(args, env: dict, timeout: float, url: str) -> subprocess.CompletedProcess:
    """git ARGS, stopped (with everything it started) once `timeout` seconds pass
    with no byte from it, or BUSY times that after its first (git prints nothing
    before the hub answers): a hub that accepted the connection and never answers is
    not waited on, a busy one or a slow transfer that keeps going is. Unreachable then."""
    p = subprocess.Popen(["git", *args], env=env, stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=True)   # its own group: killed together
    _RUNNING.add(p.pid)
    ofd, efd = p.stdout.fileno(), p.stderr.fileno()
    got = {ofd: [], efd: []}
    sel = selectors.DefaultSelector()
    for f in (p.stdout, p.stderr):
        sel.register(f, selectors.EVENT_READ)
    last, limit = time.monotonic(), timeout
    end = last + timeout * WHOLE   # a hub sending a byte now and then is not waited on for ever
    try:
        while sel.get_map():
            ready = sel.select(min(0.5, max(0.0, last + limit - time.monotonic())))
            if not ready and p.poll() is not None:
                break   # exited; a process it left running holds the pipes
            if time.monotonic() > end:
                raise Unreachable.whole(
                    f"git {args[0]} to {public_url(url)} still ran after {timeout * WHOLE:g} s "
                    f"({WHOLE} times GITDROP_REMOTE_TIMEOUT={timeout:g}), so it was stopped: "
                    "the hub answers too slowly to finish", "check the network and the hub's "
                    "server; on a slow link raise GITDROP_REMOTE_TIMEOUT")
            if not ready and time.monotonic() - last >= limit:
                raise Unreachable(
                    f"{public_url(url)} sent nothing for {limit:g} s"
                    + (" after it answered" if limit > timeout else "")
                    + f", so git {args[0]} was stopped (GITDROP_REMOTE_TIMEOUT="
                    f"{timeout:g}): the host drops packets, or its server accepts "
                    "connections and does not answer", "check the network and the "
                    "hub's server; on a slow link raise GITDROP_REMOTE_TIMEOUT")
            for key, _ in ready:
                chunk = os.read(key.fd, 65536)
                if chunk:
                    got[key.fd].append(chunk)
                    last, limit = time.monotonic(), timeout * BUSY
                    if key.fd == efd and len(got[efd]) > 2 * ERR_KEPT // 65536:
                        # what the hub says (its hook's words) is read to its end, and
                        # its last ERR_KEPT bytes kept: 300 MB of it took 2.3 GB here
                        got[efd] = [b"".join(got[efd])[-ERR_KEPT:]]
                else:
                    sel.unregister(key.fileobj)
        p.wait(timeout)   # both pipes closed: it is exiting
    except subprocess.TimeoutExpired:
        raise Unreachable(f"git {args[0]} to {public_url(url)} did not exit",
                          "check the network and the server") from None
    finally:
        sel.close()
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
        _RUNNING.discard(p.pid)
        p.stdout.close()
        p.stderr.close()
    out = b"".join(got[ofd]).decode("utf-8", "replace")
    err = b"".join(got[efd]).decode("utf-8", "replace")
    err = "\n".join(ln for ln in re.split(r"[\r\n]+", err) if ln and not _PROGRESS.match(ln))
    return subprocess.CompletedProcess(["git", *args], p.returncode, out, err)


class RemoteStore(Store):
    """A Store over a local mirror whose every accepted write is pushed to `url`."""

    def __init__(self, url: str, mirror: str, fresh: float = FRESH, offline=None):
        self.url = url
        self.fresh = fresh
        self.offline = offline_default() if offline is None else offline
        self.timeout = remote_timeout()
        self.lost_races = 0   # pushes redone because someone else wrote first
        self.backoff = 0.0    # seconds slept before those retries
        self.unreachable = False   # a read fell back to the mirror
        self._down = -math.inf     # when the hub last failed to answer (monotonic)
        self._fetched = -math.inf
        self._mutex = threading.RLock()
        self._depth = 0
        self._lockf = None
        self._local = threading.local()   # per thread: the write under way, what it queued
        _make_mirror(mirror, url)
        super().__init__(mirror)
        self.queue = Queue(self.repo)
        self.publish = self._publish
        made = bool(self.tip(model.HUB_REF) or self.rooms(fetch=False))
        with self.locked(wait=not made) as got:
            try:
                if got:   # else another command is talking to the hub: the mirror
                    self._fetch()   # as it is, as a read that just fetched would
            except Unreachable:
                if not (self.offline or self.queue.pending()) or (
                        not self.tip(model.HUB_REF) and not self.rooms(fetch=False)):
                    raise   # not working offline, or never fetched: nothing to work from
                self._went_down()
        if not self.tip(model.HUB_REF) and not self.rooms(fetch=False):
            raise NotFound(f"no gitdrop hub at {public_url(url)} (it has no hub branch "
                           "and no rooms)", "create it on its machine with gitdrop init PATH")

    # --- talking to the remote ----------------------------------------------------
    def _git(self, *args):
        env = dict(os.environ, GIT_TERMINAL_PROMPT="0", GIT_DIR=self.path)
        return run_git(args, env, self.timeout, self.url)

    def _went_down(self) -> None:
        """The hub did not answer: reads use the mirror, and neither they nor a
        write try it again for OFFLINE_RETRY seconds (each try may cost a timeout)."""
        self.unreachable = True
        self._down = time.monotonic()
        self._fetched = self._down + max(0.0, OFFLINE_RETRY - self.fresh)

    def _down_now(self) -> bool:
        return self.unreachable and time.monotonic() - self._down < OFFLINE_RETRY

    def refresh(self, force: bool = False) -> None:
        """Fetch the hub's refs into the mirror (unless it was fetched just now).
        Working offline, an unreachable hub leaves the mirror as it is."""
        if not force and time.monotonic() - self._fetched < self.fresh:
            return
        with self.locked(wait=force) as got:
            if not got:
                # Another command of this machine is talking to the hub (a sync can
                # take minutes): this read is served by the mirror as it is.
                return
            try:
                self._fetch()
                self.unreachable = False
            except Unreachable:
                if not (self.offline or self.queue.pending()):
                    raise
                self._went_down()

    def _fetch(self, refspecs=REFSPECS) -> None:
        # A ref with writes still queued keeps them: the fetch leaves it alone.
        keep = sorted({"^" + e["ref"] for e in self.queue.pending()})
        p = self._git("fetch", "--progress", "--prune", "--no-tags", "--no-write-fetch-head",
                      self.url, *refspecs, *(keep if refspecs == REFSPECS else ()))
        if p.returncode != 0:
            raise Unreachable(f"cannot fetch from {public_url(self.url)}: "
                              f"{_last_lines(p.stderr)}", _reach_fix(p.stderr, self.url)
                              + _OFFLINE_HINT * (not self.offline))
        self._fetched = time.monotonic()
        for room in _moved_back(p.stderr):
            sys.stderr.write(f"gitdrop: room {room} on {public_url(self.url)} moved back or was "
                             "replaced (restored from a backup, or reset): what it had after "
                             "that is gone from the hub, and from reads here; a write you saw "
                             "accepted there may have to be made again\n")

    def _push(self, ref: str, new: str) -> tuple[str, str]:
        """Push one ref: "ok"; "stale" (lost a race); "refused" (a rule's verdict on
        the write); "rejected" (turned away for another reason: a hook that failed, a
        damaged hub, no permission); "failed" (no answer). With git's stderr."""
        try:
            p = self._git("push", "--progress", "--porcelain", "--no-verify", self.url,
                          f"{new}:{ref}")
        except Unreachable as e:   # timed out: as unreachable as a refused connection
            return "slow" if e.slow else "failed", e.reason
        for line in p.stdout.splitlines():
            parts = line.split("\t")
            if len(parts) < 3 or not parts[1].endswith(":" + ref):
                continue
            flag, summary = parts[0], parts[2]
            if flag != "!":
                return "ok", p.stderr
            verdict = parse_refusal(p.stderr)
            if verdict is not None and verdict.rule not in _NOT_A_VERDICT:
                return "refused", p.stderr
            if "[rejected]" in summary or "update ref" in summary or "lock" in summary:
                return "stale", p.stderr    # fetch first / non-fast-forward / lost the ref lock
            return "rejected", p.stderr
        return "failed", p.stderr

    # --- the Store extension point ------------------------------------------------
    def _publish(self, ref: str, old: str, new: str) -> bool:
        if self.queue.pending() or (self.offline and self._down_now()):
            # the order is kept: behind the writes waiting; a hub that just did not
            # answer is not waited on again
            return self._enqueue(ref, old, new)
        try:
            status, err = self._push(ref, new)
        except KeyboardInterrupt:   # Ctrl-C, or SIGTERM as the command line raises it
            self._undo(ref, old, new)   # neither on the hub for sure nor queued
            self._fetched = -math.inf   # it may have landed: the next read fetches
            raise
        if status == "ok":
            self._hub_has(ref, new)
            return True
        slow = status == "slow"   # it ran out of time: pushed again, it would again
        status = "failed" if slow else status
        if status == "stale":
            try:
                self._lost_race(ref)
                self._fetch()   # the forced refspec replaces our commit with the winner's
            except GitdropError:
                self._undo(ref, old, new)
                raise
            return False
        if status == "failed" and self.offline:
            # Kept: it may even have landed (an answer lost); sync finds out.
            self._went_down()
            return self._enqueue(ref, old, new)
        if status == "failed" and self._landed_after_all(ref, new):
            return True
        if status == "failed" and not slow and self._fetched > -math.inf and \
                self.tip(ref) != new:
            # The hub answers (the fetch went through) and does not have it: the push
            # was cut off (a busy server drops connections); built again and pushed.
            self._lost_race(ref)
            return False
        self._undo(ref, old, new)
        if status in ("refused", "rejected"):
            raise self._refusal(err)
        self._fetched = -math.inf   # it may have landed: the next read (a retry's) fetches
        raise Unreachable(f"cannot push to {public_url(self.url)}: {_last_lines(err)}",
                          _reach_fix(err, self.url) + _OFFLINE_HINT)

    def _landed_after_all(self, ref: str, new: str) -> bool:
        """After a push that got no answer: fetch, and True if `new` is on the hub's
        ref (the answer was lost, not the push). A hub that does not answer the
        fetch either leaves `_fetched` at -inf."""
        self._fetched = -math.inf
        try:
            self._fetch()
        except GitdropError:
            return False
        tip = self.tip(ref)
        return bool(tip) and (tip == new or self.repo.descendant_of(tip, new))

    def _refusal(self, err: str) -> Refusal:
        refusal = parse_refusal(err) or Refusal(
            "remote-refused", f"{public_url(self.url)} refused the push: "
            f"{_last_lines(err)}", "read the server's message; fix the commit and retry")
        if refusal.rule == "authenticated-pusher":
            # the hook's fix is for commits made by hand (rebase them); this write is
            # gitdrop's own, made for --as, and it is the login that decides
            login = re.search(r"(?:authenticated|pushed) as (\S+)", refusal.reason)
            who = login.group(1).rstrip(".,;") if login else "your login's agent"
            refusal.fix = (f"the hub knows you as {who} here (the user in the URL, your SSH "
                           f"key or token): act as {who} (--as), or reach the hub with this "
                           "agent's own login")
        refusal.from_hub = True
        return refusal

    def _lost_race(self, ref: str) -> None:
        """Count a lost push race and sleep before the retry (exponential backoff,
        full jitter); past RACE_SECONDS since the write began, a Conflict."""
        self.lost_races += 1
        race = getattr(self._local, "race", None)
        if race is None:
            race = self._local.race = [time.monotonic(), 0]
        race[1] += 1
        spent = time.monotonic() - race[0]
        if spent >= RACE_SECONDS and race[1] >= RACE_TRIES:
            raise Conflict(f"{ref} on {public_url(self.url)} kept moving: {race[1]} pushes "
                           f"lost the race to other writers in {spent:.1f}s; nothing of "
                           "yours was written", "the room is busy: run the same command "
                           "again in a few seconds (it is rebuilt on the newest state)")
        pause = random.uniform(0, min(BACKOFF_CAP, BACKOFF_BASE * 2 ** race[1]))
        self.backoff += pause
        time.sleep(pause)

    def _enqueue(self, ref: str, old: str, new: str) -> bool:
        self._adopt(ref, old)
        c = self.reader.commit(new)
        entry = self.queue.add(ref, new, old, c.author, c.subject)
        self.taken().append(entry)
        return True

    def _hub_has(self, ref: str, commit: str) -> None:
        self.repo.references.create(HUB_TIPS + ref[len("refs/heads/"):],
                                    pygit2.Oid(hex=commit), force=True)

    def _adopt(self, ref: str, upto: str) -> None:
        """Queue the commits of the mirror's `ref` up to `upto` that neither a queued
        write names nor the hub had: a write killed after its move here and before
        its queue entry. Reads showed it and later writes build on it, so it is sent
        with them, in the order it was made, or those are refused at sync."""
        mine = [e for e in self.queue.pending() if e["ref"] == ref]
        known = {e["commit"] for e in mine} | {e["pushing"] for e in mine if e["pushing"]}
        hub = self.tip(HUB_TIPS + ref[len("refs/heads/"):])
        strays, c = [], upto
        while c and c not in known and c != hub and not (
                hub and self.repo.descendant_of(hub, c)):
            if len(strays) == ADOPT_MOST:
                return   # no end in sight: not a write killed while queueing
            strays.append(c)
            c = self.reader.commit(c).parent
        if not c and (hub or not any(n.startswith(HUB_TIPS) for n in self.repo.references)):
            # the hub's room is another history, or this mirror never recorded the
            # hub's tips (made by an older gitdrop): nothing to tell a stray by
            return
        for commit in reversed(strays):
            got = self.reader.commit(commit)
            entry = self.queue.add(ref, commit, got.parent, got.author, got.subject)
            sys.stderr.write(f"gitdrop: {got.subject[:60]!r} ({commit[:10]}) was in this "
                             "machine's mirror of the hub but in no queue (a process "
                             f"stopped while queueing it); it is queued now as #{entry['id']}, "
                             "before the writes made on it\n")

    def taken(self) -> list:
        """The writes this thread queued (instead of pushing) since take_queued."""
        if not hasattr(self._local, "queued"):
            self._local.queued = []
        return self._local.queued

    def take_queued(self) -> list[dict]:
        """The writes this thread queued since the last call (a face says so)."""
        out, self._local.queued = self.taken(), []
        return out

    def queued_answer(self, shell: bool = True) -> dict:
        """What a face adds to its answer when this thread's writes were queued
        instead of sent ({} when none were): queued, queue_ids and a note, worded
        for a person or agent with a shell here (the CLI) or without one (an agent
        talking to the MCP server, which cannot run gitdrop sync itself)."""
        entries = self.take_queued()
        if not entries:
            return {}
        waiting = len(self.queue.pending())
        ids = ", ".join(f"#{e['id']}" for e in entries)
        why = (f"{public_url(self.url)} cannot be reached" if self.unreachable or
               waiting == len(entries) else f"{waiting - len(entries)} earlier write(s) "
               "wait before it")
        note = (f"QUEUED, not yet on the hub: {why}, so write {ids} waits in this "
                f"machine's offline queue ({waiting} waiting); until it is sent, others "
                "do not see it and the hub has not judged it. ")
        if shell:
            note += ("Send the queue with gitdrop sync once the hub is reachable "
                     "(gitdrop status shows it).")
        else:
            note += ("It is sent, in order, when gitdrop sync runs on the machine this "
                     "server runs on, once the hub is reachable: nothing to do here; later "
                     "writes wait behind it. A write the hub then refuses stays queued "
                     "there with its rule.")
        return {"queued": True, "queue_ids": [e["id"] for e in entries], "note": note}

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
    def locked(self, wait: bool = True):
        """The mirror's lock; with wait=False, given only if it is free (as `with
        ... as got`: False when another process holds it)."""
        return _MirrorLock(self, wait)

    def write(self, ref, build, author, *args, **kwargs):
        """Store.write under the mirror's lock. A refusal or not-found built on a
        mirror older than this write is checked again on a fresh fetch: only the
        hub's latest state may refuse (the hook's own verdict is final)."""
        if len(args) < 3:   # the time budget bounds the retries, not a count
            kwargs.setdefault("tries", 1000)
        with self.locked(), self._race():
            start = time.monotonic()
            try:
                return super().write(ref, build, author, *args, **kwargs)
            except (Refusal, NotFound) as e:
                # The hub moved an old room to the current layout as this push
                # arrived (hook.py): built again on what it moved, it goes in.
                moved = getattr(e, "from_hub", False) and getattr(e, "rule", "") == "layout" \
                    and "older layout" in getattr(e, "reason", "")
                if not moved and (getattr(e, "from_hub", False) or self._fetched >= start or
                                  self.queue.pending()):
                    raise
                try:
                    self._fetch()
                except Unreachable:
                    if self.offline:
                        raise e from None   # nothing fresher to judge it by
                    raise
            return super().write(ref, build, author, *args, **kwargs)

    def write_many(self, ref, ops, *args, **kwargs):
        if len(args) < 3:
            kwargs.setdefault("tries", 1000)
        with self.locked(), self._race():
            return super().write_many(ref, ops, *args, **kwargs)

    def _race(self):
        return _Race(self._local)

    # --- reads fetch first ----------------------------------------------------------
    def room_tip(self, room: str) -> str:
        self.refresh()
        return super().room_tip(room)

    def rooms(self, prefix: str = model.ROOM_PREFIX, fetch: bool = True) -> list[str]:
        if fetch:
            self.refresh()
        return super().rooms(prefix)

    # --- the offline queue -----------------------------------------------------------
    def sync(self, drop: int | None = None, retry: int | None = None) -> dict:
        """Push the queued writes in order, each rebased onto the hub's tip and
        checked again. One a rule refuses is marked (its rule, why, what to do) and
        left for its owner, and later syncs skip it; the others go through. `retry`
        sends such a one again, after the others (so it lands after the writes
        queued behind it); `drop` removes one from the queue. A write the hub
        neither takes nor refuses by a rule stops the sync: SyncStopped, and it and
        those after it stay queued. The mirror's lock is taken for one write at a
        time: every other command on this hub waited for the whole queue (minutes
        for a thousand writes), `gitdrop status` too; a write made meanwhile is
        queued behind the others and sent by this sync."""
        with self.locked():
            if drop is not None:
                found = self._queued(drop)
                landed = False
                if found["pushing"]:   # a sync was sending it when it stopped
                    try:
                        self._fetch(SYNC_REFSPECS)
                        landed = self._on_hub(found)
                    except Unreachable:
                        landed = None   # cannot tell
                self.queue.remove(drop)
                return {"dropped": found, "landed": landed, "synced": [], "refused": [],
                        "skipped": [], "queued": self.queue.entries()}
            self.queue.tidy()
            for ref in sorted({e["ref"] for e in self.queue.pending()}):
                self._adopt(ref, self.tip(ref))
            entries = self.queue.entries()
            if retry is not None:
                again = self._queued(retry)
                if not again.get("refused"):
                    raise UsageError(f"write #{retry} was not refused: it is sent in its "
                                     "turn", "run gitdrop sync")
            skipped = [e for e in entries if e.get("refused") and e["id"] != retry]
            if entries:
                self._fetch(SYNC_REFSPECS)
        synced, refused, tried = [], [], set()
        while True:
            if self._depth == 0:   # (a caller holding the lock would wait on itself)
                _let_in(self.path)
            with self.locked():
                todo = self._to_send(retry, tried)
                if not todo:
                    break
                entry = todo[0]
                tried.add(entry["id"])
                try:
                    with self._race():
                        outcome = self._sync_one(entry)
                except _Stop as stop:
                    raise self._stopped(stop, entry, todo[1:], synced) from None
            (synced if outcome == "synced" else refused).append(entry)
        with self.locked():
            try:
                self._fetch()   # the mirror's refs: the hub's, with what landed
                self.unreachable = False
            except Unreachable:   # gone after the last push: what was sent is still sent
                self._went_down()
            return {"synced": synced, "refused": refused, "skipped": skipped,
                    "retried": retry, "queued": self.queue.entries()}

    def _to_send(self, retry: int | None, tried: set) -> list[dict]:
        """What this sync has still to send, in order: the queue as it is now (a write
        made during the sync is in it), then the refused one it retries."""
        entries = [e for e in self.queue.entries() if e["id"] not in tried]
        return [e for e in entries if not e.get("refused")] + \
            [e for e in entries if e["id"] == retry and e.get("refused")]

    def _queued(self, entry_id: int) -> dict:
        for e in self.queue.entries():
            if e["id"] == entry_id:
                return e
        raise NotFound(f"no queued write #{entry_id}", "see the queue with gitdrop status")

    def _stopped(self, stop: "_Stop", entry: dict, after: list, synced: list) -> SyncStopped:
        """The error a stopped sync ends with: what stopped it, what went before, what
        waits (and the mirror brought up to date, if the hub still answers)."""
        if stop.rule != "unreachable":
            try:
                self._fetch()
            except Unreachable:
                pass
        sent = "; sent before it: " + ", ".join("#%d" % e["id"] for e in synced) \
            if synced else ""
        return SyncStopped(
            stop.rule, f"write #{entry['id']} was not sent: {stop.reason}{sent}; "
            f"#{entry['id']} and the {len(after)} write(s) after it stay queued, in order",
            stop.fix, synced, self.queue.entries())

    def _sync_one(self, entry: dict) -> str:
        ref = entry["ref"]
        while True:
            tip = self._hub_tip(ref)
            if self._on_hub(entry):
                # it landed (a sync killed after its push, or an answer lost): under
                # the id it was pushed as, which the writes after it must name
                if entry["pushing"] and entry["pushing"] != entry["commit"] and \
                        self._on_hub(dict(entry, commit="")):
                    self._record_landed(entry["commit"], entry["pushing"])
                self.queue.remove(entry["id"])
                return "synced"
            if not tip and entry["parent"] and ref.startswith(model.ROOM_PREFIX) and not any(
                    e["commit"] == entry["parent"] for e in self.queue.entries()):
                # built on the room as the hub had it, which it has no longer
                return self._mark_refused(entry, self._room_gone(entry))
            try:
                new = self._rebase(entry, tip, self._hub_tip(model.HUB_REF))
            except Refusal as e:
                return self._mark_refused(entry, e)
            except Damaged as e:   # the hub serves what the rules refuse: not the write's
                raise self._hub_damaged(e) from None
            except (KeyError, ValueError, pygit2.GitError) as e:
                if self._whole(entry):   # then what could not be read is the hub's
                    raise self._hub_damaged(Damaged(
                        f"reading it raised {type(e).__name__}: {e}", "ask the hub's owner "
                        "to run gitdrop verify there")) from None
                # its commit is missing or damaged here (a power cut on this machine):
                # marked, so the writes after it still go
                return self._mark_refused(entry, Refusal(
                    "queue-damaged", f"write #{entry['id']}'s commit {entry['commit'][:12]} "
                    f"is missing or damaged in this machine's mirror ({e})",
                    f"drop it (gitdrop sync --drop {entry['id']}) and make the write again"))
            entry["pushing"], entry["refused"] = new, None
            self.queue.save(entry)   # before the push: a kill after it is found landed
            status, err = self._push(ref, new)
            if status == "ok":
                self._hub_has(ref, new)
                if new != entry["commit"]:
                    self._record_landed(entry["commit"], new)
                self.queue.remove(entry["id"])
                return "synced"
            if status == "refused":
                e = self._refusal(err)
                if not (e.rule == "layout" and "older layout" in e.reason):
                    return self._mark_refused(entry, e)
                # else: the hub moved the room to the current layout as the push came
                # in; built again on what it moved, as after a lost race
            elif status in ("failed", "slow"):
                # slow: it ran out of time while the hub still talked; pushed again, it
                # would again (12 times over, 20 minutes each, under the mirror's lock)
                raise _Stop("unreachable", f"{public_url(self.url)} did not take the push "
                            + ("in the time allowed " if status == "slow" else "")
                            + f"({_last_lines(err)})", "run gitdrop sync again when the hub "
                            "answers (it finds out whether the write landed)")
            elif status == "rejected":
                e = self._refusal(err)
                raise _Stop("hub-rejected", f"the hub turned the push away, not by a "
                            f"rule on the write: {e.reason}", "have the cause fixed on "
                            "the hub (a permission, a hook that fails: its admin), then "
                            "run gitdrop sync again")
            self._lost_race(ref)
            self._fetch(SYNC_REFSPECS)

    def _hub_damaged(self, e: Damaged) -> "_Stop":
        """The stop of a sync whose writes the hub's own state keeps from being
        judged: the queue is left as it is, to be sent once the hub is mended."""
        return _Stop(Damaged.rule, f"the hub {public_url(self.url)} serves damaged "
                     f"state, which no write can be judged on: {e.reason}",
                     f"{e.fix}; then run gitdrop sync again: the queue was left as it is")

    def _whole(self, entry: dict) -> bool:
        """Whether the queued write's commit, and all it changes, reads in the mirror."""
        r = self.reader
        try:
            c = r.commit(entry["commit"])
            base = r.commit(c.parent).tree if c.parent else None
            for _path, _was, now in r.diff(base, c.tree):
                r.blob_text(now)
        except (KeyError, ValueError, pygit2.GitError):
            return False
        return True

    def _room_gone(self, entry: dict) -> Refusal:
        """A write to a room the hub no longer has (it was judged as one to a room
        that never was: "team core is not a member of room proj", and told to join)."""
        room = entry["ref"][len(model.ROOM_PREFIX):]
        if self.tip(HUB_ARCHIVED + model.ARCHIVE_PREFIX[len("refs/archive/"):] + room):
            return Refusal("room-archived", f"room {room} is archived on the hub, so write "
                           f"#{entry['id']} has no room to go to", "ask one of its leads to "
                           f"restore it (gitdrop room restore {room}, on the hub's machine), "
                           f"then gitdrop sync --retry {entry['id']}; or gitdrop sync --drop "
                           f"{entry['id']}")
        return Refusal("room-gone", f"room {room} is no longer on the hub (destroyed since "
                       f"write #{entry['id']} was queued)", f"drop it (gitdrop sync --drop "
                       f"{entry['id']}); a room of that name made again is another room")

    def _on_hub(self, entry: dict) -> bool:
        """Whether the queued write is on the hub, as last fetched (as queued, or as
        a sync rebased it)."""
        tip = self._hub_tip(entry["ref"])
        return any(c and (c == tip or (tip and self.repo.descendant_of(tip, c)))
                   for c in (entry["commit"], entry["pushing"]))

    def _hub_tip(self, ref: str) -> str:
        """The hub's tip of `ref` as last fetched, with what it took from here since."""
        return self.tip(HUB_TIPS + ref[len("refs/heads/"):])

    def _mark_refused(self, entry: dict, e: Refusal) -> str:
        from ..rules import APPLIED
        if e.rule == "idempotency-key" and APPLIED in e.reason:
            # made on the hub too (a retry from another machine): it is there, once
            self.queue.remove(entry["id"])
            return "synced"
        if e.rule in _PASSING:
            # Not the write's fault, and gone in a while: the burst sync itself sends
            # (each write dated now), or this machine's clock. Marked, each one had
            # to be retried by hand, one a sync, and landed out of order.
            raise _Stop(e.rule, e.reason, f"{e.fix}; then run gitdrop sync again (it and "
                        "the writes after it wait in the queue, in order)")
        entry["refused"] = {"rule": e.rule, "reason": e.reason, "fix": e.fix,
                            "commit": e.commit}
        self.queue.save(entry)
        return "refused"

    def _rebase(self, entry: dict, onto: str, hub: str) -> str:
        """The queued commit as it would be made on `onto` now: its changes applied
        file by file (a file changed on the hub since is a conflict), dated now,
        then judged by the same checks the hub's hook runs, with the team registry
        of `hub` (the hub's branch as fetched, not the mirror's)."""
        from ..verify import check_commits
        r = self.reader
        c = r.commit(entry["commit"])
        now = int(time.time())
        what = f"#{entry['id']} \"{c.subject[:60]}\""
        clash = []
        base = r.commit(c.parent).tree if c.parent else None
        at = r.commit(onto).tree if onto else None
        changed = r.diff(base, c.tree)
        if at and entry["ref"].startswith(model.ROOM_PREFIX):
            # the hub's copy of a file the rules refuse would refuse the write for it
            hub_view = RoomView(r, at, onto, entry["ref"][len(model.ROOM_PREFIX):])
            for path, _was, _now in changed:
                hub_view.check(path)
        if onto == c.parent and now - c.time <= REDATE_AFTER:
            new = c.oid
        else:
            # An earlier queued write that landed under another id (rebased, dated
            # anew) is named by it here: a read cursor set to it, a reply to it.
            landed = self._landed_as()

            def named(text):
                return _OID.sub(lambda m: landed.get(m.group(0), m.group(0)), text) \
                    if landed and text else text
            changes = {}
            for path, was, now_oid in changed:
                cur = r.blob_id(at, path) if at else None
                text = named(r.blob_text(now_oid))
                if cur == now_oid and text == r.blob_text(now_oid):
                    continue
                if cur != was:
                    clash.append(path)
                changes[path] = text
            tree = self._tree_with(at, changes) if changes else (at or self._tree_with(None, {}))
            new = self._native_commit(tree, [onto] if onto else [], c.author, c.email, now,
                                      named(c.message))
        try:   # a rule's verdict on the hub's state first: it says more than a clash
            check_commits(r, entry["ref"], onto, new, now, hub=hub)
        except Refusal as e:
            e.commit = what
            raise
        if clash:
            raise Refusal("sync-conflict", f"{', '.join(clash[:3])} changed on the hub after "
                          f"write #{entry['id']} was queued; applied now it would undo that "
                          "change", f"drop it (gitdrop sync --drop {entry['id']}) and do it "
                          "again on the hub's current state", commit=what)
        return new

    def _landed_as(self) -> dict:
        """{queued commit: the commit it landed as} of the writes sync sent under
        another id (the last LANDED_KEPT), for the queued writes that name them."""
        try:
            with open(os.path.join(self.repo.path, LANDED), encoding="ascii") as f:
                pairs = [ln.split() for ln in f.read(LANDED_KEPT * 82 * 2).splitlines()]
        except (OSError, UnicodeDecodeError):
            return {}
        return {p[0]: p[1] for p in pairs if len(p) == 2 and all(_OID.fullmatch(x) for x in p)}

    def _record_landed(self, old: str, new: str) -> None:
        landed = self._landed_as()
        landed.pop(old, None)
        landed[old] = new
        text = "".join(f"{a} {b}\n" for a, b in list(landed.items())[-LANDED_KEPT:])
        try:
            files.write_whole(os.path.join(self.repo.path, LANDED), text.encode(), 0o600)
        except OSError:
            pass   # the writes after it name the id it was queued under, as before

    def move_ref(self, old_ref: str, new_ref: str) -> str:
        raise _hub_side("archive or restore a room")

    def delete_ref(self, ref: str) -> None:
        raise _hub_side("destroy a room")


# Refusals the hook prints that are no rule's verdict on the write: the hook itself
# failed, or the hub is damaged. Sync stops there instead of marking the write.
_NOT_A_VERDICT = ("hook", "damaged")
_OFFLINE_HINT = ("; to keep working while it is unreachable, set GITDROP_OFFLINE=queue "
                 "(writes wait in a queue; gitdrop sync sends them)")


# Refusals that pass with time: sync stops at such a write instead of marking it.
_PASSING = ("loop-guard", "clock")


class _Stop(Exception):
    """Inside sync: a push the hub neither took nor refused by a rule."""

    def __init__(self, rule: str, reason: str, fix: str):
        super().__init__(reason)
        self.rule, self.reason, self.fix = rule, reason, fix


class _Race:
    """One write's lost races: when it began and how many (the backoff reads it)."""

    def __init__(self, local):
        self.local = local

    def __enter__(self):
        self.outer = getattr(self.local, "race", None)
        self.local.race = [time.monotonic(), 0]

    def __exit__(self, *exc):
        self.local.race = self.outer


class _MirrorLock:
    """Re-entrant across threads of this process, exclusive across processes (flock)."""

    def __init__(self, store: RemoteStore, wait: bool = True):
        self.s, self.wait, self.got = store, wait, False

    def __enter__(self):
        s = self.s
        if not s._mutex.acquire(blocking=self.wait):
            return False   # another thread of this process has it
        if s._depth == 0:
            try:
                s._lockf = _take_lock(os.path.join(s.path, "gitdrop-remote.lock"), s.url,
                                      self.wait)
            except BaseException:
                s._mutex.release()   # Ctrl-C while waiting: the next call may lock
                raise
            if s._lockf is None:
                s._mutex.release()
                return False
            s.queue.held = True
        s._depth += 1
        self.got = True
        return True

    def __exit__(self, *exc):
        if not self.got:
            return
        s = self.s
        s._depth -= 1
        if s._depth == 0:
            s.queue.held = False
            s.queue.forget()
            os.close(s._lockf)   # closing releases the flock
            s._lockf = None
        s._mutex.release()


LOCK_SAY = 2.0   # seconds waited on the mirror's lock before saying so


def _take_lock(path: str, url: str, wait: bool = True) -> int | None:
    """The mirror's lock file, flocked (a FIFO or a link planted there is refused,
    not waited on); None if another process holds it and `wait` is False."""
    import fcntl
    fd = _open(path)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not wait:
                os.close(fd)
                return None
            # Another command of this machine is talking to the hub: a push, a
            # fetch, or one write of a sync. Said once the wait is long enough to
            # wonder about (a hub that answers slowly holds it for longer).
            said = threading.Timer(LOCK_SAY, _say_waiting, (public_url(url),))
            said.daemon = True
            said.start()
            waiting = _open(path + WAITING)   # held shared while waiting (let_in)
            try:
                fcntl.flock(waiting, fcntl.LOCK_SH)
                fcntl.flock(fd, fcntl.LOCK_EX)
            finally:
                os.close(waiting)
                said.cancel()
    except BaseException:
        os.close(fd)
        raise
    return fd


WAITING = ".waiting"


def _open(path: str) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NONBLOCK |
                   files.NOFOLLOW, 0o600)


def _let_in(mirror: str) -> None:
    """Between two writes of a sync: wait until the commands that were waiting for
    the mirror's lock have it (each holds the .waiting file shared while it waits).
    flock is not fair: the sync took the lock again at once, and they waited on.
    At most LET_IN seconds: a waiter stopped (SIGSTOP) would hold the sync for ever."""
    import fcntl
    fd = _open(os.path.join(mirror, "gitdrop-remote.lock" + WAITING))
    end = time.monotonic() + LET_IN
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() >= end:
                    return
                time.sleep(0.01)
    finally:
        os.close(fd)


LET_IN = 5.0


def _say_waiting(url: str) -> None:
    sys.stderr.write(f"gitdrop: waiting for another gitdrop command on this machine that "
                     f"is talking to {url} (a push, a fetch or a gitdrop sync sending the "
                     "queue: one write at a time); this one goes on when it is done\n")
    sys.stderr.flush()


class RemoteHub(Hub):
    """gitdrop.hub.Hub for a hub behind a git URL: same methods, same rules."""

    moves_layout = False   # the hub's hook does it (layout.upgrade_on_push)

    def __init__(self, url: str, cache: str = "", clock=None, fresh: float = FRESH,
                 offline=None):
        self.url = url
        self.store = RemoteStore(url, mirror_path(url, cache), fresh, offline)
        self.path = self.store.path   # the local mirror (a bare repository)
        self.clock = clock or (lambda: int(time.time()))

    def refresh(self) -> None:
        self.store.refresh(force=True)

    def _hub_view(self):
        self.store.refresh()
        return super()._hub_view()

    # Who may is said first: "run it on the hub's machine" sent one who may not there.
    def archive_room(self, room, by, why=""):
        self._require_lead(self._locate(room)[2], by, "archive")
        raise _hub_side("archive a room")

    def restore_room(self, room, by):
        self._require_lead(self._locate(room)[2], by, "restore")
        raise _hub_side("restore a room")

    def destroy_room(self, room, by, why=""):
        self.may_destroy(self._locate(room)[2], by)
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


def _moved_back(stderr: str) -> list[str]:
    """The rooms whose hub tip a fetch did not move forward (git: "forced update" of
    the ref that records it; our own writes never move those back)."""
    out = []
    for line in stderr.splitlines():
        # git's own lines only: the hub's words come prefixed "remote:", and may say
        # anything (a room name that is no name, with terminal escapes in it)
        if "(forced update)" in line and " -> " + HUB_TIPS in line and \
                not line.lstrip().startswith("remote:"):
            name = line.split(" -> " + HUB_TIPS, 1)[1].split()[0]
            room = name[len(model.ROOM_PREFIX) - len("refs/heads/"):]
            if name.startswith(model.ROOM_PREFIX[len("refs/heads/"):]) and model.is_name(room):
                out.append(room)
    return out


def _reach_fix(stderr: str, url: str = "") -> str:
    """What to do when git could not reach the hub: a login the URL lacks is said
    as such (a command gitdrop printed has the URL without its password), and one
    the hub turned away too."""
    if re.search(r"could not read (Username|Password)|Authentication failed", stderr):
        if public_url(url) != url:
            return ("the hub turned away the login in the URL: check its name and token "
                    "(a token revoked or rotated? gitdrop token, on the hub's machine)")
        return ("the hub asks for a login: give it in the URL (scheme://team%2Fname:TOKEN@"
                "host/...) or in GITDROP_HUB; gitdrop leaves the password out of the "
                "commands it prints")
    return "check the URL, your credentials and that the hub exists"


def _last_lines(text: str, n: int = 3) -> str:
    lines = [re.sub(r"^remote: ?", "", ln).strip() for ln in text.strip().splitlines()]
    return " / ".join(ln for ln in lines[-n:] if ln) or "no output"
