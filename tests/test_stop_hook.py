"""The Stop hook of templates/claude-code, run as Claude Code runs it: a process with
the hook's JSON on stdin (session_id, hook_event_name "Stop", stop_hook_active) and
its decision on stdout ({"decision": "block", "reason": ...} to keep the agent working,
nothing to let it stop), against a real hub. It hands over the task the agent holds,
then what waits in its inbox, then a task it claims; it waits for work up to
GITDROP_IDLE seconds, and never blocks more than GITDROP_MAX_REPEATS times in a row
for the same state."""

import json
import os
import shutil
import subprocess
import signal
import sys
import time

import pytest

HOOK = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    "templates", "claude-code", "gitdrop-stop-hook.py")
PY = sys.executable

BRIEF = """## Objective

Make the parser accept tabs as separators.

## Requirements

- Keep the public API.

## Context

- `parser.py`

## Steps

1. Read `parser.py`.
2. Split on any whitespace.

## Acceptance criteria

- [ ] `a\\tb` parses as two fields.
"""


def _env(hub, tmp_path, idle, **extra):
    env = dict(os.environ, GITDROP_BIN=f"{PY} -m gitdrop", GITDROP_HUB=hub.path,
               GITDROP_ROOM="lobby", GITDROP_AGENT="core/spartan", GITDROP_IDLE=str(idle),
               TMPDIR=str(tmp_path))
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _stdin(session="s1", active=True, event="Stop"):
    return json.dumps({"session_id": session, "transcript_path": "/dev/null", "cwd": "/",
                       "hook_event_name": event, "stop_hook_active": active})


def hook(hub, tmp_path, idle=5, session="s1", active=True, event="Stop", **extra):
    """Run the hook to its end: (decision or None, stderr, seconds it took)."""
    t0 = time.monotonic()
    p = subprocess.run([PY, HOOK], input=_stdin(session, active, event), text=True,
                       capture_output=True, env=_env(hub, tmp_path, idle, **extra),
                       timeout=120)
    took = time.monotonic() - t0
    assert p.returncode == 0, p.stderr
    return (json.loads(p.stdout) if p.stdout.strip() else None), p.stderr, took


def start_hook(hub, tmp_path, idle, **extra):
    p = subprocess.Popen([PY, HOOK], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True,
                         env=_env(hub, tmp_path, idle, **extra))
    p.stdin.write(_stdin())
    p.stdin.close()
    return p


def finish(p, timeout=30):
    """The started hook's stdout and stderr once it has ended (its output is small)."""
    try:
        p.wait(timeout)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return p.stdout.read(), p.stderr.read()


def blocks(decision) -> str:
    assert decision is not None, "the hook let the agent stop"
    assert set(decision) == {"decision", "reason"} and decision["decision"] == "block"
    return decision["reason"]


# --- 1. the task the agent holds ---------------------------------------------------------

def test_blocks_with_the_in_progress_tasks_brief(hub, team, tmp_path):
    tid = team.create_task("core/juno", "parser tabs", BRIEF, assignee="core/spartan",
                           brief=True)["id"]
    team.move_task("core/spartan", tid, "start")
    got, _, took = hook(hub, tmp_path, idle=30)
    reason = blocks(got)
    assert f'task {tid} "parser tabs"' in reason and "in progress" in reason
    assert "Make the parser accept tabs as separators." in reason      # the brief itself
    assert "Acceptance criteria" in reason and "Split on any whitespace" in reason
    # what to do when done: the exact commands, and the MCP tools
    for cmd in (f"task submit {tid} --as core/spartan --room lobby",
                f"task fail {tid} --as core/spartan --room lobby",
                f"task release {tid} --as core/spartan --room lobby"):
        assert cmd in reason
    assert "submit_for_review" in reason and "update_task" in reason
    assert took < 20          # work at hand: no idle wait
    assert team.task(tid)["state"] == "in_progress"   # nothing was moved for it


def test_a_task_without_review_says_complete_and_a_long_brief_is_cut(hub, team, tmp_path):
    body = "Do this.\n" + "x" * 20_000
    tid = team.create_task("core/juno", "long one", body, assignee="core/spartan",
                           review=False)["id"]
    got, _, _ = hook(hub, tmp_path)
    reason = blocks(got)
    assert "is assigned to you" in reason and f"task start {tid}" in reason
    assert f"task complete {tid}" in reason and "task submit" not in reason
    assert "Do this." in reason and "more characters" in reason and f"task show {tid}" in reason
    assert len(reason) < 8_000


