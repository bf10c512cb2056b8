"""The notifier: wakes whoever a new commit is for, whatever wrote it (CLI, MCP
server, raw `git push`).

A local hub is watched with watchdog (inotify). Git stores a ref as a loose file
(written as `x.lock`, renamed to `x`) or, after `git pack-refs`, as a line of
`packed-refs` (rewritten through `packed-refs.new`/`.lock`), so any event under
`refs/` or on `packed-refs*` only means "re-read the tips": events are computed
from the commits between the tip each subscriber last saw and the new one
(first-parent walk), never from the file event itself. A remote hub (a git URL)
has no files to watch: it is followed with `git ls-remote` on a backing-off
interval and fetched into the same local mirror a RemoteHub uses (gitdrop.transports.remote),
where the same computation runs on the tips the hub itself advertised.
"""

import functools
import os
import struct
import sys
import threading
import time

from . import events, fmt, model
from .core import default_hub
from .errors import GitdropError
from .store import Store
from .view import first_parent_walk

TIMEOUT_EXIT = 124      # like timeout(1)
INTERRUPT_EXIT = 130
POLL = (0.2, 5.0)       # remote: ls-remote interval, from and backing off to
LOCAL_POLL = 0.5        # a local hub whose refs cannot be watched: a scan this often
SAFETY = 10.0           # local: re-read the tips this often even if inotify says nothing
WALK_CAP = 1000         # commits walked for a subscriber whose base is not found (rewritten ref)
# ...and for one whose base is behind the tip: a push of thousands of commits, an
# import, a watcher stopped a while (its older events were dropped at WALK_CAP)
BEHIND_CAP = 50_000


def is_remote(hub: str) -> bool:
    """A git URL (scheme:// or scp-like host:path) rather than an existing local path."""
    from .transports.remote import is_url
    return is_url(hub) and not os.path.exists(os.path.expanduser(hub))


def _git_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env["GIT_TERMINAL_PROMPT"] = "0"
    return env


class _Sub:
    __slots__ = ("room", "agent", "callback", "group", "active", "every")

    def __init__(self, room, agent, callback, every=False):
        self.room, self.agent, self.callback = room, agent, callback
        self.group: _Group | None = None   # the subscribers that last saw its tip
        self.active, self.every = True, every


class _Group:
    """The subscribers of a room that last saw the same tip (`base`), indexed by
    what a commit names: an agent, a team, everyone. A scan moves a whole group
    to the new tip at once, and asks only those a commit names how it concerns
    them (events.concerns): a room of thousands watching pays per recipient, not
    per watcher. Usually a room has one group."""

    def __init__(self, base: str):
        self.base, self.subs = base, set()
        self.every: set = set()
        self.by_agent: dict = {}    # agent -> {subscribers}
        self.by_team: dict = {}     # team -> {subscribers}

    def add(self, sub: _Sub) -> None:
        sub.group = self
        self.subs.add(sub)
        if sub.every:
            self.every.add(sub)
            return
        self.by_agent.setdefault(sub.agent, set()).add(sub)
        self.by_team.setdefault(_team(sub.agent), set()).add(sub)

    def remove(self, sub: _Sub) -> None:
        self.subs.discard(sub)
        self.every.discard(sub)
        for index, key in ((self.by_agent, sub.agent), (self.by_team, _team(sub.agent))):
            got = index.get(key)
            if got is not None:
                got.discard(sub)
                if not got:
                    del index[key]

    def candidates(self, ev: dict, leads) -> list:
        """The subscribers (not `every`) `ev` could concern; `leads()`: the room's
        leads (a lead gets a copy of every message)."""
        if ev["op"] == "send":
            names, to_leads = list(ev["to"]) + list(ev["cc"]), True
        else:
            names = ev.get("for", [])
            to_leads = events.LEADS in names
        if any(n == model.ALL or n.startswith(events.ABLE) for n in names):
            return [s for s in self.subs if not s.every]
        out = set()
        for n in names:
            out.update(self.by_team.get(n[1:], ()) if n.startswith("@")
                       else self.by_agent.get(n, ()))
        if to_leads:
            for agent in leads():
                out.update(self.by_agent.get(agent, ()))
        return list(out)


