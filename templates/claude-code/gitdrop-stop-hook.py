#!/usr/bin/env python3
"""Claude Code Stop hook: keeps a gitdrop worker working while there is work for it,
and lets it stop after an idle time.

When Claude is about to end its turn, the hook looks, in this order, for:
  1. a task the agent holds (in_progress, or assigned to it and not waiting on another
     task): the stop is blocked and the reason names the task, gives its brief (its
     body, cut at GITDROP_BRIEF_MAX characters) and says how to finish it (submit,
     complete, fail, release: the gitdrop commands and the MCP tools);
  2. unread messages, reviews or handshakes waiting for the agent (`gitdrop wait
     --timeout 0`): the stop is blocked with the one-line alert;
  3. a task it may take (`gitdrop ready --claim`): the hook claims the best one for
     the agent and blocks with its brief ("you claimed task 12 ... start it with
     gitdrop task start 12");
  4. nothing: it waits for work until GITDROP_IDLE seconds have passed since it was
     called (`gitdrop wait` for what concerns the agent, and the room's tip for new
     tasks anyone may take); when something arrives it looks again (1-3); with
     nothing, Claude stops (nothing on stdout).
A block is {"decision": "block", "reason": ...} on stdout, exit 0. A gitdrop error (no
hub, unknown agent, ...) lets Claude stop and says why on stderr.

It never loops: if the very same state (same task and task state, same unread events,
tasks, reviews, handshakes) would be handed over more than GITDROP_MAX_REPEATS times
in a row, the worker is not acting on it and is let stop. The count runs while Claude
is continuing because of a Stop hook (`stop_hook_active` true in the input); a stop
that is not such a continuation (the user spoke in between) starts it again.

The same script works as Gemini CLI's AfterAgent hook and as Codex's Stop hook: both
send the same JSON (session_id, stop_hook_active) and take the same answer.

Environment (.claude/settings.json "env", or the hook command line):
  GITDROP_AGENT        who this worker is (team/name); without it the hook does nothing
  GITDROP_HUB          hub path or git URL (default: gitdrop's own, ~/.gitdrop/hub.git)
  GITDROP_ROOM         room (default lobby)
  GITDROP_IDLE         seconds to wait for work before letting Claude stop (default 600);
                       keep it below the hook's "timeout" in settings.json
  GITDROP_BIN          how to run gitdrop (default "gitdrop"; e.g. "/path/venv/bin/gitdrop")
  GITDROP_MAX_REPEATS  the same state handed over more times in a row than this: let
                       the worker stop (default 3)
  GITDROP_CLAIM        0: never claim a task for the agent (step 3 is skipped)
  GITDROP_TAG          claim only tasks with this tag (a comma list: any of them)
  GITDROP_BRIEF_MAX    characters of a task's brief put in the reason (default 6000)
Standard library only.
"""

import hashlib
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time

TIMEOUT = 124          # gitdrop wait: nothing within --timeout
HELD = ("in_progress", "assigned")


class GitdropFailed(Exception):
    """A gitdrop command failed: let the worker stop and say why."""


