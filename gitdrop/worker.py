"""The worker loop: claim the best ready task, run a handler on it, hand in the result.

    from gitdrop import Worker
    def handler(task, ctx):            # task: its fields, body, and inputs: {id: what
                                       # each task it waited on handed in}
        return "what I did"            # -> submitted (or completed, if review = false)
    Worker("~/.gitdrop/hub.git", "lobby", "core/w1", handler, caps=["db"]).run()

- claims with Room.claim_next (its own assigned tasks first, then the best ready one
  matching its tags), starts it, and renews the lease while the handler runs;
- a handler's exception fails the attempt: the task is released with a retry counted
  and a backoff (not_before), or failed once max_retries are used up;
- SIGTERM or SIGINT (or stop()) releases the task being worked on, counting nothing;
- a task it cannot start (a handshake not at GO), or whose result it could neither
  hand in nor give back, is passed over for a while, longer each time: it would
  otherwise come straight back, round after round; such a round is not work for
  `idle`, and a task whose result was lost is given back, not run again. A
  cross-team task that a lead or its creator assigned to the agent, waiting for its
  leads' sign-offs, is kept (they sign an assigned task, and are told of it), its
  lease renewed, passed over the same way and looked at again as soon as a lead
  signs; one that crosses teams only because this worker claimed it is given back,
  and claimed again only once assigned to the agent;
- the notes it writes are cut to fit the room's max_file and max_message, saying so,
  with their control characters (a colour, a backspace) written as escapes;
- a task it has in progress when it starts (an earlier run of it died mid-task) is
  given back as a failed attempt, so that it is retried rather than held forever;
  with a `ledger` (gitdrop work's), one another live worker of the agent is on is
  left to it, and passed over;
- between tasks it sleeps on the notifier (any commit in the room wakes it), with a
  timer only for what time alone changes: a backoff running out, a lease expiring.
  Expired leases in the room are reaped by the worker itself.
"""

import contextlib
import math
import os
import signal
import threading
import time
import traceback

from . import machine
from .errors import GitdropError, Refusal
from .view import render_file

BACKOFF = 10.0          # seconds before a failed task is offered again, doubled per retry
MAX_BACKOFF = 3600.0
MAX_PAUSE = 60.0        # seconds between rounds at most, while each ends in an error
MOVE_ROOM = 100         # bytes a move may add to a task's file besides the note


class Failed(Exception):
    """A handler's failure told in its own words (no exception type in the note)."""


class Stop(BaseException):
    """Raised in the handler's thread when the worker is told to stop."""


class TaskContext:
    """What a handler gets besides the task: follow-ups, questions, progress."""

    def __init__(self, worker: "Worker", task: dict):
        self.worker, self.task = worker, task
        self.room, self.agent = worker.room, worker.agent

    def create_task(self, title: str, **kw) -> dict:
        """A follow-up task (a chain): its parent is this task unless told."""
        kw.setdefault("parent", str(self.task["id"]))
        return self.room.create_task(self.agent, title, **kw)

    def ask(self, question: str, timeout: float | None = None) -> str:
        """Ask the task's creator (or a person) and wait for the answer: the task waits
        in feedback meanwhile. Returns the answer; raises TimeoutError."""
        tid = str(self.task["id"])
        self.room.move_task(self.agent, tid, "ask", question=question, note=question)
        return wait_for_answer(self.worker.hub_spec, self.room, tid, timeout,
                               self.worker._stopping)

    def say(self, text: str) -> None:
        """A progress note as the agent's status line (others see it in who)."""
        self.room.set_status(self.agent, text[:200])


def wait_for_answer(hub_spec, room, tid: str, timeout=None, stopping=None) -> str:
    """Block until task `tid` has left feedback; its answer. On the notifier."""
    from .notifier import Notifier
    moved = threading.Event()
    n = Notifier(hub_spec)
    n.subscribe(room.name, "", lambda evs: moved.set(), every=True)
    n.start()
    try:
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            t = room.task(tid)
            if t["state"] != "feedback":
                return t["answer"]
            if stopping is not None and stopping.is_set():
                raise Stop()
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(f"task {tid}: no answer within {timeout:g} s")
            moved.wait(min(left, 5.0) if left is not None else 5.0)
            moved.clear()
    finally:
        n.stop()


