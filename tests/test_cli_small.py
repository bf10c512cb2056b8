"""The small things a newcomer trips over in the first hour, through the real `gitdrop`:
help that reads as help, a typo that is answered, NO_COLOR, refusals that come
before questions, a wait that says it timed out, progress on long work."""

import json
import re
import subprocess
import sys
import time

import pytest

from cli_helpers import Gitdrop
from gitdrop.cli.demo import STEPS
from gitdrop.cli.main import COMMANDS

GROUPS = {"task": ("create", "list", "show", "assign", "start", "sign"),
          "room": ("create", "list", "settings", "destroy", "join"),
          "team": ("create", "list"), "handshake": ("start", "ack", "status"),
          "contract": ("declare", "list", "show"), "context": ("set", "get")}


@pytest.fixture
def gd(hub, tmp_path):
    return Gitdrop(hub.path, str(tmp_path / "home"), agent="core/juno")


# --- help ----------------------------------------------------------------------------

# Every help page from one process running the command's own main() in turn: a
# process a page spent half a second of CPU on each start-up.
PAGES = """
import contextlib, io, json, sys
from gitdrop.cli.main import main
outs = []
for args in json.loads(sys.argv[1]):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        try:
            main(args)
        except SystemExit as e:
            assert not e.code, (args, e.code)
    outs.append(buf.getvalue())
print(json.dumps(outs))
"""