class Hook:
    def __init__(self, agent: str, env=os.environ):
        self.agent = self.me = agent
        self.bin = shlex.split(env.get("GITDROP_BIN", "gitdrop")) or ["gitdrop"]
        self.shown = env.get("GITDROP_BIN", "gitdrop")  # how the reason spells gitdrop
        self.hub = env.get("GITDROP_HUB", "")
        self.room = env.get("GITDROP_ROOM", "")
        self.idle = _number(env.get("GITDROP_IDLE"), 600)
        self.max_repeats = int(_number(env.get("GITDROP_MAX_REPEATS"), 3))
        self.claim = env.get("GITDROP_CLAIM", "1").strip().lower() not in ("0", "no", "false")
        self.tag = env.get("GITDROP_TAG", "")
        self.brief_max = int(_number(env.get("GITDROP_BRIEF_MAX"), 6000))

    # --- gitdrop ---------------------------------------------------------------------
    def cmd(self, *args) -> list:
        cmd = self.bin + list(args) + ["--as", self.agent, "--json"]
        if self.hub:
            cmd += ["--hub", self.hub]
        if self.room:
            cmd += ["--room", self.room]
        return cmd

    def run(self, *args, ok=(0,)) -> tuple:
        """Run gitdrop with --json: (exit code, the JSON document)."""
        cmd = self.cmd(*args)
        try:
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        except OSError as e:
            raise GitdropFailed(f"cannot run {cmd[0]}: {e}")
        if p.returncode not in ok:
            raise GitdropFailed(f"gitdrop {args[0]} failed ({p.returncode}): "
                                f"{p.stderr.strip()[-500:]}")
        try:
            # the last line, split at "\n" alone: str.splitlines() also splits at
            # U+2028 and U+0085, which a message may hold (older gitdrop wrote them raw)
            return p.returncode, json.loads(p.stdout.strip().split("\n")[-1])
        except (ValueError, IndexError):
            raise GitdropFailed(f"gitdrop {args[0]}: no JSON answer: {p.stdout[-200:]!r}")

    def waiting(self) -> dict:
        """What waits for the agent now (gitdrop wait --timeout 0), or {}."""
        rc, doc = self.run("wait", "--timeout", "0", ok=(0, TIMEOUT))
        self.me = doc.get("agent") or self.me   # team/name, also when given short
        return doc if rc == 0 else {}

    def held(self) -> dict:
        """The task the agent holds and can work on now: in_progress first, then
        assigned (not waiting on another task); by priority, then id. Or {}."""
        _, doc = self.run("task", "list", "--assignee", self.me, "--state", ",".join(HELD))
        mine = [t for t in doc.get("tasks", []) if t.get("state") in HELD and
                not (t.get("state") == "assigned" and t.get("waiting_on"))]
        mine.sort(key=lambda t: (t["state"] != "in_progress", -int(t.get("priority") or 0),
                                 _num(t.get("id"))))
        return mine[0] if mine else {}

    def show(self, tid: str) -> dict:
        _, doc = self.run("task", "show", str(tid))
        return doc.get("task") or {}

    def claim_next(self) -> dict:
        args = ["ready", "--claim"] + (["--tag", self.tag] if self.tag else [])
        _, doc = self.run(*args)
        return doc if doc.get("task") else {}

    def anything_ready(self) -> bool:
        args = ["ready", "-n", "1"] + (["--tag", self.tag] if self.tag else [])
        _, doc = self.run(*args)
        return bool(doc.get("tasks"))

    # --- what to hand over --------------------------------------------------------------
    def look(self) -> tuple:
        """(state, reason) to block with, or (None, alert) when there is nothing to
        act on (alert: what `gitdrop wait` reports anyway, e.g. an assigned task that
        waits on another one)."""
        alert = self.waiting()
        task = self.held()
        claimed = False
        if not task and not _news(alert) and self.claim:
            got = self.claim_next()
            if got:
                task, claimed = self.show(got["task"]), bool(got.get("claimed"))
        elif task:
            task = self.show(task["id"]) or task
        if task:
            return _state(task, alert), self.task_reason(task, alert, claimed)
        if _news(alert):
            return _state({}, alert), self.alert_reason(alert)
        return None, alert

    def gd(self, *args) -> str:
        """A gitdrop command line as the agent should type it."""
        extra = ["--as", self.me] + (["--room", self.room] if self.room else [])
        return " ".join([self.shown, *args, *map(shlex.quote, extra)])

    def task_reason(self, task: dict, alert: dict, claimed: bool) -> str:
        tid, title, state = task.get("id"), task.get("title", ""), task.get("state", "")
        if claimed:
            head = (f"gitdrop: you claimed task {tid} \"{title}\" for {self.me}; it is "
                    f"yours now. Start it with `{self.gd('task', 'start', tid)}` (MCP: "
                    "update_task with status in_progress), then do it.")
        elif state == "assigned":
            head = (f"gitdrop: task {tid} \"{title}\" is assigned to you ({self.me}) and "
                    f"not started. Start it with `{self.gd('task', 'start', tid)}` (MCP: "
                    "update_task with status in_progress), then do it.")
        else:
            head = (f"gitdrop: you ({self.me}) hold task {tid} \"{title}\", in progress. "
                    "Keep working on it until it is done.")
        body = (task.get("body") or "").strip()
        kind = "brief" if task.get("brief") else "instructions"
        if not body:
            body = "(no instructions: the title is all there is; ask if it is unclear)"
        elif len(body) > self.brief_max:
            body = (body[:self.brief_max].rstrip() + f"\n[... cut: {len(body) - self.brief_max}"
                    f" more characters; all of it: {self.gd('task', 'show', tid)}]")
        if task.get("answer"):
            body += f"\n\nAnswer to your question: {task['answer']}"
        if task.get("note") and state == "in_progress":
            body += f"\n\nLast note on it: {task['note']}"
        if task.get("review", True):
            finish = (f"- done: hand it to review with `{self.gd('task', 'submit', tid)} --note "
                      "\"what you did\"` (MCP: submit_for_review)")
        else:
            finish = (f"- done: `{self.gd('task', 'complete', tid)} --note \"what you did\"` "
                      "(MCP: update_task with status completed; no review)")
        lines = [
            head, "", f"--- task {tid} {kind} ---", body, "---", "",
            "When you are done, or cannot go on:",
            finish,
            f"- it cannot be done: `{self.gd('task', 'fail', tid)} --reason \"why\"` "
            "(MCP: update_task with status failed and the reason as result)",
            f"- give it back for someone else: `{self.gd('task', 'release', tid)} --note "
            "\"why\"` (MCP: update_task with status pending)",
            f"- a question for its creator: `{self.gd('task', 'ask', tid)} --question "
            "\"...\"` (MCP: request_feedback)",
        ]
        if _news(alert):
            lines += ["", f"Also waiting: {alert.get('summary', '')} (read it with "
                          f"`{self.gd('inbox')}` or the check_inbox tool)."]
        lines += ["", "Then end your turn: the next piece of work is handed to you when you "
                      "stop."]
        return "\n".join(lines)

    def alert_reason(self, alert: dict) -> str:
        return (f"{alert.get('alert', 'gitdrop: work is waiting for you')}\n"
                f"Read it now (`{self.gd('inbox')}`, or the check_inbox tool), act on it, "
                "then end your turn: you will be woken again when more arrives.")

    # --- waiting ------------------------------------------------------------------------
    def sleep_until_work(self, deadline: float, use_wait: bool) -> bool:
        """Until `deadline` (monotonic): True as soon as something may be there to act
        on, False at the deadline. `gitdrop wait` wakes at once for what concerns the
        agent (unless use_wait is False: it would return at once, for an alert that
        is not actionable); a new task anyone may take concerns no one in particular,
        so the room's tip is also watched (read every second on a local hub, every 5 s
        on a remote one) and `gitdrop ready` asked when it moves."""
        waiter = None
        if use_wait and deadline - time.monotonic() > 0:
            left = max(1, int(deadline - time.monotonic() + 0.999))
            try:
                waiter = subprocess.Popen(self.cmd("wait", "--timeout", str(left)),
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True, preexec_fn=_dies_with(os.getpid()))
            except OSError as e:
                raise GitdropFailed(f"cannot run {self.bin[0]}: {e}")
        local = os.path.isdir(self._hub_path())
        every = 1.0 if local else 5.0
        watch_tip = self.claim   # new tasks matter only to a worker that claims them
        tip = self.tip(local) if watch_tip else ""
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                if waiter is not None:
                    try:
                        rc = waiter.wait(min(every, left))
                    except subprocess.TimeoutExpired:
                        rc = None
                    if rc == 0:
                        return True
                    if rc is not None:
                        err = waiter.stderr.read().strip()
                        waiter = None
                        if rc != TIMEOUT:
                            raise GitdropFailed(f"gitdrop wait failed ({rc}): {err[-500:]}")
                else:
                    time.sleep(min(every, left))
                if not watch_tip:
                    if waiter is None:   # nothing left to wake it: sleep out the idle time
                        time.sleep(max(0.0, deadline - time.monotonic()))
                    continue
                now = self.tip(local)
                if now != tip:
                    tip = now
                    if self.anything_ready():
                        return True
        finally:
            if waiter is not None and waiter.poll() is None:
                waiter.terminate()
                try:
                    waiter.wait(5)
                except subprocess.TimeoutExpired:
                    waiter.kill()
                    waiter.wait()

    def _hub_path(self) -> str:
        return self.hub or os.path.join(os.path.expanduser("~"), ".gitdrop", "hub.git")

    def tip(self, local: bool) -> str:
        """The room's tip as cheaply as it can be had (a change is all that matters)."""
        ref = "refs/heads/rooms/" + (self.room or "lobby")
        hub = self._hub_path()
        if local:
            try:
                with open(os.path.join(hub, ref)) as f:
                    return f.read().strip()
            except OSError:
                pass
            try:
                with open(os.path.join(hub, "packed-refs")) as f:
                    for line in f:
                        if line.rstrip().endswith(" " + ref):
                            return line.split()[0]
            except OSError:
                pass
            return ""
        try:
            p = subprocess.run(["git", "ls-remote", hub, ref], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True, timeout=30)
            return p.stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ""

    # --- the hook -----------------------------------------------------------------------
    def decide(self, event: dict, started: float):
        """The reason to block with, or None to let the worker stop."""
        deadline = started + self.idle
        counter = Repeats(event.get("session_id", ""), self.agent, self.hub, self.room)
        if not event.get("stop_hook_active"):
            counter.reset()   # not a continuation we asked for: a new run of blocks
        while True:
            state, got = self.look()
            if state is not None:
                n = counter.bump(state)
                if n > self.max_repeats:
                    sys.stderr.write(
                        "gitdrop stop hook: the same work was handed over "
                        f"{self.max_repeats} times in a row and nothing moves; letting the "
                        f"worker stop ({state})\n")
                    return None
                return got
            if not self.sleep_until_work(deadline, use_wait=not got):
                return None


