"""`gitdrop work`: the worker loop for any program (gitdrop/worker.py does the work)."""

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Annotated, Optional

import typer

from .base import Scope, ago, command, paint, split_list, sub_app, table
from .. import fmt
from ..errors import UsageError
from ..files import NOFOLLOW, write_whole

app = typer.Typer(add_completion=False)
feedback_app = sub_app("feedback", "Questions for people: what agents and workers asked "
                       "(gitdrop task ask), and answering them.")

RESULT_MAX = 12000     # characters of a command's stdout kept as the result
STDERR_TAIL = 2000     # characters of its stderr kept in a failure's note
# Characters of one GITDROP_TASK_* variable: Linux refuses to start a program with one
# past 128 KB (E2BIG), so a task waiting on a dozen long results failed every attempt.
ENV_MAX = 16000
STOP_GRACE = 2.0       # seconds the program and its children get to end on SIGTERM
OUTPUT_GRACE = 1.0     # seconds to read what is left of its output once its group has ended


def _env_text(text: str) -> str:
    if len(text) <= ENV_MAX:
        return text
    return text[:ENV_MAX] + (f"\n[... {len(text) - ENV_MAX} more characters: the whole "
                             "task is the JSON on stdin]")


def _hub_for_program(hub: str) -> str:
    """The hub as PROGRAM is told it: a path made absolute, for a program that works
    in another directory (its gitdrop calls, the guard's fetch) named nothing there."""
    from ..transports.remote import is_url
    return hub if is_url(hub) else os.path.abspath(os.path.expanduser(hub))


class Ledger:
    """What each `gitdrop work` of one agent, room and hub on this machine works on, a
    file each under ~/.gitdrop/work/: the worker (its pid and start time), its task
    and its program. A worker killed outright (-9, the OOM killer) leaves its program
    running, in a session of its own, and its task in progress: the next worker ends
    the one and gives back the other. A worker still alive is left alone: a second
    one of the agent ended the first's program and took its task for left behind.
    Claims are made under a lock the workers share, so that no task is between its
    claim and its record when another worker looks."""

    def __init__(self, hub: str, room: str, agent: str):
        import hashlib
        from ..combine import _me
        # the hub as a file, however it was spelled (a link to it, a relative path):
        # two spellings were two ledgers, and each worker took the other's task for left
        from ..transports.remote import is_url
        hub = hub if is_url(hub) else os.path.realpath(hub)
        key = hashlib.sha1(f"{hub}\0{room}\0{agent}".encode("utf-8", "surrogatepass"))
        self.key = key.hexdigest()[:16]
        self.dir = os.path.join(os.path.expanduser("~"), ".gitdrop", "work")
        self.me = _me()
        self.path = os.path.join(self.dir, f"{self.key}.{self.me[0]}.running")
        self.task, self.program = "", (0, 0)

    @contextlib.contextmanager
    def claiming(self):
        import fcntl
        try:
            os.makedirs(self.dir, mode=0o700, exist_ok=True)
            fd = os.open(os.path.join(self.dir, self.key + ".lock"),
                         os.O_RDWR | os.O_CREAT | NOFOLLOW, 0o600)
        except OSError:
            yield   # no lock to share: as a lone worker
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def hold(self, tid: str) -> None:
        """This worker's task now ("": none)."""
        self.task, self.program = tid, (0, 0)
        self._write()

    def running(self, pid: int) -> None:
        """Its program now (0: none)."""
        from ..combine import _start_time
        self.program = (pid, _start_time(pid)) if pid else (0, 0)
        self._write()

    def _write(self) -> None:
        try:
            if not self.task and not self.program[0]:
                os.unlink(self.path)
                return
            os.makedirs(self.dir, mode=0o700, exist_ok=True)
            write_whole(self.path, (f"{self.program[0]} {self.program[1]} {self.me[0]} "
                                    f"{self.me[1]} {self.task}\n").encode(), 0o600)
        except OSError:
            pass   # not kept: a kill -9 of this worker would leave the program running

    def _records(self):
        """(path, program, worker, task) of each other record of this agent. One
        written before workers were recorded names no worker: its worker is gone."""
        try:
            names = os.listdir(self.dir)
        except OSError:
            return
        for name in names:
            path = os.path.join(self.dir, name)
            if not name.startswith(self.key + ".") or not name.endswith(".running") or \
                    path == self.path:
                continue
            try:
                with open(path) as f:
                    words = f.read().split()
                nums = [int(x) for x in words[:4]] + [0] * (4 - len(words[:4]))
            except (OSError, ValueError):
                continue
            yield path, tuple(nums[:2]), tuple(nums[2:4]), " ".join(words[4:])

    def others(self) -> dict:
        """{task: pid} of the other workers of this agent alive and on a task."""
        return {task: worker[0] for _p, _prog, worker, task in self._records()
                if task and _worker_alive(*worker)}

    def end_left(self) -> list[tuple[int, str]]:
        """End the programs of workers gone (their whole process groups) and forget
        them; (the pid ended or 0, the task it was on) of each. Called with the
        claiming lock held (Worker.run_once, every round: a worker of the agent
        killed while this one runs left its program and its task too)."""
        ended = []
        for path, (pid, start), worker, task in self._records():
            if _worker_alive(*worker):
                continue   # its own worker ends it
            if pid > 0 and start > 0 and (_alive(pid, start) or _group_left(pid)):
                _end_pgid(pid)
            else:
                pid = 0
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            ended.append((pid, task))
        return ended

    def close(self) -> None:
        self.hold("")


