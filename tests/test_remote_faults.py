"""Faults around a hub given as a URL, met by the real `gitdrop` command line and
real servers on 127.0.0.1 (git daemon, a port that never answers, file://):

- a command stopped by SIGTERM or SIGHUP while git talks to a hub that stalls ends
  git with it (git runs in a session of its own, which no signal to the command
  reaches), says so, exits 128 + the signal, and keeps the writes it had queued;
- an archived room whose ref names a blob is rule damaged (exit 8), not a traceback;
- a hub that serves files the rules refuse (it runs without gitdrop's hook) stops a
  sync as the hub's damage, naming the hub and the file, and leaves the queue as it
  was: the queued writes are not blamed for it."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from gitdrop import hub as hubmod
from test_offline import Daemon, Silent, texts

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def served(tmp_path):
    """git daemon on 127.0.0.1 serving a hub whose lobby has juno (its lead) and kai."""
    d = Daemon(tmp_path).start()
    for who in ("core/juno", "core/kai"):
        d.hub.room("lobby").register(who, ["lead"] if who == "core/juno" else [])
    yield d
    d.stop()


def env_for(tmp_path, **extra) -> dict:
    return dict(os.environ, GITDROP_CACHE=str(tmp_path / "cache"), GITDROP_REMOTE_FRESH="0",
                NO_COLOR="1", HOME=str(tmp_path), **extra)


def gitdrop(tmp_path, hub: str, *args, env=None):
    """One `gitdrop --hub HUB --json ARGS` run: (exit code, its JSON document, stderr)."""
    p = subprocess.run([sys.executable, "-m", "gitdrop", "--hub", hub, "--json", *args],
                       capture_output=True, text=True, cwd=ROOT, timeout=60,
                       env=env_for(tmp_path, **(env or {})))
    assert "Traceback" not in p.stderr, p.stderr
    return p.returncode, json.loads(p.stdout), p.stderr


# --- stopped by a signal while git talks to the hub ---------------------------------

def descendants(pid: int) -> dict:
    """{pid: command line} of every live process below `pid`, from /proc."""
    parents = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            fields = stat.rpartition(")")[2].split()
            if fields[0] != "Z":
                parents[int(name)] = int(fields[1])
    found, todo = {}, [pid]
    while todo:
        top = todo.pop()
        for child, parent in parents.items():
            if parent == top and child not in found:
                found[child] = cmdline(child)
                todo.append(child)
    return found


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def alive(pid: int, line: str) -> bool:
    """Still running (not a zombie) as the same program."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z" and cmdline(pid) == line