def test_the_held_task_comes_first_and_mentions_what_else_waits(hub, team, tmp_path):
    tid = team.create_task("core/juno", "mine", "the work", assignee="core/spartan")["id"]
    team.move_task("core/spartan", tid, "start")
    team.create_task("core/juno", "free", "someone's work")
    team.send("core/juno", "spartan", "how is it going?")
    reason = blocks(hook(hub, tmp_path)[0])
    assert f'task {tid} "mine"' in reason
    assert "Also waiting: 1 unread message from juno" in reason
    assert team.task("2")["state"] == "pending"      # nothing claimed while one is held


# --- 2. the inbox ------------------------------------------------------------------------

def test_unread_messages_come_before_claiming(hub, team, tmp_path):
    team.create_task("core/juno", "free", "someone's work")
    team.send("core/juno", "spartan", "are you there?")
    reason = blocks(hook(hub, tmp_path)[0])
    assert "1 unread message from juno" in reason and "gitdrop inbox" in reason
    assert team.task("1")["state"] == "pending"


# --- 3. claiming --------------------------------------------------------------------------

def test_claims_the_best_ready_task_and_blocks_with_its_brief(hub, team, tmp_path):
    low = team.create_task("core/juno", "low", "not this one")["id"]
    tid = team.create_task("core/juno", "parser tabs", BRIEF, priority=5, brief=True)["id"]
    reason = blocks(hook(hub, tmp_path)[0])
    assert f'you claimed task {tid} "parser tabs"' in reason
    assert f"task start {tid} --as core/spartan" in reason
    assert "Make the parser accept tabs as separators." in reason
    t = team.task(tid)
    assert t["assignee"] == "core/spartan" and t["state"] == "assigned"   # in the hub
    assert team.task(low)["state"] == "pending"


def test_no_claim_when_told_not_to(hub, team, tmp_path):
    team.create_task("core/juno", "free", "someone's work")
    got, _, took = hook(hub, tmp_path, idle=1, GITDROP_CLAIM=0)
    assert got is None and team.task("1")["state"] == "pending"


# --- 4. idle ------------------------------------------------------------------------------

def test_lets_an_idle_worker_stop_after_the_idle_time(hub, team, tmp_path):
    got, err, took = hook(hub, tmp_path, idle=3)
    assert got is None                          # empty stdout: Claude may stop
    assert 2.9 <= took <= 6, took               # about the idle time, not more
    got, _, took = hook(hub, tmp_path, idle=0)
    assert got is None and took < 5             # 0: one look, no wait


def test_an_assigned_task_waiting_on_another_is_not_handed_over(hub, team, tmp_path):
    """It is not actionable, and `gitdrop wait` keeps reporting it: the hook must
    neither block with it nor spin on it; it sleeps out the idle time."""
    first = team.create_task("core/juno", "first", "a", assignee="core/kai")["id"]
    team.create_task("core/juno", "second", "b", assignee="core/spartan", after=[first])
    team.inbox("core/spartan")          # its notice read: the task alone is left
    got, _, took = hook(hub, tmp_path, idle=3)
    assert got is None and 2.9 <= took <= 6, took


def test_wakes_and_claims_a_task_created_during_the_idle_wait(hub, team, tmp_path):
    p = start_hook(hub, tmp_path, idle=60)
    time.sleep(3)
    assert p.poll() is None                     # waiting for work
    t0 = time.monotonic()
    tid = team.create_task("core/juno", "parser tabs", BRIEF, brief=True)["id"]
    out, err = finish(p)
    assert time.monotonic() - t0 < 8, err       # woken, not at the end of the idle time
    reason = blocks(json.loads(out))
    assert f"you claimed task {tid}" in reason and "Make the parser accept tabs" in reason
    assert team.task(tid)["assignee"] == "core/spartan"


def test_wakes_for_a_task_assigned_during_the_idle_wait(hub, team, tmp_path):
    p = start_hook(hub, tmp_path, idle=60, GITDROP_CLAIM=0)
    time.sleep(3)
    assert p.poll() is None
    t0 = time.monotonic()
    tid = team.create_task("core/juno", "for you", "do it", assignee="core/spartan")["id"]
    out, err = finish(p)
    assert time.monotonic() - t0 < 8, err
    assert f'task {tid} "for you" is assigned to you' in blocks(json.loads(out))


# --- 5. the cap ---------------------------------------------------------------------------