def _worker_alive(pid: int, start: int) -> bool:
    """Whether a worker recorded is alive; where the system does not say when a
    process started, any process with its pid is taken for it."""
    from ..combine import _alive as alive
    return pid > 0 and alive(pid, start)


def _group_left(pgid: int) -> bool:
    """Whether process group `pgid` still has members though its leader is gone (a
    worker killed while it ended what its program left, in the 2 s grace). No new
    process is given a number a group still uses, so they are the program's."""
    from ..combine import _start_time
    if _start_time(pgid) != -1:
        return False   # a process has that number: the leader, or a later one
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _alive(pid: int, start: int) -> bool:
    """Whether `pid` is the process that started at `start` (not a later one with
    its number)."""
    from ..combine import _start_time
    return pid > 0 and start > 0 and _start_time(pid) == start


def shell_handler(argv: list[str], hub: str, room: str, agent: str, ledger: Ledger,
                  timeout: float | None = None):
    """Run `argv` per task: the task as JSON on stdin and in GITDROP_TASK_* variables;
    exit 0 hands in its stdout as the result, any other exit fails the attempt with
    the tail of its stderr, and so does a run past `timeout` seconds (the program and
    what it started are ended). Its program is kept in `ledger` while it runs."""
    from ..worker import Failed

    def handler(task: dict, ctx) -> str:
        env = dict(os.environ, GITDROP_HUB=hub, GITDROP_ROOM=room, GITDROP_AGENT=agent,
                   GITDROP_TASK_ID=str(task["id"]),
                   GITDROP_TASK_TITLE=_env_text(task["title"]),
                   GITDROP_TASK_BODY=_env_text(task.get("body", "")),
                   GITDROP_TASK_PRIORITY=str(task["priority"]),
                   GITDROP_TASK_TAGS=_env_text(",".join(task["tags"])),
                   GITDROP_TASK_CREATOR=task["creator"],
                   GITDROP_TASK_RETRIES=str(task["retries"]),
                   GITDROP_TASK_ANSWER=_env_text(task.get("answer", "")),
                   GITDROP_TASK_INPUT=_env_text("\n\n".join(task.get("inputs", {}).values())))
        try:   # a session of its own: a stop ends what it started too
            p = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, start_new_session=True)
        except OSError as e:
            raise Failed(f"cannot run {argv[0]}: {e}") from None
        ledger.running(p.pid)
        out, err = _Kept(head=RESULT_MAX * 4), _Kept(tail=STDERR_TAIL * 4)
        late = threading.Event()

        def too_long():   # the program is left unreaped (_exited): its group is its own
            late.set()
            _end_pgid(p.pid)
        timer = threading.Timer(timeout, too_long) if timeout else None
        if timer is not None:
            timer.daemon = True
            timer.start()
        try:
            _run(p, json.dumps(task, default=str).encode("utf-8", "surrogatepass"), out, err,
                 timer)
        except BaseException:   # stopped (SIGTERM, SIGINT): the task goes back to others
            _end_group(p)
            raise
        finally:
            if timer is not None:
                timer.cancel()
            ledger.running(0)
        if late.is_set():
            said = f"{argv[0]} ran past --timeout ({timeout:g} s) and was ended"
            tail = err.last(max(200, STDERR_TAIL - len(said) - 2))
            raise Failed(said + (f":\n{tail}" if tail else ""))
        if p.returncode != 0:
            said = f"{argv[0]} exited {p.returncode}"
            tail = err.last(max(200, STDERR_TAIL - len(said) - 2))   # the note keeps 2,000
            raise Failed(said + (f":\n{tail}" if tail else ""))
        return out.first(RESULT_MAX) or "done"
    return handler