def stop_while_git_runs(tmp_path, hub: str, args, verb: str, signum: int, ready=None):
    """Start `gitdrop ARGS`, wait until its `git VERB` runs (and `ready()`), send
    `signum`: (exit code, stdout, stderr, the git processes that outlived it)."""
    p = subprocess.Popen([sys.executable, "-m", "gitdrop", "--hub", hub, "--json", *args],
                         cwd=ROOT, env=env_for(tmp_path), stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         # Ctrl-C as a terminal sends it, even where the run was started
                         # with SIGINT ignored (a background job inherits that)
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    kids = {}
    try:
        deadline = time.monotonic() + 30
        while not any(f"git {verb}" in line for line in kids.values()) or \
                (ready is not None and not ready()):
            assert p.poll() is None and time.monotonic() < deadline, p.communicate()
            time.sleep(0.05)
            kids = descendants(p.pid)
        p.send_signal(signum)
        out, err = p.communicate(timeout=30)
        left = {pid: line for pid, line in kids.items() if alive(pid, line)}
        return p.returncode, out, err, left
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
        for pid, line in kids.items():   # what the command started: never left behind
            if alive(pid, line):
                os.kill(pid, signal.SIGKILL)


def stall_pushes(served, tmp_path) -> str:
    """The served hub's hook takes a push and never answers; returns the file where
    it writes its pid once a push has reached it."""
    hook = os.path.join(served.hub.path, "hooks", "pre-receive")
    os.rename(hook, hook + ".real")
    reached = str(tmp_path / "reached")
    with open(hook, "w") as f:
        f.write(f"#!/bin/sh\necho $$ > {reached}.tmp\nmv {reached}.tmp {reached}\n"
                "exec sleep 60\n")
    os.chmod(hook, 0o755)
    return reached


def end_stall(served, reached: str) -> None:
    """The hub's own hook back, and the stalled one ended (it ignores SIGTERM, as
    git's hooks may)."""
    hook = os.path.join(served.hub.path, "hooks", "pre-receive")
    os.replace(hook + ".real", hook)
    if os.path.exists(reached):
        with open(reached) as f:
            pid = int(f.read())
        if cmdline(pid).startswith("sleep"):
            os.kill(pid, signal.SIGKILL)


def test_sigterm_mid_sync_ends_git_push_and_keeps_the_queue(served, tmp_path):
    assert gitdrop(tmp_path, served.url, "who")[0] == 0      # the mirror, while it answers
    served.stop()
    rc, doc, _ = gitdrop(tmp_path, served.url, "send", "core/kai", "-m", "from the train",
                         "--as", "core/juno", env={"GITDROP_OFFLINE": "queue"})
    assert rc == 0 and doc["queued"] is True and doc["queue_ids"] == [1]
    served.start()
    reached = stall_pushes(served, tmp_path)
    try:
        rc, out, err, left = stop_while_git_runs(tmp_path, served.url, ["sync"], "push",
                                                 signal.SIGTERM,
                                                 lambda: os.path.exists(reached))
    finally:
        end_stall(served, reached)
    assert left == {}, f"git outlived the command: {left}"
    doc = json.loads(out)
    assert rc == 128 + signal.SIGTERM and doc["rule"] == "stopped", (rc, doc, err)
    assert "stopped by SIGTERM" in doc["reason"] and "offline queue" in doc["fix"]
    assert "gitdrop: stopped" in err
    # nothing lost: the write is still queued, and lands once the hub takes pushes
    rc, doc, _ = gitdrop(tmp_path, served.url, "status")
    assert [e["id"] for e in doc["queue"]] == [1], doc
    rc, doc, _ = gitdrop(tmp_path, served.url, "sync")
    assert rc == 0 and [e["id"] for e in doc["synced"]] == [1], doc
    assert texts(served.hub) == ["from the train"]


@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGINT])
def test_a_stop_while_fetching_from_a_hub_that_never_answers_ends_git_fetch(tmp_path, signum):
    """SIGHUP, and Ctrl-C: it printed a traceback, and left git and ssh running."""
    silent = Silent()
    try:
        url = f"git://127.0.0.1:{silent.port}/hub.git"
        rc, out, err, left = stop_while_git_runs(tmp_path, url, ["who"], "fetch", signum)
    finally:
        silent.close()
    assert left == {}, f"git outlived the command: {left}"
    doc = json.loads(out)
    assert rc == 128 + signum and doc["rule"] == "stopped", (rc, doc, err)
    assert f"stopped by {signal.Signals(signum).name}" in doc["reason"]
    assert "Traceback" not in err


# --- an archived room whose ref names no commit ---------------------------------------

def test_an_archived_room_whose_ref_names_a_blob_is_damaged_not_a_traceback(tmp_path):
    path = str(tmp_path / "hub.git")
    h = hubmod.init(path)
    h.create_room("hub/admin", "dev", [], open_=True)
    h.room("dev").register("core/juno", ["lead"])
    h.archive_room("dev", "hub/admin")
    blob = subprocess.run(["git", "--git-dir", path, "hash-object", "-w", "--stdin"],
                          input="not a commit\n", capture_output=True, text=True,
                          check=True).stdout.strip()
    subprocess.run(["git", "--git-dir", path, "update-ref", "refs/archive/rooms/dev", blob],
                   check=True)
    for args in (["room", "show", "dev"], ["room", "pin", "dev", "--as", "core/juno"],
                 ["room", "restore", "dev", "--as", "core/juno"],
                 ["verify", "dev", "--archived"]):
        rc, doc, err = gitdrop(tmp_path, path, *args)
        assert rc == 8 and doc["rule"] == "damaged", (args, doc)
        assert f"refs/archive/rooms/dev names {blob[:12]}, a blob" in doc["reason"], doc
        assert f"gitdrop --hub {path} repair" in doc["fix"] and "why:" in err, doc
    rc, doc, _ = gitdrop(tmp_path, path, "room", "list", "--archived")
    assert rc == 0 and doc["rooms"][0]["health"] == "damaged", doc
    # the fix it names puts the room back
    rc, doc, _ = gitdrop(tmp_path, path, "repair", "--apply")
    assert rc == 0, doc
    rc, doc, _ = gitdrop(tmp_path, path, "room", "show", "dev")
    assert rc == 0 and doc["room"]["room"] == "dev", doc