def _private_dir() -> str:
    """A folder only this user may write, for the repeat counters: one of its own in
    the temporary folder (another user there could plant a counter, or a link at
    its name), else ~/.gitdrop/stop-hook."""
    uid = os.getuid() if hasattr(os, "getuid") else None
    for d in (os.path.join(tempfile.gettempdir(), f"gitdrop-stop-{uid or 0}"),
              os.path.join(os.path.expanduser("~"), ".gitdrop", "stop-hook")):
        try:
            os.makedirs(d, mode=0o700, exist_ok=True)
            st = os.lstat(d)
            if not os.path.islink(d) and os.path.isdir(d) and \
                    (uid is None or (st.st_uid == uid and not st.st_mode & 0o022)):
                return d
        except OSError:
            continue
    return tempfile.mkdtemp(prefix="gitdrop-stop-")   # a count of this run alone


class Repeats:
    """How many times in a row this session was handed this very same state."""

    def __init__(self, session: str, *scope):
        key = hashlib.sha1("|".join([session, *scope]).encode()).hexdigest()[:16]
        self.path = os.path.join(_private_dir(), f"gitdrop-stop-{key}.json")

    def _read(self) -> dict:
        try:
            fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) |
                         getattr(os, "O_NONBLOCK", 0))
            with os.fdopen(fd) as f:
                return json.loads(f.read(4096))
        except (OSError, ValueError):
            return {}

    def _write(self, doc: dict) -> None:
        # through a file of its own, made new, then renamed: a link planted at the
        # counter's name had the hook write through it
        tmp = f"{self.path}.{os.getpid()}-{os.urandom(4).hex()}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL |
                         getattr(os, "O_NOFOLLOW", 0), 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f)
            os.replace(tmp, self.path)
        except OSError:
            try:
                os.unlink(tmp)
            except OSError:
                pass

    def reset(self) -> None:
        self._write({})

    def bump(self, what: str) -> int:
        last = self._read()
        count = last.get("count", 0) + 1 if last.get("what") == what else 1
        self._write({"what": what, "count": count})
        return count