class _Kept:
    """What is kept of one of a program's outputs as it is read: its first `head` and
    last `tail` bytes, and how many it had in all (a note holds a few thousand
    characters; the whole output, kept, cost the worker three times its size)."""

    def __init__(self, head: int = 0, tail: int = 0):
        self.head, self.tail, self.total = bytearray(), bytearray(), 0
        self._head, self._tail = head, tail

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self._head - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data and self._tail:
            self.tail += data[-self._tail:]
            del self.tail[:-self._tail]

    def first(self, chars: int) -> str:
        """Its start, stripped, at most `chars` characters, saying what was cut."""
        text = _text(self.head)
        whole = len(self.head) == self.total
        text = text.strip() if whole else text.lstrip()
        if whole and len(text) <= chars:
            return text
        return text[:chars] + (f"\n[... cut at {chars} characters: the output had "
                               f"{self.total} bytes]")

    def last(self, chars: int) -> str:
        """Its end, stripped, in `chars` characters at most, saying what was cut."""
        text = _text(self.head + self.tail).strip()
        if len(self.head) + len(self.tail) == self.total and len(text) <= chars:
            return text
        said = f"[... cut: {self.total} bytes in all, the last of them here]\n"
        return said + text[-max(0, chars - len(said)):]


def _text(data: bytes) -> str:
    # as text mode reads it: undecodable bytes replaced, every line break a newline
    return data.decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")


def _run(p: subprocess.Popen, given: bytes, out: _Kept, err: _Kept, timer=None) -> None:
    """Hand `given` to the program's stdin and read its stdout and stderr into `out`
    and `err` until it exits. Then what it left in its process group (a server
    started in the background) is ended: it would hold the output open, and the
    worker and the task's lease with it, as long as it ran."""
    done = threading.Event()
    pipes = [threading.Thread(target=_feed, args=(p.stdin, given), daemon=True),
             threading.Thread(target=_drain, args=(p.stdout, out, done), daemon=True),
             threading.Thread(target=_drain, args=(p.stderr, err, done), daemon=True)]
    for t in pipes:
        t.start()
    _exited(p)
    if timer is not None:
        timer.cancel()
        if timer.is_alive():   # ending the group already: let it finish first
            timer.join()
    _end_group(p)
    for t in pipes[1:]:   # a process outside its group (setsid) may still hold them
        t.join(OUTPUT_GRACE)
    done.set()   # then the readers stop, and their pipes are closed: a long-lived
    for t in pipes[1:]:   # worker kept a thread and two descriptors for every such task
        t.join(1.0)
    for pipe in (p.stdout, p.stderr):
        try:
            pipe.close()
        except OSError:
            pass


def _exited(p: subprocess.Popen) -> None:
    """Wait for the program to exit, leaving it unreaped where the system allows: its
    pid, and so its group's number, stays its own while the rest are ended."""
    if hasattr(os, "waitid"):
        try:
            os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOWAIT)
            return
        except ChildProcessError:
            pass
    p.wait()