# --- a hub that serves what the rules refuse, at sync --------------------------------

def git(*args, cwd):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def raw_push(path: str, work: str, change, subject: str) -> None:
    """A commit pushed as it is to a hub that runs no hook."""
    if not os.path.isdir(work):
        git("clone", "-q", "-b", "rooms/lobby", path, work, cwd=os.path.dirname(work))
    change(work)
    git("add", "-A", cwd=work)
    git("-c", "user.name=core/juno", "-c", "user.email=j@x", "commit", "-qm", subject,
        cwd=work)
    git("push", "-q", "origin", "HEAD:rooms/lobby", cwd=work)


def edit(rel: str, old: str, new: str):
    def change(work):
        name = rel if os.path.exists(os.path.join(work, rel)) else \
            subprocess.run(["git", "ls-files", f"*/{os.path.basename(rel)}"], cwd=work,
                           capture_output=True, text=True).stdout.split()[0]
        full = os.path.join(work, name)
        with open(full) as f:
            text = f.read()
        assert old in text, text
        with open(full, "w") as f:
            f.write(text.replace(old, new, 1))
    return change


DAMAGE = {   # what the hub's files become, the file named, the writes queued before
    "room.toml": (edit("room.toml", "[leads]", 'leads = "x"\n[other]'), "room.toml",
                  [["send", "core/kai", "-m", "one", "--as", "core/juno"],
                   ["send", "core/kai", "-m", "two", "--as", "core/juno"]]),
    "a setting": (edit("room.toml", "[settings]", '[settings]\nclock_skew = "30"'),
                  "setting clock_skew", [["send", "core/kai", "-m", "one", "--as",
                                          "core/juno"]]),
    "a task": (edit("1.md", 'state = "pending"', "state = 5"), "1.md",
               [["task", "claim", "1", "--as", "core/kai"],
                ["send", "core/juno", "-m", "mine", "--as", "core/kai"]]),
}


@pytest.mark.parametrize("what", list(DAMAGE))
def test_a_hub_serving_what_the_rules_refuse_stops_sync_and_blames_not_the_queue(
        tmp_path, what):
    damage, named, writes = DAMAGE[what]
    path = str(tmp_path / "hub.git")
    h = hubmod.init(path)
    lobby = h.room("lobby")
    lobby.register("core/juno", ["lead"])
    lobby.register("core/kai")
    lobby.create_task("core/juno", "one")
    os.remove(os.path.join(path, "hooks", "pre-receive"))   # a server without the hook
    url = "file://" + path
    assert gitdrop(tmp_path, url, "who")[0] == 0
    os.rename(path, path + ".away")                          # unreachable: writes queue
    for args in writes:
        rc, doc, _ = gitdrop(tmp_path, url, *args, env={"GITDROP_OFFLINE": "queue"})
        assert rc == 0 and doc["queued"] is True, doc
    os.rename(path + ".away", path)
    work = str(tmp_path / "w")
    raw_push(path, work, damage, "odd")
    queue = gitdrop(tmp_path, url, "status")[1]["queue"]
    assert [e["id"] for e in queue] == list(range(1, len(writes) + 1))

    rc, doc, err = gitdrop(tmp_path, url, "sync")
    assert rc == 8 and doc["rule"] == "damaged", (rc, doc, err)
    assert f"the hub {url} serves damaged state" in doc["reason"], doc
    assert named in doc["reason"] and "stay queued" in doc["reason"], doc
    assert "gitdrop verify" in doc["fix"] and "queue was left as it is" in doc["fix"], doc
    assert gitdrop(tmp_path, url, "status")[1]["queue"] == queue   # untouched, not refused

    git("-c", "user.name=core/juno", "-c", "user.email=j@x", "revert", "--no-edit", "HEAD",
        cwd=work)   # the hub mended: the queue goes
    git("push", "-q", "origin", "HEAD:rooms/lobby", cwd=work)
    rc, doc, err = gitdrop(tmp_path, url, "sync")
    assert rc == 0 and [e["id"] for e in doc["synced"]] == [e["id"] for e in queue], doc