class _Once:
    """fn(arg), worked out on the first call (functools.cache's wrapper costs more
    to make than a scan of thousands of watchers has to spend on each)."""
    __slots__ = ("fn", "arg", "value", "known")

    def __init__(self, fn, arg):
        self.fn, self.arg, self.known = fn, arg, False

    def __call__(self):
        if not self.known:
            self.value, self.known = self.fn(self.arg), True
        return self.value


def _team(agent: str) -> str:
    return model.split_agent(agent)[0]   # as rules.reaches reads "@team"


class _RefHandler:
    """watchdog handler: any ref-ish change means "re-read the tips", right here
    in the observer's thread (one thread hop less than handing it on)."""

    def __init__(self, refs_dir: str, changed):
        self.refs_dir = refs_dir + os.sep
        self.changed = changed

    def dispatch(self, event) -> None:
        for p in (event.src_path, getattr(event, "dest_path", "")):
            p = os.fsdecode(p) if p else ""
            if p and _moves_refs(os.path.basename(p), p.startswith(self.refs_dir)):
                self.changed()
                return


def _moves_refs(name: str, under_refs: bool) -> bool:
    """Whether a file event on `name` can have moved a ref: a name under refs/, or
    packed-refs being rewritten. A lock file made, written or removed moves no ref:
    only a rename or swap onto the ref itself does (a write makes five events; one
    counts)."""
    return not name.endswith(".lock") and (under_refs or name.startswith("packed-refs"))


class _RefEvents:
    """Which inotify events move a room ref, on the directories where room refs
    move (refs/heads/rooms, and the repository for packed-refs): only renames and
    deletes of refs count. A ref's lock file coming and going moves nothing, and a
    swap (two moves) counts once, by the name that arrives."""

    def _watch_all(self, git_dir: str) -> None:
        K = self.K
        self.moves = K.IN_MOVED_TO | K.IN_DELETE   # a rename or swap onto a ref; a delete
        self.heads = os.path.join(git_dir, "refs", "heads")
        self.rooms = os.path.join(self.heads, "rooms")
        self.wds = {self._add(git_dir, self.moves): "git",
                    self._add(self.heads, K.IN_CREATE | K.IN_MOVED_TO): "heads"}
        if os.path.isdir(self.rooms):
            self.wds[self._add(self.rooms, self.moves)] = "rooms"

    def moved(self, wd: int, mask: int, name: bytes) -> bool:
        name = os.fsdecode(name)
        where = self.wds.get(wd)
        if where == "heads":
            if name == "rooms" and mask & self.K.IN_ISDIR:   # the first room
                self.wds[self._add(self.rooms, self.moves)] = "rooms"
                return True
            return False
        return _moves_refs(name, where != "git")


class _RefWatch(_RefEvents):
    """inotify through watchdog's InotifyFD: its callbacks run on its reader
    thread, with no buffer, emitter and dispatch threads in between (a third of
    the observer's CPU per commit)."""

    def __init__(self, git_dir: str, changed):
        from watchdog.observers.inotify_c import InotifyConstants as K, InotifyFD
        self.K, self.changed = K, changed
        self.fd = InotifyFD()
        self._watch_all(git_dir)
        self.fd.start()

    def _add(self, path: str, mask) -> int:
        return self.fd.add_callback(os.fsencode(path), mask, self, id(self))

    def on_event(self, event) -> None:
        if self.moved(event.wd, event.mask, event.name):
            self.changed()

    def on_watch_deleted(self, wd) -> None:
        self.wds.pop(wd, None)

    def on_queue_overflow(self) -> None:
        self.changed()

    def stop(self) -> None:
        self.fd.stop()

    def join(self, timeout=None) -> None:
        self.fd.join(timeout)