def _feed(pipe, data: bytes) -> None:
    try:
        pipe.write(data)
    except OSError:
        pass   # the program did not read it all: its choice
    finally:
        try:
            pipe.close()
        except OSError:
            pass


def _drain(pipe, kept: _Kept, done: threading.Event) -> None:
    """Read `pipe` into `kept` until its end, or until `done` is set and nothing is
    waiting to be read."""
    import select
    fd = pipe.fileno()
    while True:
        ready = select.select([fd], [], [], 0.1)[0]
        if not ready:
            if done.is_set():
                return
            continue
        data = os.read(fd, 65536)
        if not data:
            return
        kept.add(data)


def _end_group(p: subprocess.Popen) -> None:
    """End the program and every process it started (its process group): SIGTERM,
    then SIGKILL for what is left after STOP_GRACE."""
    _end_pgid(p.pid, p.poll)
    p.wait()


def _end_pgid(pgid: int, reap=lambda: None) -> None:
    try:
        os.killpg(pgid, signal.SIGTERM)
        end = time.monotonic() + STOP_GRACE
        while True:
            reap()   # the program, once ended, leaves the group only when reaped
            os.killpg(pgid, 0)   # ProcessLookupError once none is left
            if time.monotonic() >= end:
                os.killpg(pgid, signal.SIGKILL)
                break
            time.sleep(0.05)
    except ProcessLookupError:
        pass


@command(app, "work", context_settings={"allow_interspersed_args": False})
def work(s: Scope,
         cmd: Annotated[list[str], typer.Argument(
             metavar="-- PROGRAM [ARGS]...", help="The program that does a task: the task "
             "as JSON on stdin and GITDROP_TASK_ID, _TITLE, _BODY, _TAGS, ... in its "
             "environment; exit 0 hands in its stdout, any other exit fails the attempt.",
             show_default=False)],
         cap: Annotated[Optional[list[str]], typer.Option(
             "--cap", help="Declare this capability (repeat, or a comma list).")] = None,
         tag: Annotated[Optional[list[str]], typer.Option(
             "--tag", help="Only tasks with this tag (repeat: any of them).")] = None,
         once: Annotated[bool, typer.Option("--once", help="One task at most, then exit.")] = False,
         idle: Annotated[Optional[float], typer.Option(
             "--idle", metavar="SECONDS", min=0, help="Exit after this long with nothing ready "
             "(default: wait for work forever).", show_default=False)] = None,
         backoff: Annotated[float, typer.Option(
             "--backoff", metavar="SECONDS", min=0, help="Before a failed task is offered again, "
             "or one it cannot start is looked at again; doubles each time.")] = 10.0,
         timeout: Annotated[Optional[float], typer.Option(
             "--timeout", metavar="SECONDS", min=0.001, help="End PROGRAM (and what it "
             "started) after this long on one task: a failed attempt (default: no limit).",
             show_default=False)] = None):
    """Work tasks with a program, one at a time: claim the best ready task, run PROGRAM,
    submit its output (or complete it, for a task without review), or on failure give it
    back to be retried after a backoff (failed once its retries are used up). Sleeps on
    the notifier between tasks; SIGTERM gives the current task back and ends PROGRAM
    with every process it started."""
    from ..worker import Worker
    if not cmd:
        raise UsageError("no command given", "gitdrop work --as A -- ./handler.sh")
    for name, value in (("--idle", idle), ("--backoff", backoff), ("--timeout", timeout)):
        if value is not None and not (math.isfinite(value) and value < 10 ** 9):
            raise UsageError(f"{name} {value} is not a number of seconds",
                             f"give {name} a finite number of seconds (under 10^9)")
    agent = s.agent
    hub = _hub_for_program(s.hub_value) if s.hub_value else s.hub.path
    caps = split_list(cap) if cap is not None else None
    started = {}

    def show(ev):
        if s.json:
            print(fmt.json_line(ev, default=str), flush=True)
            return
        what, tid = ev["event"], ev["task"]
        if what == "started":
            started[tid] = time.monotonic()
        took = f" in {time.monotonic() - started.pop(tid):.1f} s" if tid in started and \
            what in ("done", "failed", "released", "lost", "held") else ""
        line = {
            "claimed": f"task {tid}: claimed · {fmt.shown(ev.get('title', ''))}",
            "done": f"task {tid}: {paint('done', 'green')} → {ev.get('state')}{took}",
            "failed": f"task {tid}: {paint('failed', 'red')}{took}: "
                      f"{' '.join(ev.get('error', '').split())[:120]}"
                      + (" (final)" if ev.get("final") else
                         f" (retry {ev.get('retries')} in {ev.get('retry_in')} s)"),
            "released": f"task {tid}: released ({ev.get('reason', '')[:100]})"
                        + (f"; passed over for {ev['retry_in']} s" if ev.get("retry_in") else ""),
            "lost": f"task {tid}: taken from us meanwhile ({ev.get('state')})",
            "held": f"task {tid}: {paint('could neither hand it in nor give it back', 'red')}: "
                    f"{' '.join(ev.get('reason', '').split())[:160]}; passed over for "
                    f"{ev.get('retry_in')} s",
            "busy": f"task {tid}: another worker of {agent} is on it "
                    + (f"(pid {ev['pid']})" if ev.get("pid") else "(elsewhere: it renews the "
                       "task's lease)") + "; left to it",
            "orphan": f"task {tid}: ended the program a killed worker left running "
                      f"(pid {ev.get('pid')})",
            "reaped": f"task {tid}: reaped (its holder's lease expired)",
            "error": f"{' '.join(ev.get('error', '').split())[:160]}; trying again",
            "idle": f"nothing ready for {agent} for {ev.get('seconds', 0):g} s; stopping",
            "stopped": f"{agent} stopped after {ev.get('done', 0)} task(s)",
            "registered": f"{ev.get('agent', agent)} was not registered in {s.room_name}: "
                          "registered it now",
        }.get(what)
        if line:
            print(line, file=sys.stderr if what in ("idle", "stopped", "error", "orphan",
                                                     "registered") else sys.stdout, flush=True)

    ledger = Ledger(hub, s.room_name, agent)
    w = Worker(hub, s.room_name, agent, shell_handler(cmd, hub, s.room_name, agent, ledger, timeout),
               caps=caps, tags=split_list(tag), backoff=backoff, idle=idle, on_event=show,
               ledger=ledger)
    try:
        _work(s, w, once, tag, show)
    finally:
        ledger.close()