def _news(alert: dict) -> bool:
    """Something in the alert to act on besides assigned tasks (handled as tasks)."""
    return bool(alert and (alert.get("events") or alert.get("reviews")
                           or alert.get("handshakes")))


def _state(task: dict, alert: dict) -> str:
    """What the repeat count compares: the task and its state, the unread events, the
    reviews and handshakes waiting (assigned tasks are the task's part)."""
    return json.dumps([str(task.get("id", "")), task.get("state", ""),
                       sorted(str(e.get("id")) for e in alert.get("events", []) or []),
                       alert.get("reviews") or [], alert.get("handshakes") or []])


def _number(value, default: float) -> float:
    """A setting in seconds or a count: `default` when unset, or not a finite number
    (GITDROP_IDLE=nan made the hook wait for ever, =inf crash)."""
    try:
        got = float(value) if value not in (None, "") else default
    except ValueError:
        return default
    return got if math.isfinite(got) and 0 <= got < 10 ** 7 else default


def _dies_with(parent: int):
    """What the `gitdrop wait` child runs before it starts: it is sent SIGTERM when
    the hook dies, by SIGKILL too (a client's hook timeout), where Linux can do so.
    Else it outlived the hook by up to GITDROP_IDLE, holding an inotify instance."""
    try:
        import ctypes
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (AttributeError, OSError):
        return None

    def child():
        prctl(1, 15)   # PR_SET_PDEATHSIG, SIGTERM
        if os.getppid() != parent:   # the hook died before that was set
            os._exit(0)
    return child


def _ended(signum, _frame):
    raise SystemExit(128 + signum)   # so the wait child is ended on the way out


def _num(tid) -> int:
    return int(tid) if str(tid).isdigit() else 0


def main() -> int:
    started = time.monotonic()
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _ended)
    try:
        event = json.load(sys.stdin)
    except ValueError:
        event = {}
    if not isinstance(event, dict):
        event = {}
    agent = os.environ.get("GITDROP_AGENT", "")
    if not agent:
        return 0
    try:
        reason = Hook(agent).decide(event, started)
    except GitdropFailed as e:
        sys.stderr.write(f"gitdrop stop hook: {e}; letting the worker stop\n")
        return 0
    if reason:
        print(json.dumps({"decision": "block", "reason": reason}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