def test_never_more_than_the_cap_in_a_row_for_an_unchanged_state(hub, team, tmp_path):
    tid = team.create_task("core/juno", "stuck", "the work", assignee="core/spartan")["id"]
    team.move_task("core/spartan", tid, "start")
    runs = [hook(hub, tmp_path, GITDROP_MAX_REPEATS=2) for _ in range(4)]
    assert [got is not None for got, _, _ in runs] == [True, True, False, False]
    assert "nothing moves" in runs[2][1]
    assert all(took < 20 for _, _, took in runs[2:])    # let stop at once, no idle wait

    # the state changes (a message arrives): handed over again
    team.send("core/juno", "spartan", "any news?")
    assert hook(hub, tmp_path, GITDROP_MAX_REPEATS=2)[0] is not None

    # the default cap is 3; a stop that is not a Stop-hook continuation starts anew
    runs = [hook(hub, tmp_path, session="s2") for _ in range(4)]
    assert [got is not None for got, _, _ in runs] == [True, True, True, False]
    assert hook(hub, tmp_path, session="s2", active=False)[0] is not None


def test_a_claimed_task_left_unstarted_counts_as_the_same_state(hub, team, tmp_path):
    team.create_task("core/juno", "free", "the work")
    runs = [hook(hub, tmp_path, GITDROP_MAX_REPEATS=2)[0] for _ in range(3)]
    assert "you claimed task 1" in blocks(runs[0])
    assert "task 1 \"free\" is assigned to you" in blocks(runs[1])
    assert runs[2] is None


# --- other clients and failures -------------------------------------------------------------

def test_gemini_after_agent_gets_the_same_answer(hub, team, tmp_path):
    team.create_task("core/juno", "free", "the work")
    got, _, _ = hook(hub, tmp_path, event="AfterAgent")
    assert "you claimed task 1" in blocks(got)


def test_a_gitdrop_error_lets_the_worker_stop_and_says_why(hub, team, tmp_path):
    got, err, took = hook(hub, tmp_path, idle=30, GITDROP_AGENT="core/nobody")
    assert got is None and took < 20
    assert "gitdrop stop hook:" in err and "letting the worker stop" in err


def test_without_an_agent_the_hook_does_nothing(hub, team, tmp_path):
    got, err, _ = hook(hub, tmp_path, GITDROP_AGENT="")
    assert got is None and err == ""



# --- the client templates ---------------------------------------------------------------------

def _client_command(client, project):
    """The hook command a client template configures, the settings' `env` block (Claude
    Code) and where the template expects the script, inside `project`."""
    root = os.path.dirname(os.path.dirname(HOOK))
    if client == "claude-code":
        with open(os.path.join(root, "claude-code", "settings.json")) as f:
            doc = json.load(f)
        entry = doc["hooks"]["Stop"][0]["hooks"][0]
        return entry, doc.get("env", {}), os.path.join(project, ".claude", "hooks")
    if client == "gemini-cli":
        with open(os.path.join(root, "gemini-cli", "settings.json")) as f:
            entry = json.load(f)["hooks"]["AfterAgent"][0]["hooks"][0]
        assert entry["timeout"] >= 1000 * 1000        # milliseconds, above GITDROP_IDLE
        return entry, {}, os.path.join(project, ".gemini", "hooks")
    with open(os.path.join(root, "codex", "hooks.json")) as f:
        entry = json.load(f)["hooks"]["Stop"][0]["hooks"][0]
    return entry, {}, os.path.join(project, ".codex", "hooks")


@pytest.mark.parametrize("client", ["claude-code", "gemini-cli", "codex"])
def test_each_client_template_runs_the_hook(client, hub, team, tmp_path):
    """The command of each template, run by a shell in the project as the client runs
    it (its project-dir variable set, the JSON on stdin), hands over a ready task."""
    project = tmp_path / "project"
    project.mkdir()
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    entry, env_block, where = _client_command(client, str(project))
    os.makedirs(where)
    shutil.copy(HOOK, where)
    assert entry["type"] == "command" and "gitdrop-stop-hook.py" in entry["command"]
    tid = team.create_task("core/juno", "parser tabs", BRIEF, brief=True)["id"]
    env = _env(hub, tmp_path, 900, **env_block)
    env.update(GITDROP_AGENT=env_block.get("GITDROP_AGENT", "nobody/unset"),
               GITDROP_HUB=hub.path, CLAUDE_PROJECT_DIR=str(project),
               GEMINI_PROJECT_DIR=str(project))
    event = "AfterAgent" if client == "gemini-cli" else "Stop"
    p = subprocess.run(["bash", "-c", entry["command"]], input=_stdin(event=event), text=True,
                       capture_output=True, env=env, cwd=str(project), timeout=120)
    assert p.returncode == 0, p.stderr
    assert f"you claimed task {tid}" in blocks(json.loads(p.stdout)), p.stderr
    assert team.task(tid)["assignee"] == "core/spartan"