class _LoopRefWatch(_RefEvents):
    """inotify read by an asyncio event loop (the MCP server's), through watchdog's
    inotify bindings. A reader thread would wake in the middle of the server's own
    write (its ref rename) and take the GIL for the scan while the write waits to
    finish (0.28 ms per write, measured); here the events wait until the call
    returns to the loop, and the scan runs there."""

    def __init__(self, git_dir: str, changed, loop):
        import ctypes
        from watchdog.observers.inotify_c import InotifyConstants as K, inotify_add_watch, \
            inotify_init
        self.K, self.changed, self.loop = K, changed, loop
        self._add_watch, self._errno = inotify_add_watch, ctypes.get_errno
        self.fd = inotify_init()
        if self.fd < 0:
            raise OSError(self._errno(), "inotify_init failed")
        os.set_blocking(self.fd, False)
        try:
            self._watch_all(git_dir)
            loop.add_reader(self.fd, self._readable)
        except BaseException:
            os.close(self.fd)
            raise

    def _add(self, path: str, mask) -> int:
        wd = self._add_watch(self.fd, os.fsencode(path), mask)
        if wd < 0:
            raise OSError(self._errno(), f"cannot watch {path}")
        return wd

    def _readable(self) -> None:
        try:
            buf = os.read(self.fd, 1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        K, at, hit = self.K, 0, False
        while at + 16 <= len(buf):   # struct inotify_event: wd, mask, cookie, len, name
            wd, mask, _cookie, n = struct.unpack_from("iIII", buf, at)
            name = buf[at + 16:at + 16 + n].rstrip(b"\0")
            at += 16 + n
            if mask & K.IN_Q_OVERFLOW:
                hit = True
            elif mask & K.IN_IGNORED:   # its directory went away
                self.wds.pop(wd, None)
            elif self.moved(wd, mask, name):
                hit = True
        if hit:   # one scan for all the events of one read
            self.changed()

    def stop(self) -> None:
        if self.fd >= 0:
            if not self.loop.is_closed():
                self.loop.remove_reader(self.fd)
            os.close(self.fd)
            self.fd = -1

    def join(self, timeout=None) -> None:
        pass


class Notifier:
    """Calls `callback(events)` for each batch of new events that concern an agent."""

    def __init__(self, hub_path: str = "", poll: tuple[float, float] = POLL):
        self.hub = hub_path or default_hub()
        self.remote = is_remote(self.hub)
        self.poll = poll
        if self.remote:  # the mirror RemoteHub keeps; fetched under its lock
            from .transports.remote import RemoteStore, mirror_path, public_url
            self.store = RemoteStore(self.hub, mirror_path(self.hub))
            self.shown = public_url(self.hub)
        else:
            self.store = Store(os.path.expanduser(self.hub))
            self.shown = self.store.path
        self.path = self.store.path
        self.git_dir = os.path.normpath(self.store.repo.path)
        self._subs: dict[str, dict[str, _Group]] = {}   # room -> {base: group}
        self._lock = threading.RLock()
        self._dirty = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._observer = None
        self._seen_remote: dict[str, str] = {}
        self.interval = poll[0]
        self.scans = 0
        self._said_gone: set = set()   # rooms whose absence was said (said once)

    def describe(self) -> str:
        if self.remote:
            return (f"polling {self.shown} (remote, ls-remote every "
                    f"{self.poll[0]:g}–{self.poll[1]:g} s, mirror {self.path})")
        return f"watching {self.git_dir} (local, inotify)"

    # --- subscribers --------------------------------------------------------
    def subscribe(self, room: str, agent_id: str, callback, every: bool = False):
        """New events of `room` that concern `agent_id` go to `callback` from a
        background thread, one call per batch (`every`: all events of the room but
        the agent's own, e.g. for a worker waiting for any task to become ready).
        Returns an unsubscribe function."""
        with self._lock:
            if self.remote and room not in self._seen_remote:
                self.sync([room])
            sub = _Sub(room, agent_id, callback, every)
            tip = self._tip(room)
            groups = self._subs.setdefault(room, {})
            groups.setdefault(tip, _Group(tip)).add(sub)

        def unsubscribe():
            with self._lock:
                sub.active = False
                groups = self._subs.get(room, {})
                group = sub.group
                if group is not None and groups.get(group.base) is group:
                    group.remove(sub)
                    if not group.subs:
                        del groups[group.base]
                if not groups:
                    self._subs.pop(room, None)
                    self._seen_remote.pop(room, None)  # no longer polled: forget its tip
        return unsubscribe

    def sync(self, rooms) -> None:
        """Remote: learn the hub's tips of `rooms` and fetch their commits now.
        Local: nothing to do."""
        if not self.remote:
            return
        tips = self._ls_remote(rooms)
        if any(oid not in self.store.repo for oid in tips.values()):
            self.store.refresh(force=True)
        self._seen_remote.update({r: tips.get(r, "") for r in rooms})

    def _tip(self, room: str) -> str:
        """A room's tip: the hub's own ref, or for a remote hub the tip it advertised
        (the mirror's ref may hold a local write the hub has not accepted yet)."""
        if self.remote:
            return self._seen_remote.get(room, "")
        return self.store.tip(self.store.room_ref(room))

    # --- running --------------------------------------------------------------
    def start(self, loop=None) -> "Notifier":
        """Watch (local) or poll (remote). With an asyncio `loop`, a local hub's
        events are read and scanned on that loop (its thread): call stop() there."""
        if self.remote:
            self._spawn(self._poll_loop, "gitdrop-poll")
        else:
            try:
                if loop is not None:
                    try:
                        self._observer = _LoopRefWatch(self.git_dir, self._scan_safely, loop)
                    except ImportError:   # no inotify here (macOS, say): watchdog's thread
                        pass
                if self._observer is None:
                    try:
                        self._observer = _RefWatch(self.git_dir, self._scan_safely)
                    except ImportError:   # watchdog before 7, or no inotify: its observer
                        self._observer = self._observe()
            except OSError as e:
                # No inotify instance or watch to be had (128 instances per user by
                # default: every wait, watch, autorespond and serve takes one), or no
                # descriptor: said once, and the hub's refs are looked at instead.
                sys.stderr.write(f"gitdrop: cannot watch {self.git_dir} for changes ({e}); "
                                 f"looking every {LOCAL_POLL:g} s instead (raise "
                                 "fs.inotify.max_user_instances or max_user_watches, or "
                                 "ulimit -n, to be woken at once)\n")
                self._spawn(self._local_poll, "gitdrop-local-poll")
        self._spawn(self._scan_loop, "gitdrop-notify")
        self._dirty.set()  # anything that landed between subscribe() and the watch
        return self

    def _observe(self):
        """watchdog's observer, for a watchdog without InotifyFD (before 7)."""
        from watchdog.events import (DirCreatedEvent, DirDeletedEvent, DirMovedEvent,
                                     FileClosedEvent, FileCreatedEvent,
                                     FileDeletedEvent, FileMovedEvent)
        from watchdog.observers import Observer
        # no open/close-nowrite events: our own reads of the refs must not wake us
        kinds = [FileCreatedEvent, FileMovedEvent, FileDeletedEvent, FileClosedEvent,
                 DirCreatedEvent, DirMovedEvent, DirDeletedEvent]
        refs = os.path.join(self.git_dir, "refs")
        handler = _RefHandler(refs, self._scan_safely)
        obs = Observer()
        obs.schedule(handler, refs, recursive=True, event_filter=kinds)
        obs.schedule(handler, self.git_dir, recursive=False, event_filter=kinds)
        obs.start()
        return obs

    def stop(self) -> None:
        self._stop.set()
        self._dirty.set()
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(2)
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(2)
        self._threads.clear()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def _spawn(self, fn, name):
        t = threading.Thread(target=fn, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def _local_poll(self) -> None:
        """A scan every LOCAL_POLL seconds, where the refs cannot be watched."""
        while not self._stop.wait(LOCAL_POLL):
            self._dirty.set()

    def _scan_loop(self) -> None:
        """Scans on request (start, retries) and, locally, every SAFETY seconds."""
        retry = 0.05
        while not self._stop.is_set():
            self._dirty.wait(None if self.remote else SAFETY)
            self._dirty.clear()
            if self._stop.is_set():
                return
            if self._scan_safely():
                retry = 0.05
            else:  # again soon, then less and less often
                self._stop.wait(retry)
                retry = min(retry * 2, SAFETY)
                self._dirty.set()

    def _scan_safely(self) -> bool:
        try:
            self.scan()
            return True
        except Exception as e:  # read mid-repack, say: the scan loop tries again
            sys.stderr.write(f"gitdrop: notifier scan failed ({type(e).__name__}: {e})\n")
            self._dirty.set()
            return False

    # --- the one computation: tips → events per subscriber -----------------------
    def scan(self) -> int:
        """Re-read the tips of the watched rooms and deliver what is new. Callbacks
        run under the lock, so batches reach each subscriber in commit order."""
        with self._lock:
            self.scans += 1
            deliveries, failed = [], None
            for room, groups in list(self._subs.items()):
                try:
                    deliveries += self._scan_room(room, groups)
                except Exception as e:  # that room keeps its bases; the others go on
                    failed = e
            for sub, evs in deliveries:
                if sub.active:
                    try:
                        sub.callback(evs)
                    except Exception as e:
                        sys.stderr.write(f"gitdrop: a notifier callback failed ({e!r})\n")
            if failed is not None:
                raise failed
            return len(deliveries)

    def _say_gone(self, room: str) -> None:
        """Say once, where it is sure, why nothing can come for a room: the hub is
        gone (deleted, moved) or the room was archived. Watchers waited in silence."""
        if self.remote or room in self._said_gone:
            return
        if not os.path.isdir(os.path.join(self.git_dir, "objects")):
            why = f"the hub at {self.shown} is gone (deleted or moved)"
        elif self.store.tip(model.ARCHIVE_PREFIX + room):
            why = f"room {room} was archived (gitdrop room restore {room} brings it back)"
        else:
            return   # destroyed, or packed-refs read while it was rewritten
        self._said_gone.add(room)
        sys.stderr.write(f"gitdrop: nothing can arrive from room {room}: {why}; still "
                         "watching, in case it comes back\n")
        sys.stderr.flush()

    def _behind(self, tip: str, bases) -> bool:
        """Whether one of `bases` is an ancestor of `tip` (its ref moved on, not rewritten)."""
        return any(self._descends(tip, base) for base in bases)

    def _descends(self, later: str, earlier: str) -> bool:
        repo = getattr(self.store, "repo", None)
        if repo is None:
            return False
        import pygit2   # loaded already by the store that has a repo
        try:
            return repo.descendant_of(later, earlier)
        except (KeyError, ValueError, pygit2.GitError):
            return False

    def _scan_room(self, room, groups):
        reader = self.store.reader
        tip = self._tip(room)
        if not tip:  # archived, or read mid-rewrite of packed-refs: keep the bases
            self._say_gone(room)
            return []
        self._said_gone.discard(room)
        pending = [g for base, g in groups.items() if base != tip]
        if not pending:
            return []
        bases = {g.base for g in pending}
        walked, found, cap = [], {}, WALK_CAP
        for c in first_parent_walk(reader, tip):
            if c.oid in bases:
                found[c.oid] = len(walked)
                if len(found) == len(bases):
                    break
            walked.append(c)
            if len(walked) >= cap:
                if cap == WALK_CAP and self._behind(tip, bases - set(found)):
                    cap = BEHIND_CAP
                    continue
                break
        for base in bases - set(found):
            if self._descends(base, tip):
                # The ref was moved back (a restore from a backup): what is below
                # the tip now was announced before, so nothing is announced again.
                found[base] = 0
        # Whether a subscriber leads reads its agent file, which every cursor move
        # rewrites: it is asked only by an event that could reach it as a lead.
        view = []   # the tip's view, made on that first question

        def tip_view():
            if not view:
                view.append(self.store.view(room, tip))
            return view[0]

        def is_lead(agent):
            return tip_view().is_lead(agent)

        def caps_of(agent):
            me = tip_view().agent(agent)
            return me["caps"] if me else []
        leads = functools.cache(lambda: set(tip_view().room.get("leads", {}).values()))
        got, asks = {}, {}   # asks: per subscriber, is_lead and caps_of, each asked once
        for g in pending:
            for c in reversed(walked[:found.get(g.base, len(walked))]):
                ev = events.event(reader, c, copy=False)  # worked out once per commit
                for s in g.every:
                    if c.author != s.agent:
                        got.setdefault(s, []).append(dict(ev, via="room", room=room))
                for s in g.candidates(ev, leads):
                    if c.author == s.agent:
                        continue
                    if s not in asks:
                        asks[s] = (_Once(is_lead, s.agent), _Once(caps_of, s.agent))
                    how = events.concerns(ev, s.agent, *asks[s])
                    if how:
                        got.setdefault(s, []).append(dict(ev, via=how, room=room))
        # Only once all is worked out (a failure retries, loses nothing): each group
        # has now seen the tip, joining the one already there, if any.
        for g in pending:
            del groups[g.base]
            there = groups.get(tip)
            if there is None:
                g.base, groups[tip] = tip, g
            else:
                small, big = sorted((g, there), key=lambda x: len(x.subs))
                for s in list(small.subs):
                    big.add(s)
                big.base, groups[tip] = tip, big
        return list(got.items())

    # --- remote hubs ---------------------------------------------------------
    def _ls_remote(self, rooms) -> dict[str, str]:
        from .transports.remote import Unreachable, _reach_fix, remote_timeout, run_git
        refs = [self.store.room_ref(r) for r in rooms]
        p = run_git(("ls-remote", self.hub, *refs), _git_env(), remote_timeout(), self.hub)
        if p.returncode != 0:
            raise Unreachable(f"cannot reach the hub {self.shown}: {p.stderr.strip()[-300:]}",
                              _reach_fix(p.stderr, self.hub))
        tips = {}
        for line in p.stdout.splitlines():
            oid, _, ref = line.partition("\t")
            if ref in refs:
                tips[ref[len(model.ROOM_PREFIX):]] = oid
        return tips

    def _poll_loop(self) -> None:
        self.interval = self.poll[0]
        while not self._stop.wait(self.interval):
            with self._lock:
                rooms = list(self._subs)
            changed = False
            try:
                tips = self._ls_remote(rooms) if rooms else {}
                moved = {r: tips.get(r, "") for r in rooms
                         if tips.get(r, "") != self._seen_remote.get(r, "")}
                if moved:
                    with self._lock:
                        missing = any(oid and oid not in self.store.repo
                                      for oid in moved.values())
                    if missing:
                        self.store.refresh(force=True)
                    with self._lock:
                        self._seen_remote.update(moved)
                    changed = True
            except GitdropError as e:
                sys.stderr.write(f"gitdrop: {e.reason}\n")
            if changed:
                self._scan_safely()
                self.interval = self.poll[0]
            else:
                self.interval = min(self.interval * 2, self.poll[1])


# --- faces: `gitdrop watch` and `gitdrop wait` ------------------------------------
def _open(hub: str, room: str, agent: str):
    from .opener import open_hub
    n = Notifier(hub or default_hub())
    n.sync([room])
    r = open_hub(n.hub, create=False).room(room)  # NotFound with a hint
    agent = r.resolve(agent or os.environ.get("GITDROP_AGENT", ""))
    return n, r, agent


def _say(text: str) -> None:
    sys.stderr.write(f"gitdrop: {text}\n")
    sys.stderr.flush()


def _one_line(text: str) -> str:
    return fmt.shown(" ".join(str(text).split()))


def event_line(ev: dict) -> str:
    ts = fmt.stamp(ev["time"], "%H:%M:%S", local=True)
    return f"{ts} {ev['room']} [{ev['via']}] {_one_line(events.summary(ev))}"


def _ids(label: str, ids) -> str:
    return f"{label}{'s' if len(ids) > 1 else ''} {', '.join(map(str, ids))}"


def summarize(w: dict) -> str:
    """One line of what waits: "3 unread messages from juno, spartan; task 12 assigned to you"."""
    parts = []
    msgs = [e for e in w["unread"] if e["op"] == "send"]
    if msgs:
        senders = list(dict.fromkeys(model.short(e["from"]) for e in msgs))
        parts.append(f"{len(msgs)} unread message{'s' if len(msgs) > 1 else ''} "
                     f"from {', '.join(senders)}")
    listed = {str(t) for t in w["tasks"] + w["reviews"]}
    shown_hs = {str(h) for h in w["handshakes"]}
    notices = [e for e in w["unread"] if e["op"] != "send" and not
               (e.get("task") and e["task"] in listed) and not
               (e.get("handshake") and e["handshake"] in shown_hs)]
    if len(notices) == 1:
        parts.append(f"notice: {_one_line(notices[0]['subject'])}")
    elif notices:
        parts.append(f"{len(notices)} unread notices")
    if w["tasks"]:
        parts.append(_ids("task", w["tasks"]) + " assigned to you")
    if w["reviews"]:
        parts.append(_ids("task", w["reviews"]) + " waiting for your review")
    if w["handshakes"]:
        parts.append(_ids("handshake", w["handshakes"]) + " waiting for your ack")
    if w.get("ready"):
        parts.append(_ids("task", w["ready"]) + " ready for you to take")
    return "; ".join(parts)


def _sorted_ids(ids):
    return sorted(ids, key=lambda x: (0, int(x)) if str(x).isdigit() else (1, str(x)))


def _alert(w: dict, as_json: bool) -> str:
    w = dict(w, tasks=_sorted_ids(w["tasks"]), reviews=_sorted_ids(w["reviews"]),
             ready=_sorted_ids(w.get("ready", [])))
    summary = summarize(w)
    step = _next_step(w)
    line = (f"gitdrop: work waiting for {w['agent']} in {w['room']}: {summary} "
            f"(next: {step})")
    if not as_json:
        return line
    return fmt.json_line({"ok": True, "alert": line, "summary": summary, "agent": w["agent"],
                          "room": w["room"], "tip": w["tip"], "unread": len(w["unread"]),
                          "events": w["unread"], "tasks": w["tasks"], "reviews": w["reviews"],
                          "handshakes": w["handshakes"], "ready": w["ready"]})


def _next_step(w: dict) -> str:
    """The command that acts on the first of what waits. "gitdrop inbox" whatever
    waited: with the inbox read and a task left, an agent that followed it woke,
    read nothing, and was told the same again, for ever."""
    if w["unread"]:
        return "gitdrop inbox"
    for what in ("tasks", "reviews"):
        if w[what]:
            return f"gitdrop task show {w[what][0]}"
    if w["handshakes"]:
        return f"gitdrop handshake status {w['handshakes'][0]}"
    return "gitdrop ready --claim"


def _has_work(w: dict) -> bool:
    """`ready` holds only tasks that became ready while waiting (see run_wait)."""
    return bool(w["unread"] or w["tasks"] or w["reviews"] or w["handshakes"] or
                w.get("ready"))


def run_wait(hub: str, room: str, agent: str, timeout: float | None, as_json: bool) -> int:
    """`gitdrop wait`: 0 with an alert as soon as something waits for the agent
    (at once if it already does), or a task it may take becomes ready while it
    waits; TIMEOUT_EXIT (124) after `timeout` seconds."""
    n = None
    try:
        n, r, agent = _open(hub, room, agent)
        done = threading.Event()
        lock = threading.Lock()  # one alert, and one thread at a time on `r`
        # The tasks ready when the wait begins do not end it (an agent that takes
        # none would never wait); one that becomes ready, or ready again, does.
        seen: set = set()
        ready_at = [0]   # when a retry's backoff frees a task (the hub's clock)
        wake = threading.Event()   # the alert is out, or ready_at changed

        def check() -> bool:
            with lock:
                if done.is_set():
                    return True
                w = r.waiting(agent)
                now_ready = w["ready"]
                w["ready"] = [t for t in now_ready if t not in seen]
                seen.clear()
                seen.update(now_ready)
                if ready_at[0] != w["ready_at"]:
                    ready_at[0] = w["ready_at"]
                    wake.set()
                if _has_work(w):
                    print(_alert(w, as_json), flush=True)
                    done.set()
                    wake.set()
                return done.is_set()

        def task_moved(evs) -> None:
            if any(e["op"].startswith("task-") for e in evs):
                check()
        w = r.waiting(agent)
        seen.update(w["ready"])
        if _has_work(dict(w, ready=[])):
            print(_alert(dict(w, ready=[]), as_json), flush=True)
            return 0
        # subscribed first, checked again second: what lands in between is in the
        # check or in the first scan after start(); the alert is printed from the
        # notifier's thread (one thread hop less). A task becomes ready for anyone
        # able without a notice to each (a new unassigned task, a release, an edit
        # of what it waits on): every task event of the room is looked at.
        n.subscribe(room, agent, lambda evs: check())
        n.subscribe(room, agent, task_moved, every=True)
        if check():
            return 0
        n.start()
        _say(f"{n.describe()}; waiting for {agent} in {room}"
             + ("" if timeout is None else f" (timeout {timeout:g} s)"))
        end = None if timeout is None else time.monotonic() + max(timeout, 0)
        while not done.is_set():
            left = None if end is None else max(end - time.monotonic(), 0)
            if ready_at[0]:   # a backoff runs out: no commit says so
                due = max(ready_at[0] - r.clock(), 0) + 0.05
                left = due if left is None else min(left, due)
            if wake.wait(left):
                wake.clear()
                continue
            if end is not None and time.monotonic() >= end:
                break
            check()
        with lock:
            if done.is_set():
                return 0
            done.set()  # no alert after the timeout is reported
        _say(f"nothing for {agent} in {room} after {timeout:g} s")
        if as_json:   # one document says so, like every --json that does not succeed
            print(fmt.json_line({
                "ok": False, "exit_code": TIMEOUT_EXIT, "error": "timeout", "rule": "timeout",
                "reason": f"nothing waited for {agent} in {room} within {timeout:g} s",
                "fix": "wait again (gitdrop wait --timeout S), or look now (gitdrop inbox "
                       "--peek)", "commit": "", "agent": agent, "room": room,
                "timeout": timeout}), flush=True)
        return TIMEOUT_EXIT
    except GitdropError as e:
        if as_json:
            print(fmt.json_line(dict({"ok": False, "exit_code": e.exit_code}, **e.to_dict())),
                  flush=True)
        sys.stderr.write(e.render() + "\n")
        return e.exit_code
    except KeyboardInterrupt:
        return INTERRUPT_EXIT
    finally:
        if n is not None:
            n.stop()


def run_watch(hub: str, room: str, agent: str, as_json: bool) -> int:
    """`gitdrop watch`: one line per new event for the agent (JSON with as_json)
    until interrupted; Ctrl-C exits 0."""
    n = None
    try:
        n, r, agent = _open(hub, room, agent)
        done = threading.Event()
        lock = threading.Lock()

        def show(evs):
            with lock:
                try:
                    for ev in evs:
                        sys.stdout.write((fmt.json_line(ev) if as_json
                                          else event_line(ev)) + "\n")
                    sys.stdout.flush()
                except (BrokenPipeError, ValueError):  # the reader went away
                    done.set()
        n.subscribe(room, agent, show)
        n.start()
        _say(f"{n.describe()}; streaming events for {agent} in {room} (Ctrl-C to stop)")
        while not done.wait(3600):
            pass
        return 0
    except GitdropError as e:
        sys.stderr.write(e.render() + "\n")
        return e.exit_code
    except KeyboardInterrupt:
        return 0
    finally:
        if n is not None:
            n.stop()


def main(argv=None) -> int:
    """`python -m gitdrop.notifier watch|wait --as A [--room R] [--hub H] ...`"""
    import argparse
    p = argparse.ArgumentParser(prog="python -m gitdrop.notifier")
    p.add_argument("command", choices=["watch", "wait"])
    p.add_argument("--hub", default=os.environ.get("GITDROP_HUB", ""))
    p.add_argument("--room", default=os.environ.get("GITDROP_ROOM", "lobby"))
    p.add_argument("--as", dest="agent", default=os.environ.get("GITDROP_AGENT", ""))
    p.add_argument("--timeout", type=float, default=None)
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    if a.command == "watch":
        return run_watch(a.hub, a.room, a.agent, a.json)
    return run_wait(a.hub, a.room, a.agent, a.timeout, a.json)


if __name__ == "__main__":
    sys.exit(main())