def test_help_shows_metavars_not_python_types(gd):
    pages = [("--help",)] + [(c, "--help") for c in COMMANDS] + \
        [(g, s, "--help") for g, subs in GROUPS.items() for s in subs]
    p = subprocess.run([sys.executable, "-c", PAGES, json.dumps(pages)], capture_output=True,
                       text=True, env=dict(gd.env, COLUMNS="200"), stdin=subprocess.DEVNULL,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    outs = json.loads(p.stdout)
    for args, out in zip(pages, outs, strict=True):
        assert not re.search(r"<(bool|str|int|float|list)", out), (args, out)
        usage = next(x for x in out.splitlines() if "Usage:" in x)
        assert "{" not in usage, (args, usage)
    create = gd.ok("task", "create", "--help", env={"COLUMNS": "200"}).out
    assert outs[pages.index(("task", "create", "--help"))] == create   # as `gitdrop` shows it
    assert "Usage: gitdrop task create [OPTIONS] TITLE" in create
    assert re.search(r"--priority\s+-p\s+N\s", create)
    assert re.search(r"--assign\s+-a\s+TEXT\s", create)
    inbox = gd.ok("inbox", "--help", env={"COLUMNS": "200"}).out
    assert re.search(r"--peek\s+Show", inbox)          # a flag: nothing between
    assert re.search(r"--json\s+Print", inbox)
    assert "gitdrop send [OPTIONS] TO..." in gd.ok("send", "--help").out
    assert "gitdrop init [OPTIONS] [PATH]" in gd.ok("init", "--help").out
    assert "[stdio|http]" in gd.ok("serve", "--help", env={"COLUMNS": "200"}).out


def test_a_command_list_shows_each_summary_whole(gd):
    """A listed command's summary is its help's first sentence on one line (where
    the page is wide enough): docstrings wrapped at 90 columns broke mid-sentence,
    and a first paragraph (sync's ran 14 lines) buried the list."""
    import click
    import inspect
    from gitdrop.cli.main import app
    import typer
    top = typer.main.get_command(app)
    ctx = click.Context(top)
    groups = [((), top)] + [((name,), top.get_command(ctx, name)) for name in GROUPS]
    pages = [args + ("--help",) for args, _ in groups]
    p = subprocess.run([sys.executable, "-c", PAGES, json.dumps(pages)], capture_output=True,
                       text=True, env=dict(gd.env, COLUMNS="200"), stdin=subprocess.DEVNULL,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    checked = 0
    for (args, group), out in zip(groups, json.loads(p.stdout), strict=True):
        for name in group.list_commands(ctx):
            cmd = group.get_command(ctx, name)
            first = " ".join(inspect.cleandoc(cmd.help or "").split("\n\n")[0].split())
            first = first.split(". ")[0].rstrip(".") + "." if first else ""
            if not first or len(first) > 150:
                continue
            row = next(x for x in out.splitlines() if re.match(rf"│ {name} ", x))
            assert first in " ".join(row.split()), (args, name, row)
            checked += 1
    assert checked > 40


def test_a_mistyped_command_is_answered_with_the_closest(gd):
    r = gd("inbx")
    assert r.rc == 2 and "No such command 'inbx'. Did you mean 'inbox'?" in r.err, r
    assert "'history'" in gd("histroy").err
    r = gd("regster")
    assert "'register'" in r.err and r.rc == 2
    doc = gd("tsak", "--json").json
    assert doc["exit_code"] == 2 and "Did you mean 'task'?" in doc["reason"]
    r = gd("zzzzzz")
    assert r.rc == 2 and "No such command 'zzzzzz'." in r.err and "Did you mean" not in r.err
    assert "Did you mean 'list'?" in gd("task", "lst").err   # a group's own, as before
    # the nearest only: `task creat` offered reap and retry beside create
    assert "No such command 'creat'. Did you mean 'create'?" in gd("task", "creat").err
    assert "Did you mean 'start'?" in gd("task", "st").err    # a beginning: not `list`


# --- on a terminal -------------------------------------------------------------------

def on_terminal(gd, *args, env=None, cols=100, timeout=60, stdout_tty=True):
    """Run gitdrop with stdout and stderr each on a pseudo-terminal of its own (stdin
    empty; stdout a pipe with stdout_tty=False); returns (exit code, what stdout got,
    what stderr's terminal got)."""
    import os
    import pty
    import select
    import subprocess
    import time
    from cli_helpers import ENTRY
    (out_m, out_s) = pty.openpty() if stdout_tty else os.pipe()   # (read end, write end)
    (err_m, err_s) = pty.openpty()
    e = dict(gd.env, COLUMNS=str(cols), LINES="40", TERM="xterm")
    e.update(env or {})
    p = subprocess.Popen([*ENTRY, *map(str, args)], stdin=subprocess.DEVNULL, stdout=out_s,
                         stderr=err_s, env=e, close_fds=True)
    os.close(out_s)
    os.close(err_s)
    got = {out_m: b"", err_m: b""}
    open_ = set(got)
    deadline = time.monotonic() + timeout
    poll = select.poll()   # not select(): a test worker's descriptors may pass 1024
    for fd in open_:
        poll.register(fd, select.POLLIN)
    while open_ and time.monotonic() < deadline:
        ready = [fd for fd, _ in poll.poll(100) if fd in open_]
        for fd in ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:   # the other side closed (Linux reports EIO)
                chunk = b""
            if chunk:
                got[fd] += chunk
            else:
                open_.discard(fd)
                poll.unregister(fd)
        if p.poll() is not None and not ready:
            break
    rc = p.wait(timeout=10)
    for fd in got:
        os.close(fd)
    return rc, got[out_m].decode(errors="replace"), got[err_m].decode(errors="replace")


def test_no_color_means_no_styles_at_all_on_a_terminal(gd, team):
    # on a terminal, tables and help are styled ...
    rc, out, _ = on_terminal(gd, "who")
    assert rc == 0 and "core/juno" in out and "\x1b[" in out
    rc, out, _ = on_terminal(gd, "task", "create", "--help")
    assert rc == 0 and "\x1b[" in out
    # ... and NO_COLOR takes every style away: colours, bold and dim
    for args in (("who",), ("task", "create", "--help"), ("--help",), ("room", "list"),
                 ("--as", "spartan", "inbox", "--peek")):
        rc, out, err = on_terminal(gd, *args, env={"NO_COLOR": "1"})
        assert rc == 0 and "\x1b[" not in out and "\x1b[" not in err, (args, out, err)


# --- what a command answers ----------------------------------------------------------

def test_task_list_refuses_an_unknown_state_and_names_the_states(gd, team):
    gd.ok("task", "create", "one", "--assign", "spartan")
    doc = gd.refused(2, "usage", "task", "list", "--state", "bogus")
    assert "'bogus'" in doc["reason"]
    for state in ("pending", "assigned", "in_progress", "review", "cancelled"):
        assert state in doc["reason"]
    r = gd("task", "list", "--state", "assigned,revew")
    assert r.rc == 2 and "'revew'" in r.err and "'assigned'" not in r.err
    assert [t["title"] for t in gd.js("task", "list", "--state", "review,assigned")["tasks"]] \
        == ["one"]


def test_history_of_a_task_without_messages_says_so(gd, team):
    gd.ok("send", "spartan", "-m", "not about a task")
    tid = gd.ok("task", "create", "one").out.strip()
    assert gd.ok("history", "--task", tid).out.strip() == f"no messages about task {tid} in lobby"
    assert "not about a task" in gd.ok("history").out


def test_history_and_inbox_name_agents_alike(gd, team, lobby):
    """`history` named a sender in full and its recipients by their names alone, the
    inbox by names alone: core/kai and web/kai both showed as kai. Both now show a
    name alone where it is the room's only one."""
    lobby.register("web/kai")
    lobby.inbox("core/juno")
    lobby.send("core/juno", "core/spartan", "to spartan")
    lobby.send("core/juno", "core/kai", "to core's kai")
    out = gd.ok("history").out
    assert "juno → spartan" in out and "juno → core/kai" in out and "core/juno" not in out
    lobby.inbox("core/kai")
    lobby.inbox("core/spartan")
    lobby.send("core/kai", "core/juno", "from core's kai")
    lobby.send("core/spartan", "core/juno", "from spartan")
    out = gd.ok("inbox").out
    assert "core/kai → you" in out and "spartan → you" in out, out


def test_destroy_refuses_a_non_lead_before_asking_for_the_name(gd, hub):
    hub.register_team("core", "core/juno", ["kai"])
    hub.create_room("core/juno", "tmp", ["core"])
    hub.room("tmp").register("core/juno", ["lead"])
    hub.room("tmp").register("core/kai", [])
    # no answer on stdin: a refusal that came after the prompt would be "not confirmed"
    r = gd("--as", "core/kai", "room", "destroy", "tmp", "--yes", "--json", input="")
    assert r.rc == 3 and r.json["rule"] == "lead-only", r
    assert "Type the room's name" not in r.err
    r = gd("--as", "core/juno", "room", "destroy", "nowhere", "--yes", input="")
    assert r.rc == 4 and "Type the room's name" not in r.err, r
    # a lead is still asked, and still must type the name
    r = gd("--as", "core/juno", "room", "destroy", "tmp", "--yes", input="tmp\n")
    assert r.rc == 0 and "Type the room's name (tmp)" in r.err and "destroyed" in r.out, r


def test_wait_json_says_it_timed_out_in_one_document(gd, team):
    r = gd("--as", "spartan", "wait", "--timeout", "0.2", "--json")
    assert r.rc == 124, r
    doc = r.json
    assert doc["ok"] is False and doc["exit_code"] == 124 and doc["rule"] == "timeout"
    assert "core/spartan" in doc["reason"] and "0.2 s" in doc["reason"]
    assert "gitdrop wait" in doc["fix"] and doc["agent"] == "core/spartan"
    r = gd("--as", "nobody", "wait", "--timeout", "0.2", "--json")   # an error: one document too
    assert r.rc == 4 and r.json["ok"] is False and r.json["rule"] == "not-found", r
    gd.ok("send", "spartan", "-m", "your turn")
    doc = gd.js("--as", "spartan", "wait", "--timeout", "5")
    assert doc["unread"] == 1


# --- progress on long work -----------------------------------------------------------

def test_who_never_cuts_an_agent_s_name_on_a_narrow_terminal(gd, team):
    """At 80 columns the agent column was cut to "default/n…": two agents read as one."""
    for name in ("default/nobody", "default/nobody2"):
        team.register(name, caps=["python", "sql", "frontend"])
        team.set_status(name, "working on a rather long piece of the payment service")
    rc, out, err = on_terminal(gd, "who", cols=80)
    assert rc == 0, (out, err)
    lines = [ln for ln in out.splitlines() if "default/nobody" in ln]
    assert len(lines) == 2 and "default/nobody " in lines[0] and "default/nobody2 " in \
        lines[1], out
    assert "healthy" in out and "claimed" in out and "done" in out, out   # short: whole


def test_ctrl_c_stops_a_server_quietly(gd, team):
    """Ctrl-C, how a server is stopped, printed a red 'stopped before it finished', a
    word on the offline queue and 'may or may not be on the hub', and exit 130."""
    import signal
    from cli_helpers import ENTRY
    p = subprocess.Popen([*ENTRY, "serve", "--transport", "http", "--port", "0"],
                         env=gd.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        line = p.stderr.readline()
        assert "127.0.0.1" in line, line
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0 and "stopped" in err and "queue" not in err, (p.returncode, err)


# `gitdrop serve`, its SIGTERM arriving while the garbage collector runs a callback
# (a full collection runs as a server starts): what a signal handler raises there is
# dropped by Python ("Exception ignored in"), and the server served on for good.
_STOPPED_IN_A_COLLECTION = (
    "import gc, os, signal, sys\n"
    "def cb(phase, info):\n"
    "    pauses = sys.modules.get('gitdrop.pauses')   # the server's own collection\n"
    "    if pauses and pauses._STATE['on'] and not sent:\n"
    "        sent.append(os.kill(os.getpid(), signal.SIGTERM))\n"
    "        sum(range(1000))   # the handler runs here, in the callback\n"
    "sent = []\n"
    "gc.callbacks.append(cb)\n"
    "from gitdrop.cli.main import main\n"
    "sys.argv[0] = 'gitdrop'\n"
    "main()\n")


def test_a_stop_that_comes_in_a_collection_still_stops_the_server(gd, team):
    p = subprocess.run([sys.executable, "-c", _STOPPED_IN_A_COLLECTION, "serve", "--transport",
                        "http", "--port", "0"], env=gd.env, capture_output=True, text=True,
                       timeout=60, stdin=subprocess.DEVNULL)
    assert p.returncode == 0 and "server stopped" in p.stderr, (p.returncode, p.stderr)
    assert "Exception ignored" not in p.stderr, p.stderr


# A stop that comes while a finalizer runs, near the end of a command (1), or just
# before a second stop (2).
_STOPPED_IN_A_FINALIZER = """
import os, signal, sys, time
from gitdrop.cli import base
class Late:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)
        sum(range(1000))   # the handler runs here, where what it raises is dropped
try:
    with base.stop_signals():
        late = Late()
        del late
        if sys.argv[1] == "2":
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(1)
except base.Stopped as e:
    print("stopped by", e.signum, flush=True)
    time.sleep(0.3)   # its clean-up
print("done", flush=True)
"""


@pytest.mark.parametrize("case", ["1", "2"])
def test_a_stop_put_off_out_of_a_finalizer_does_not_kill_what_comes_after(case):
    """Sent again 50 ms later, it killed a command that had finished meanwhile (its
    result unprinted, exit -15), or the clean-up a second stop had begun."""
    p = subprocess.run([sys.executable, "-c", _STOPPED_IN_A_FINALIZER, case],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.endswith("done\n"), (p.returncode, p.stdout, p.stderr)
    assert ("stopped by 1" in p.stdout) == (case == "2"), p.stdout


def test_status_takes_a_short_name_as_every_command_does(gd, team):
    """`--as juno status` said juno was not registered: it compared the name as given."""
    team.set_status("core/juno", "reviewing")
    r = gd("--as", "juno", "--json", "status")
    assert r.rc == 0 and r.json["status"]["agent"] == "core/juno", r
    assert r.json["status"]["status"] == "reviewing"


@pytest.fixture
def long_room(hub, lobby):
    """A lobby of a few hundred commits."""
    lobby.register("core/juno", ["lead"])
    for i in range(300):
        lobby.set_context("core/juno", f"k{i % 5}", f"value {i}")
    return lobby


BAR = "━"   # what rich draws a bar with


def test_verify_shows_a_progress_bar_on_stderr_of_a_terminal(gd, long_room):
    rc, out, err = on_terminal(gd, "verify")
    assert rc == 0, (out, err)
    assert "room lobby: 303 commits re-checked" in out
    assert "verifying lobby" in err and BAR in err and "303/303" in err, err
    assert "verifying" not in out and BAR not in out
    # NO_COLOR: the bar still shows, without styles
    rc, out, err = on_terminal(gd, "verify", env={"NO_COLOR": "1"})
    assert rc == 0 and "303/303" in err and "\x1b[3" not in err and "\x1b[9" not in err


def test_progress_stays_quiet_for_scripts(gd, long_room, hub):
    # not a terminal (as in every other test), --json, or stdout a pipe: no bar
    r = gd.ok("verify")
    assert r.err == "" and "303 commits" in r.out
    assert gd.js("verify")["commits"] == 303
    rc, out, err = on_terminal(gd, "verify", "--json")
    assert rc == 0 and BAR not in err and "verifying" not in err
    assert '"commits": 303' in out
    rc, out, err = on_terminal(gd, "verify", stdout_tty=False)
    assert rc == 0 and BAR not in err and "303 commits" in out
    rc, out, err = on_terminal(gd, "reap", stdout_tty=False)
    assert rc == 0 and BAR not in err and "archived: none" in out
    rc, out, err = on_terminal(gd, "verify", env={"TERM": "dumb"})
    assert rc == 0 and BAR not in err


def test_reap_shows_a_progress_bar_on_a_terminal(gd, hub):
    from gitdrop.hub import Hub
    hub.register_team("core", "core/juno")
    then = Hub(hub.path, clock=lambda: int(time.time()) - 91 * 86400)
    for name in ("a", "b", "c"):
        hub.create_room("core/juno", name, ["core"])
        hub.room(name).register("core/juno", ["lead"])
        then.archive_room(name, "core/juno")
    rc, out, err = on_terminal(gd, "reap")
    assert rc == 0 and "destroyed: a, b, c" in out, (out, err)
    assert "reaping" in err and "3/3" in err, err


def test_the_demo_narrates_on_stdout_under_a_bar_on_stderr(gd):
    rc, out, err = on_terminal(gd, "demo", cols=160)
    assert rc == 0, (out, err)
    assert "steps went as expected" in out and "\x1b[32m✔" in out   # colour: a terminal
    assert "demo" in err and BAR in err and f"/{STEPS}" in err
    assert "went as expected" not in err and BAR not in out
    rc, out, err = on_terminal(gd, "demo", stdout_tty=False)
    assert rc == 0 and BAR not in err and "\x1b[" not in out


def test_work_that_cannot_count_shows_a_bar_only_when_it_runs_long(gd, long_room):
    # history reads back until it has its messages: on a small room it is done long
    # before its bar would come, so none is drawn
    rc, out, err = on_terminal(gd, "history", "--task", "1")
    assert rc == 0 and "no messages about task 1 in lobby" in out
    assert BAR not in err and "history" not in err, err


def test_a_delayed_bar_comes_only_if_the_work_outlasts_the_delay(monkeypatch):
    import io
    import sys
    import time
    from gitdrop.cli.base import progress

    class Tty(io.StringIO):
        def isatty(self):
            return True
    out, err = Tty(), Tty()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setenv("TERM", "xterm")
    monkeypatch.delenv("NO_COLOR", raising=False)
    with progress("quick work", after=0.5):
        pass
    assert err.getvalue() == ""
    with progress("slow work", after=0.05):
        time.sleep(0.4)
    assert "slow work" in err.getvalue() and BAR in err.getvalue()
    assert out.getvalue() == ""


def test_a_refusal_cuts_a_long_subject_with_an_ellipsis_and_a_typo_of_an_option_is_named(gd):
    """'taken by spar': a subject cut bare read as a name. And `gitdrop version` was
    answered with 'verify'."""
    from gitdrop import fmt
    long = "lease 7dfb56e9 on src/api/users/handlers/v2/serializers.py (exclusive) taken by spartan"
    assert fmt.commit_named("", long) == f'(new) "{long[:71]}…"'
    assert fmt.commit_named("a" * 40, "short") == f'{"a" * 12} "short"'
    r = gd("version")
    assert r.rc == 2 and "Did you mean '--version'?" in r.err, r


def test_work_says_when_it_registers_its_agent(gd, team):
    """`gitdrop work --as core/scuot` (a typo) made a new agent without a word."""
    r = gd("--as", "core/scuot", "work", "--once", "--", "true")
    assert "core/scuot was not registered in lobby: registered it now" in r.err, r
    r = gd("--as", "core/scuot", "work", "--once", "--", "true")
    assert "registered it now" not in r.err, r


def test_room_settings_line_up_and_say_what_each_means(gd, team):
    """The values did not line up, and nothing said what a setting meant or its unit."""
    from gitdrop import model
    out = gd.ok("room", "settings").out.splitlines()
    assert len(out) == len(model.DEFAULT_SETTINGS)
    assert len({ln.index(str(model.DEFAULT_SETTINGS[ln.split()[0]])) + len(str(
        model.DEFAULT_SETTINGS[ln.split()[0]])) for ln in out}) == 1, out   # right-aligned
    assert all(len(ln.split()) > 2 for ln in out), out   # each says what it is


# `gitdrop inbox`, dying as SIGKILL does right after its read cursor moved.
_KILLED_AFTER_THE_MARK = (
    "import os, sys\n"
    "from gitdrop import core\n"
    "mark = core.Room._mark_read\n"
    "core.Room._mark_read = lambda *a, **k: (mark(*a, **k), os._exit(137))\n"
    "from gitdrop.cli.main import main\n"
    "sys.argv[0] = 'gitdrop'\n"
    "main()\n")


def test_an_inbox_killed_as_it_marks_its_messages_read_has_shown_them(gd, team):
    """The messages were marked read, then printed: killed between the two, they were
    never shown, and the next inbox said there was nothing new."""
    team.send("core/juno", "core/spartan", "the build is red")
    p = subprocess.run([sys.executable, "-c", _KILLED_AFTER_THE_MARK, "--as", "core/spartan",
                        "inbox"], env=gd.env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 137 and "the build is red" in p.stdout, (p.stdout, p.stderr)
    assert "nothing new" in gd.ok("--as", "core/spartan", "inbox").out


def test_a_refusals_next_step_keeps_the_as_and_room_it_was_given(gd, team, lobby):
    """The fix said `gitdrop inbox`: pasted, it read the environment's agent's inbox
    (or the lobby's), not the one that was refused. A step for someone else keeps
    its own (no --as of the caller's)."""
    team.send("core/juno", "core/kai", "the build is red")
    doc = gd.refused(3, "unread-before-send", "--as", "core/kai", "send", "juno", "-m", "ok")
    assert "(gitdrop --as core/kai inbox)" in doc["fix"], doc
    lobby.register("web/wen", ["lead"])
    lobby.register("web/ali", ["coder"])
    tid = gd.js("task", "create", "cross", "--assign", "web/ali")["id"]
    doc = gd.refused(3, "task-state-machine", "--as", "core/spartan", "task", "sign", tid)
    assert f"ask core/juno and web/wen to sign it (gitdrop task sign {tid})" in doc["fix"], doc
    doc = gd.refused(3, "dual-sign", "--as", "core/juno", "task", "sign", "--room", "lobby",
                     gd.js("task", "create", "one team", "--assign", "kai")["id"])
    assert "nothing to sign" in doc["fix"], doc
    tid = gd.js("task", "create", "theirs", "--assign", "web/ali")["id"]
    doc = gd.refused(3, "task-state-machine", "--as", "core/kai", "task", "cancel", tid)
    assert doc["fix"] == "ask core/juno (its creator, a lead) or web/wen (a lead) " \
        "to do it", doc


def test_a_next_step_never_shows_the_hubs_password(gd):
    """The --hub given went into every next step, password and all, on stderr and in
    --json (docs/TRANSPORTS.md keeps it out of messages)."""
    url = "http://core%2Fjuno:s3cret@127.0.0.1:9/hub.git"
    r = gd("--hub", url, "--as", "core/juno", "send", "kai", "the build is red")
    assert r.rc == 2 and "gitdrop --hub http://core%2Fjuno@127.0.0.1:9/hub.git --as " \
        "core/juno send kai -m 'the build is red'" in r.err, r
    assert "s3cret" not in r.err + r.out


def test_a_send_with_its_text_last_is_told_to_put_it_after_m(gd, team):
    """`gitdrop send kai "the text"` read the text as a second recipient, then waited
    on stdin or said the message was empty."""
    r = gd("--as", "core/juno", "send", "kai", "the build is red")
    assert r.rc == 2 and "no recipient" in r.err, r
    assert "gitdrop --as core/juno send kai -m 'the build is red'" in r.err, r
    r = gd("--as", "core/juno", "send", "kai", "hi", input="")
    assert r.rc == 2 and "gitdrop --as core/juno send kai -m hi" in r.err, r
    r = gd("--as", "core/juno", "send", "kai", "the build", "--task", "4", "--cc", "spartan")
    assert "send kai --cc spartan --task 4 -m 'the build'" in r.err, r   # its options kept
    assert gd.ok("--as", "core/juno", "send", "kai", "-m", "hi").rc == 0