class Alone:
    """The ledger of a worker told of no other worker of its agent outside this
    program: every task of the agent in progress before it took one, that no Worker
    of the agent in this program is on, is an earlier run's (sure: given back at
    once). A ledger shared by the workers of an agent on this machine
    (gitdrop.cli.work.Ledger) says which tasks others are on, and which were left by
    workers known dead; one it cannot place may be another machine's."""

    sure = True   # what others() does not list is left by a dead run
    _on: dict = {}   # (hub, room, agent) -> {id of a ledger: the task its worker is on}
    _guard = threading.Lock()

    def __init__(self, key: tuple = ()):
        self.key = key

    def claiming(self):
        """Held while the worker claims a task and holds it (a lock the workers share)."""
        return contextlib.nullcontext()

    def others(self) -> dict:
        """{task: pid} of the agent's other live workers (here: of this program; two
        Workers of one agent in it gave back each other's task, and a result was lost)."""
        with self._guard:
            return {t: os.getpid() for k, t in self._on.get(self.key, {}).items()
                    if k != id(self) and t}

    def hold(self, tid: str) -> None:
        """The task this worker is on now ("": none)."""
        with self._guard:
            mine = self._on.setdefault(self.key, {})
            if tid:
                mine[id(self)] = tid
            else:
                mine.pop(id(self), None)

    def end_left(self) -> list:
        """[(pid ended or 0, task)] of the agent's workers gone, their programs ended."""
        return []