def _work(s: Scope, w, once: bool, tag, show) -> None:
    agent = w.agent
    if once:
        ev = w.run_once()
        if ev is None:
            show({"event": "nothing", "task": "", "agent": agent, "room": s.room_name})
            if not s.json:
                print(f"nothing is ready for {agent} in {s.room_name}")
            return
        raise typer.Exit(0 if ev["event"] == "done" else 1)
    if not s.json:
        print(f"{agent} working in {s.room_name}"
              + (f" (tags {', '.join(split_list(tag))})" if tag else "")
              + "; Ctrl-C gives the current task back and stops", file=sys.stderr, flush=True)
    w.run()


@command(feedback_app, "list")
def feedback_list(s: Scope):
    """Every open question in the room: tasks waiting in feedback, oldest first."""
    qs = s.room.questions()

    def show():
        if not qs:
            print(f"no open questions in {s.room_name}")
            return
        table(["task", "asked by", "for", "waiting", "question"],
              [(q["task"], q["asked_by"], q["for"], ago(q["since"]), q["question"][:80])
               for q in qs])
    s.emit({"room": s.room_name, "questions": qs}, show)


@command(feedback_app, "answer")
def feedback_answer(s: Scope, task_id: Annotated[str, typer.Argument(
        help="The task whose question you answer.", metavar="ID")],
        text: Annotated[str, typer.Argument(help="The answer.")]):
    """Answer a task's open question (its creator or a lead); the work resumes."""
    r = s.room.move_task(s.agent, task_id, "answer", answer=text, note=text, key=s.key)
    s.emit(r, f"task {r['id']}: answered; back to {r['state']}")