def test_a_remote_hub_wakes_it_too(hub, team, tmp_path):
    """A hub given as a git URL: the room's tip is asked with `git ls-remote` (every
    5 s), and the task created meanwhile is claimed through the hub's mirror."""
    url = "file://" + hub.path
    p = start_hook(hub, tmp_path, idle=60, GITDROP_HUB=url,
                   GITDROP_CACHE=str(tmp_path / "cache"))
    time.sleep(4)
    assert p.poll() is None
    t0 = time.monotonic()
    tid = team.create_task("core/juno", "far away", "the work")["id"]
    out, err = finish(p)
    assert time.monotonic() - t0 < 15, err
    assert f"you claimed task {tid}" in blocks(json.loads(out))
    assert team.task(tid)["assignee"] == "core/spartan"


def test_a_line_separator_in_a_message_does_not_turn_the_hook_off(hub, team, tmp_path):
    """U+2028 or U+0085 in a message (the rules take them) was written raw in --json
    output, and the hook, splitting lines with str.splitlines(), read half a document:
    it let the agent stop, every time, never saying a message waited."""
    team.send("core/juno", "spartan", "hello\u2028world\x85 and\u2029more")
    reason = blocks(hook(hub, tmp_path)[0])
    assert "1 unread message from juno" in reason
    # every --json document is one line, whatever splits it
    env = _env(hub, tmp_path, 5)
    p = subprocess.run([PY, "-m", "gitdrop", "inbox", "--peek", "--json"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert len(p.stdout.splitlines()) == 1, p.stdout
    doc = json.loads(p.stdout)
    assert doc["messages"][0]["text"] == "hello\u2028world\x85 and\u2029more"


def test_the_repeat_counter_is_kept_where_no_one_else_writes(hub, team, tmp_path):
    """The counter was a file of a guessable name in /tmp, written with open(..., "w"):
    a link planted there had the hook write through it, and a counter planted there
    let the agent stop with work waiting. It is kept in a folder of the user's own,
    which a link in its place does not stand for."""
    planted = tmp_path / "planted"
    planted.mkdir()
    os.symlink(planted, tmp_path / f"gitdrop-stop-{os.getuid()}")
    home = tmp_path / "home"
    tid = team.create_task("core/juno", "stuck", "the work", assignee="core/spartan")["id"]
    team.move_task("core/spartan", tid, "start")
    runs = [hook(hub, tmp_path, GITDROP_MAX_REPEATS=2, HOME=home) for _ in range(3)]
    assert [got is not None for got, _, _ in runs] == [True, True, False]
    assert os.listdir(planted) == []
    kept = home / ".gitdrop" / "stop-hook"
    assert kept.is_dir() and (kept.stat().st_mode & 0o777) == 0o700 and os.listdir(kept)


@pytest.mark.parametrize("idle", ["nan", "inf", "-5", "1e400"])
def test_an_idle_time_that_is_no_number_of_seconds_is_taken_as_unset(hub, team, tmp_path,
                                                                      idle):
    """GITDROP_IDLE=nan made the hook wait for ever, and inf crash it (a traceback on
    the agent's every stop); such a value is taken as unset, the default."""
    p = start_hook(hub, tmp_path, 5, GITDROP_IDLE=idle)   # nothing waits: it waits
    time.sleep(2)
    team.send("core/juno", "spartan", "are you there?")
    out, err = finish(p, timeout=40)
    assert "Traceback" not in err, err
    assert "1 unread message from juno" in blocks(json.loads(out) if out.strip() else None), err


def _waits(pid: int) -> list[int]:
    """The idle `gitdrop wait` processes `pid` started (not its one look, timeout 0)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            kids = [int(c) for c in f.read().split()]
    except OSError:
        return []
    out = []
    for k in kids:
        try:
            with open(f"/proc/{k}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if b"wait" in args and b"--timeout" in args and \
                args[args.index(b"--timeout") + 1] != b"0":
            out.append(k)
    return out


def _gone(pid: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except OSError:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="reads /proc (Linux)")
@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_the_wait_it_started_ends_with_a_killed_hook(hub, team, tmp_path, how):
    """A client that times the hook out kills it: its `gitdrop wait` child ran on for
    the rest of GITDROP_IDLE (15 minutes by the template), holding an inotify
    instance, and repeated kills piled them up towards the per-user limit."""
    p = start_hook(hub, tmp_path, idle=300)
    deadline, kids = time.monotonic() + 20, []
    while not kids and time.monotonic() < deadline:
        time.sleep(0.2)
        kids = _waits(p.pid)
    assert kids, "the hook started no gitdrop wait"
    time.sleep(3)   # settled into its wait
    p.send_signal(how)
    p.wait(10)
    assert all(_gone(k, 10) for k in kids), [open(f"/proc/{k}/cmdline").read() for k in kids
                                             if os.path.exists(f"/proc/{k}/cmdline")]