class Worker:
    def __init__(self, hub, room: str, agent: str, handler, caps=None, tags=(),
                 backoff: float = BACKOFF, idle: float | None = None, on_event=None,
                 ledger=None):
        """`hub`: a Hub, or a path or git URL. `caps`: declared on start (None: keep
        the agent's). `tags`: only tasks with one of them. `idle`: run() returns after
        that many seconds with nothing ready (None: never), counted from when the
        last task it failed may be taken again. `on_event(dict)`: told of
        every step (claimed, started, done, failed, released, lost: the task was moved
        by someone else meanwhile, held: it could neither hand in nor give back the
        task, or keeps a task assigned to it that waits for sign-offs, reaped, error: a
        round lost to a busy room or a refusal, idle, stopped, busy: a task in
        progress another worker of the agent is on, left to it).
        `ledger`: what the agent's workers on this machine are on (see Alone)."""
        from .opener import open_hub
        self.hub = open_hub(hub, create=False) if isinstance(hub, str) else hub
        self.hub_spec = hub if isinstance(hub, str) else self.hub.path
        self.room = self.hub.room(room)
        self.agent = agent
        self.handler = handler
        self.caps = None if caps is None else list(caps)
        self.tags = [t for t in tags if t]
        self.backoff, self.idle = backoff, idle
        self.on_event = on_event or (lambda ev: None)
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self.current = ""
        self._in_handler = False
        self._ready_once = False
        self._held = {}   # task id -> (monotonic end, times): passed over until then
        # Cross-team tasks without their sign-offs: assigned to the agent by a lead or
        # their creator, kept (id -> [the sign-offs it had, when it renewed them]);
        # claimed by this worker, given back and not claimed again unless assigned to it.
        self._signing: dict = {}
        self._crossed: set = set()
        # Tasks it failed, backing off -> when they may be taken again: --idle waits for
        # them (a worker that gave a killed run's task back stopped before running it).
        self._retrying: dict = {}
        self.ledger = ledger or Alone((self.room.store.path, room, agent))
        self._left_seen = False
        self._suspects: dict = {}   # task -> (lease_until seen, when to give it back)
        self._elsewhere: set = set()   # tasks another live worker of the agent is on

    # --- one task ------------------------------------------------------------
    def _prepare(self) -> None:
        if self._ready_once:
            return
        view = self.room.view()
        me = view.agent(self.agent)
        if me is None or (self.caps is not None and me["caps"] != self.caps):
            r = self.room.register(self.agent, (), "", caps=self.caps)
            if me is None:   # said: a typo in --as made a new agent without a word
                self._emit("registered", {}, agent=r.get("agent", self.agent))
        self._ready_once = True

    def _give_back_left(self, others: dict) -> None:
        """A task this agent has in progress before it took any, and no other live
        worker of it is on, is an earlier run's that died mid-task (killed, crashed).
        Nobody would ever finish it: this worker only takes assigned and pending
        tasks, and its acts keep the lease alive, so no one reaps it either. Count the
        lost attempt as a failed one, as a reap does. After the first round, only the
        tasks of the agent's workers found dead since (their programs ended first):
        claim_next offers the agent's own task in progress first, and this worker ran
        a killed sibling's task again beside the program it had left running."""
        left = self.ledger.end_left()
        for pid, _task in left:
            if pid:
                self._emit("orphan", {"id": _task}, pid=pid)
        dead = {t for _pid, t in left if t}
        if self._left_seen:
            todo = dead
        else:
            todo = None   # all of them, this once
            self._left_seen = True
        for t in self.room.list_tasks(state="in_progress", assignee=self.agent):
            tid = str(t["id"])
            if todo is not None and tid not in todo:
                continue
            if tid in others:
                self._emit("busy", t, pid=others[tid])
                continue
            if tid in dead or getattr(self.ledger, "sure", False):   # its run is over
                self._failed(t, "the worker restarted: an earlier run of it died mid-task")
            elif tid not in self._elsewhere:
                # No worker of this machine's ledger is on it, and none is known dead:
                # another machine's, or a Worker of this agent elsewhere in this
                # program, may be (given back at once, its result was thrown away).
                # Its renewer moves lease_until within `every`: given back only if not.
                self._suspects.setdefault(tid, (t["lease_until"], time.monotonic() +
                                                2 * _renew_every(self.room) + 1))
        self._judge_suspects()

    def _judge_suspects(self) -> None:
        """Each task suspected of being left: renewed since (a live worker is on it),
        left to that worker; not renewed in twice a renewer's time, given back."""
        now = time.monotonic()
        for tid, (seen, deadline) in list(self._suspects.items()):
            t = self.room.task(tid)
            if t["state"] != "in_progress" or t["assignee"] != self.agent:
                del self._suspects[tid]
            elif t["lease_until"] != seen:
                del self._suspects[tid]
                self._elsewhere.add(tid)
                self._emit("busy", t, pid=0)
            elif now >= deadline:
                del self._suspects[tid]
                self._failed(t, "the worker restarted: an earlier run of it died mid-task "
                             "(its lease was not renewed since)")

    def run_once(self) -> dict | None:
        """Take one task and see it through; None when nothing is ready."""
        self._prepare()
        with self.ledger.claiming():   # no other worker of the agent looks meanwhile
            others = self.ledger.others()
            self._give_back_left(others)
            self._signed_since()
            now = time.monotonic()
            got = self.room.claim_next(self.agent, tag=",".join(self.tags), skip=[
                *(t for t, (end, _n) in self._held.items() if end > now), *others,
                *self._suspects, *self._elsewhere, *self._crossed])
            tid = got["task"]
            if not tid:
                return None
            self.ledger.hold(tid)
            self._retrying.pop(tid, None)
        try:
            return self._see_through(tid, got.get("claimed", False))
        finally:
            self.current = ""
            self.ledger.hold("")

    def _signed_since(self) -> None:
        """A task kept for its sign-offs is looked at again as soon as they change
        (a lead signed), and its lease renewed while it waits (else its own worker
        reaped it, a retry counted and the sign-offs gone); one no longer ours is
        forgotten. A task given back for want of them is claimed again only once
        assigned to the agent (a lead's choice of who does it across teams)."""
        if not (self._signing or self._crossed):
            return
        view = self.room.view()   # each task's file alone: no dependencies asked

        def header(tid):
            doc = view.task(tid)
            return doc[0] if doc else None
        for tid in list(self._crossed):
            t = header(tid)
            if t is None or t["state"] != "pending":
                self._crossed.discard(tid)   # assigned to it (claimed next), or gone
                self._held.pop(tid, None)
        every, now = _renew_every(self.room), time.monotonic()
        for tid, (seen, renewed) in list(self._signing.items()):
            t = header(tid)
            if t is None or t["state"] != "assigned" or t["assignee"] != self.agent:
                del self._signing[tid]
                continue
            if t["signoffs"] != seen:
                self._held.pop(tid, None)
            if now - renewed >= every:
                self._renew_kept(tid, seen)

    def _renew_kept(self, tid: str, seen) -> None:
        try:
            self.room.move_task(self.agent, tid, "renew")
        except GitdropError:
            pass   # moved meanwhile: the next round sees it
        self._signing[tid] = [seen, time.monotonic()]

    def _see_through(self, tid: str, claimed: bool = False) -> dict:
        task = self.room.task(tid)
        if tid in self._held and task["state"] == "in_progress":
            # its result was lost: give it back as a failed attempt, do not run it again
            return self._failed(task, "the worker could neither hand in nor give back "
                                "its result")
        self._emit("claimed", task)
        self.current = tid
        if task["state"] == "assigned":
            try:
                self.room.move_task(self.agent, tid, "start")
            except Refusal as e:
                if e.rule == "dual-sign" and not claimed:
                    # Assigned to it: kept, for the leads sign an assigned task (given
                    # back, it could not be signed, and the sign-offs went with it).
                    if tid not in self._signing:
                        self._renew_kept(tid, task["signoffs"])
                    self._signing[tid][0] = task["signoffs"]
                    return self._emit("held", task, reason=e.reason, rule=e.rule,
                                      retry_in=self._hold(tid))
                why = f"cannot start yet: {e.reason}"
                if e.rule == "dual-sign":
                    # Its own claim made the need (an assignee of another team): given
                    # back, for an agent of the task's team to start it at once.
                    self._crossed.add(tid)
                    why += (f"; for {self.agent} to do it, a lead assigns it to it "
                            f"(gitdrop task assign {tid} {self.agent}) and they sign it")
                # (or it waits for a handshake at GO: given back, for whoever may start it)
                self._give_back(tid, why)
                return self._emit("released", task, reason=e.reason, rule=e.rule,
                                  retry_in=self._hold(tid))
            self._held.pop(tid, None)
            self._signing.pop(tid, None)
            task = self.room.task(tid)
        # what the tasks it waited on handed in: a pipeline's input
        task["inputs"] = {d: self.room.task(d)["note"] for d in task["after"]}
        self._emit("started", task)
        return self._run_handler(task)

    def _run_handler(self, task: dict) -> dict:
        tid = str(task["id"])
        renewer = _Renewer(self, tid)
        renewer.start()
        try:
            self._in_handler = True   # only here may a signal interrupt (not mid-write)
            try:
                if self._stopping.is_set():   # told to stop between the claim and now
                    raise Stop()
                result = self.handler(task, TaskContext(self, task))
            finally:
                self._in_handler = False
        except Stop:
            renewer.stop()
            self._give_back(tid, "the worker was stopped")
            self._emit("released", task, reason="stopped")
            raise
        except Exception as e:   # the attempt failed: retry later, or fail for good
            renewer.stop()
            return self._failed(task, _error_text(e))
        renewer.stop()
        note, extra = _note(result)
        note = self._fit(tid, note)
        move = machine.hand_in(task)
        try:
            r = self.room.move_task(self.agent, tid, move, note=note)
        except GitdropError as e:   # refused, or the room kept moving
            return self._failed(task, f"could not {move}: {getattr(e, 'reason', str(e))}")
        return self._emit("done", task, state=r["state"], note=note[:500], **extra)

    def _failed(self, task: dict, error: str) -> dict:
        tid = str(task["id"])
        fresh = self.room.task(tid)
        if fresh["state"] not in ("assigned", "in_progress") or fresh["assignee"] != self.agent:
            return self._emit("lost", task, state=fresh["state"], error=error[-500:])
        error = self._fit(tid, error)
        try:
            if fresh["retries"] < fresh["max_retries"]:
                # a backoff never past what the room allows (max_task_lease)
                most = self.room.view().settings["max_task_lease"]
                wait = math.ceil(min(self.backoff * (2 ** fresh["retries"]), MAX_BACKOFF, most))
                self.room.move_task(self.agent, tid, "release", note=error, failed=True,
                                    retry_in=wait)
                self._retrying[tid] = time.monotonic() + wait
                return self._emit("failed", task, error=error[-500:], retry_in=wait,
                                  retries=fresh["retries"] + 1)
            self.room.move_task(self.agent, tid, "fail", note=error)
        except GitdropError as e:
            after = self.room.task(tid)
            if after["state"] == fresh["state"] and after["assignee"] == self.agent:
                # still ours, and no move of it is accepted: claim_next would hand it
                # straight back, so pass it over for a while
                return self._emit("held", task, state=after["state"], error=error[-500:],
                                  reason=str(e)[:500], retry_in=self._hold(tid))
            # moved meanwhile (reaped, cancelled): not ours now
            return self._emit("lost", task, state=after["state"], error=error[-500:],
                              reason=str(e)[:500])
        return self._emit("failed", task, error=error[-500:], final=True,
                          retries=fresh["retries"])

    def _give_back(self, tid: str, why: str) -> None:
        try:
            t = self.room.task(tid)
            if t["state"] in machine.MOVES["release"][0] and t["assignee"] == self.agent:
                self.room.move_task(self.agent, tid, "release", note=self._fit(tid, why))
        except GitdropError:
            pass   # reaped or moved meanwhile: nothing of ours to give back

    def _hold(self, tid: str) -> int:
        """Pass task `tid` over for a while, twice as long each time (at least a
        second, even with no backoff); the seconds."""
        n = self._held.get(tid, (0.0, 0))[1]
        wait = math.ceil(min(max(self.backoff, 1.0) * 2 ** n, MAX_BACKOFF))
        self._held[tid] = (time.monotonic() + wait, n + 1)
        return wait

    def _fit(self, tid: str, note: str) -> str:
        """`note` cut to what the task's file (max_file) and a commit (max_message)
        can hold, saying so: with more, the move is refused and the task can be
        neither handed in nor given back. Its control characters as escapes: the
        rules refuse a note with one."""
        note = visible(note)
        view = self.room.view()
        doc, body = view.task(tid)
        s = view.settings

        def over(text: str) -> int:   # bytes past the room's limits
            size = len(render_file("task", dict(doc, note=text), body).encode(
                "utf-8", "surrogatepass"))
            return max(size + MOVE_ROOM - s["max_file"],
                       len(text.encode("utf-8", "surrogatepass")) - s["max_message"])
        cut, keep = note, len(note)
        while (past := over(cut)) > 0:
            if not keep:
                return ""
            keep = max(0, keep - past)
            cut = note[:keep] + (f"\n[... {len(note) - keep} more characters cut to fit the "
                                 "room's max_file; hand long output in as a file and its path]")
        return cut

    # --- the loop --------------------------------------------------------------
    def run(self) -> int:
        """Work until stopped (or idle for `idle` seconds); the number of tasks done."""
        self._prepare()   # who it is and where: a refusal here ends it, saying what to do
        done, errors = 0, 0
        old = self._signals()
        from .notifier import Notifier
        n = Notifier(self.hub_spec)
        n.subscribe(self.room.name, self.agent, lambda evs: self._wake.set(), every=True)
        n.start()
        idle_since = time.monotonic()
        try:
            while not self._stopping.is_set():
                self._wake.clear()
                pause = None
                try:
                    ev = self.run_once()
                    errors = 0
                except Stop:
                    break
                except GitdropError as e:   # a busy room, a refusal: a round lost, not the loop
                    self._emit("error", {}, error=str(e)[:500])
                    ev, pause = None, min(2.0 ** errors, MAX_PAUSE)
                    errors += 1
                if ev is not None:
                    done += ev["event"] == "done"
                    if ev["event"] not in ("released", "held"):   # passing a task over is no work
                        idle_since = time.monotonic()
                    continue
                if pause is None and self._reap():   # our own commits wake nobody: look again
                    continue
                since = max(idle_since, self._retry_wait())
                if self.idle is not None and time.monotonic() - since >= self.idle:
                    self._emit("idle", {}, seconds=self.idle)
                    break
                timeout = self._next_timer() if pause is None else min(self._next_timer(), pause)
                if self.idle is not None:
                    timeout = min(timeout, max(0.0, self.idle - (time.monotonic() - since)))
                self._wake.wait(timeout)
        finally:
            n.stop()
            restore_signals(old)
        self._emit("stopped", {}, done=done)
        return done

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()

    def _signals(self):
        def interrupt():
            if self._in_handler:     # interrupt the handler: its task is released
                raise Stop()
        return catch_stop_signals(self.stop, interrupt)

    def _retry_wait(self) -> float:
        """When the last task this worker failed, still backing off, may be taken
        again (monotonic), or 0: one done, taken or cancelled meanwhile is not waited
        for."""
        if self._retrying:
            view = self.room.view()
            for tid in list(self._retrying):
                doc = view.task(tid)
                if doc is None or doc[0]["state"] != "pending" or doc[0]["assignee"]:
                    del self._retrying[tid]
        return max(self._retrying.values(), default=0.0)

    def _reap(self) -> int:
        """Reap the room's expired leases; how many were reaped."""
        try:
            got = self.room.reap_leases(self.agent)
        except GitdropError:
            return 0
        for r in got:
            self._emit("reaped", {"id": r["task"], "title": ""}, state=r["state"])
        return len(got)

    def _next_timer(self) -> float:
        """Seconds until time alone changes what is ready: a backoff ends, a lease in
        the room expires (to reap it), a task passed over is looked at again, a kept
        task's lease is due to be renewed. At most 300: a long sleep re-checks."""
        now = self.room.clock()
        soon = now + 300
        for t in self.room.list_tasks(state="pending,assigned,in_progress"):
            if t["state"] == "pending" and t["not_before"] > now:
                soon = min(soon, t["not_before"])
            elif t["state"] != "pending" and t["assignee"] != self.agent:
                soon = min(soon, max(t["lease_until"], now + 1))
        mono = time.monotonic()
        every = _renew_every(self.room) if self._signing else 0
        held = min([end - mono for end, _n in self._held.values() if end > mono] +
                   [end - mono for _seen, end in self._suspects.values()] +
                   [renewed + every - mono for _seen, renewed in self._signing.values()],
                   default=300)
        return max(0.5, min(soon - now + 0.5, held + 0.1))

    def _emit(self, what: str, task: dict, **extra) -> dict:
        ev = dict({"event": what, "agent": self.agent, "room": self.room.name,
                   "task": str(task.get("id", "")), "title": task.get("title", ""),
                   "time": int(time.time())}, **extra)
        try:
            self.on_event(ev)
        except Exception:
            pass
        return ev


def catch_stop_signals(stop, then=None):
    """SIGTERM and SIGINT call stop() (then then(), which may raise to interrupt what
    the main thread is doing). Only the main thread can catch signals: elsewhere this
    does nothing. Returns what restore_signals() puts back."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def on_signal(signum, frame):
        stop()
        if then is not None:
            then()
    return {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}


def restore_signals(old) -> None:
    for s, h in (old or {}).items():
        signal.signal(s, h)


def _renew_every(room) -> float:
    return max(1.0, room.view().settings["task_lease"] / 3)


class _Renewer(threading.Thread):
    """Renews the lease of the task being worked on, at a third of the room's lease."""

    def __init__(self, worker: Worker, tid: str):
        super().__init__(daemon=True, name=f"gitdrop-renew-{tid}")
        self.worker, self.tid, self._done = worker, tid, threading.Event()
        self.every = _renew_every(worker.room)

    def run(self):
        while not self._done.wait(self.every):
            try:
                t = self.worker.room.task(self.tid)
                if t["state"] not in ("assigned", "in_progress"):
                    continue   # in feedback or blocked: no lease runs
                self.worker.room.move_task(self.worker.agent, self.tid, "renew")
            except GitdropError:
                continue

    def stop(self):
        self._done.set()


def _note(result) -> tuple[str, dict]:
    if result is None:
        return "done", {}
    if isinstance(result, dict):
        note = str(result.get("summary") or result.get("result") or "done")
        files = result.get("files_changed")
        if files:
            note += "\n\nFiles changed: " + ", ".join(files)
        return note, {}
    return str(result).strip() or "done", {}


# A control character but newline and tab, written as an escape (\x1b): the rules
# refuse a note holding one, and a colour in a program's output cost the result.
_ESCAPES = {c: f"\\x{c:02x}" for c in [*range(0, 9), *range(11, 32), 127]}


def visible(text: str) -> str:
    """`text` fit for a note: control characters (newline and tab aside) and lone
    surrogates as escapes, a CR before a newline dropped."""
    if text.isprintable() or text.replace("\n", "").replace("\t", "").isprintable():
        return text
    text = text.replace("\r\n", "\n").translate(_ESCAPES)
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _error_text(e: BaseException) -> str:
    if isinstance(e, Failed):
        return str(e)[-2000:] or "failed"
    tb = "".join(traceback.format_exception_only(type(e), e)).strip()
    return tb[-2000:] or type(e).__name__

