"""Shared fixtures: a real hub with the real hooks, and clones that push to it."""

import fcntl
import glob
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading

import pygit2
import pytest

from gitdrop import hub as hubmod
from gitdrop import model
from gitdrop.errors import Refusal
from gitdrop.store import Reader
from gitdrop.verify import check_commits


# --- running in parallel (pytest-xdist) ------------------------------------------------

WORKERS_CAP = 4   # 2 a core: most tests wait on processes, sleeps and IO, not the CPU


# A run started where SIGINT is ignored (a background job of a shell without job
# control, nohup) passed that on to every command the tests start: those that test
# Ctrl-C sent it to a program that could not hear it. Python's own handler here;
# the commands, started from this process, begin with the default.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """`-n auto` (addopts): two workers a core, at most WORKERS_CAP; for test files
    named on the command line no more than one a file, and none for one file (starting
    workers would cost more than it saves). PYTEST_XDIST_AUTO_NUM_WORKERS, or -n N,
    still decide."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    n = min(WORKERS_CAP, 2 * len(os.sched_getaffinity(0)))
    files = {a.split("::")[0] for a in config.args}
    if all(os.path.isfile(f) for f in files):
        n = min(n, len(files))
    return n if n > 1 else 0


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    """A test module's asserts, rewritten by pytest, are cached (in __pycache__, as
    `*-pytest-*.pyc`) even under PYTHONDONTWRITEBYTECODE=1: without it every worker of
    every run rewrote every module again, seconds of CPU each before the first test.
    Only while test modules are imported; the commands the tests start are not
    concerned (the variable stays in their environment)."""
    if not isinstance(collector, pytest.Module) or not sys.dont_write_bytecode:
        return (yield)
    sys.dont_write_bytecode = False
    try:
        return (yield)
    finally:
        sys.dont_write_bytecode = True


TERMINAL_VARS = ("COLUMNS", "LINES")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    node.workerinput["terminal_vars"] = {k: os.environ.get(k) for k in TERMINAL_VARS}


def pytest_configure(config):
    """A worker's readline exports COLUMNS=80 and LINES=24 (it has no terminal), and the
    commands the tests start would format to them: the run's own values instead."""
    for k, v in getattr(config, "workerinput", {}).get("terminal_vars", {}).items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def _shared_fixture(item) -> str:
    """The module-scoped fixture of the test's own module it uses (a served hub, a
    big room), with its parameter: "" if none."""
    module = item.nodeid.split("::")[0]
    params = getattr(getattr(item, "callspec", None), "params", {})
    for name, defs in sorted(item._fixtureinfo.name2fixturedefs.items()):
        if defs and defs[-1].scope == "module" and defs[-1].baseid == module:
            return f"{module}:{name}" + (f"-{params[name]}" if name in params else "")
    return ""


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """The tests marked alone queue on one worker (see pytest_runtest_protocol); so do
    those that share a module-scoped fixture, which is then set up once, not once a
    worker (a server of test_transports or test_githosts takes seconds to start)."""
    for item in items:
        if item.get_closest_marker("xdist_group"):
            continue
        group = "alone" if item.get_closest_marker("alone") else _shared_fixture(item)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))
    _tell_the_groups(config, items)


# xdist's --dist loadgroup reads a test's group from its id (`id@group`), which its
# worker sets in a hook that runs before this file's (the groups added above were never
# seen) and, on pytest 9, through an attribute the id no longer comes from: every group
# was spread over the workers, each of them starting the group's server or building its
# big room. Here each worker writes the groups it collected to the run's directory, and
# the controller's scheduler (xdist's loadgroup scheduling, the group read from there)
# sends each group's tests to one worker; the ids stay as they are.

def _group_file(run: str, worker: str) -> str:
    return os.path.join(run, f"xdist-groups-{worker}.json")


def _tell_the_groups(config, items) -> None:
    worker, basetemp = os.environ.get("PYTEST_XDIST_WORKER"), config.option.basetemp
    if not worker or not basetemp:
        return
    groups = {}
    for item in items:
        names = {str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                 for m in item.iter_markers("xdist_group")}
        if names:
            groups[item.nodeid] = "_".join(sorted(names))
    path = _group_file(os.path.dirname(os.path.abspath(basetemp)), worker)
    with open(path + ".tmp", "w") as f:
        json.dump(groups, f)
    os.replace(path + ".tmp", path)   # whole, before the worker reports its collection


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        """Load scheduling, a group's tests to one worker (the workers' files)."""
        groups = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:   # asked once every worker has collected
                run = str(config._tmp_path_factory.getbasetemp())
                found = sorted(glob.glob(_group_file(run, "*")))
                self.groups = {}
                if found:   # the workers collected the same tests: any one's file
                    with open(found[0]) as f:
                        self.groups = json.load(f)
            return "@" + self.groups[nodeid] if nodeid in self.groups else nodeid

    return GroupScheduling(config, log)


_held = None   # the lock, kept from an alone test to the alone test this worker runs next


def _is_alone(item) -> bool:
    return item is not None and item.get_closest_marker("alone") is not None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A test marked alone (it measures a latency or a wait that other tests' load would
    stretch) runs, fixtures and all, while no other test of the run does; the others
    share. A readers-writer lock of the run's workers, whose --basetemp is one directory
    each in the run's: the gate holds new tests back while an alone one waits for the
    running ones to end. Alone tests that follow each other on a worker (they are one
    group) keep the lock from one to the next: the others wait for the running tests
    to end once, not once each."""
    global _held
    basetemp = item.config.option.basetemp
    if not os.environ.get("PYTEST_XDIST_WORKER") or not basetemp:
        yield
        return
    run = os.path.dirname(os.path.abspath(basetemp))
    alone = _is_alone(item)
    if _held is not None:   # the alone test before this one kept it (this one is alone)
        lock, _held = _held, None
    else:
        lock = open(os.path.join(run, "alone.lock"), "a")
        with open(os.path.join(run, "alone.gate"), "a") as gate:
            fcntl.flock(gate, fcntl.LOCK_EX)
            try:
                fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
            finally:
                fcntl.flock(gate, fcntl.LOCK_UN)
    try:
        yield
    finally:
        if alone and _is_alone(nextitem):
            _held = lock
        else:
            fcntl.flock(lock, fcntl.LOCK_UN)
            lock.close()


@pytest.fixture(autouse=True, scope="session")
def _own_home(tmp_path_factory):
    """A home of the suite's own: a test that ran `gitdrop work` without one wrote its
    ledger under the ~/.gitdrop of whoever ran the suite. git keeps reading that
    person's own config (its identity) through GIT_CONFIG_GLOBAL."""
    was = {k: os.environ.get(k) for k in ("HOME", "GIT_CONFIG_GLOBAL")}
    real = os.path.join(os.path.expanduser("~"), ".gitconfig")
    if was["GIT_CONFIG_GLOBAL"] is None and os.path.exists(real):
        os.environ["GIT_CONFIG_GLOBAL"] = real
    os.environ["HOME"] = str(tmp_path_factory.mktemp("home"))
    try:
        yield
    finally:
        for k, v in was.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(autouse=True)
def _own_remote_cache(tmp_path_factory, monkeypatch):
    """Each test its own GITDROP_CACHE (remote hubs' mirrors), never ~/.gitdrop/remotes:
    tests in parallel, or a stale mirror of an earlier run, would share one."""
    monkeypatch.setenv("GITDROP_CACHE", str(tmp_path_factory.mktemp("remotes")))


_ports_lock = threading.Lock()
_ports = None


def _port_slice() -> range:
    """Ports below the kernel's ephemeral range (which neither bind(0) nor an outgoing
    connection takes from), one slice per xdist worker: no two workers pick the same."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            top = min(int(f.read().split()[0]), 32768)
    except (OSError, ValueError, IndexError):
        top = 32768
    base = 10000 if top - 10000 >= 4000 else 1024
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:]
    n = int(worker) if worker.isdigit() else 0
    count = max(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")), n + 1)
    size = (top - base) // count
    return range(base + n * size, base + (n + 1) * size)


def _candidates():
    ports = _port_slice()
    start = random.Random().randrange(len(ports))   # two runs at once rarely meet
    while True:
        for i in range(len(ports)):
            yield ports[(start + i) % len(ports)]


def free_port() -> int:
    """A port of 127.0.0.1 for a server a test starts, that nothing listens on and that
    this run hands out once: from this worker's slice, checked by a bind."""
    global _ports
    with _ports_lock:
        if _ports is None:
            _ports = _candidates()
        for _ in range(1000):
            port = next(_ports)
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            return port
    raise RuntimeError("no free port on 127.0.0.1")


@pytest.fixture
def hub(tmp_path):
    return hubmod.init(str(tmp_path / "hub.git"))


@pytest.fixture
def lobby(hub):
    return hub.room("lobby")


@pytest.fixture
def team(lobby):
    """A lead and two coders of team core in the lobby."""
    lobby.register("core/juno", ["lead"])
    lobby.register("core/spartan", ["coder"])
    lobby.register("core/kai", ["coder"])
    return lobby


def git(*args, cwd=None, env=None, check=True):
    e = dict(os.environ, GIT_TERMINAL_PROMPT="0")
    e.update(env or {})
    p = subprocess.run(["git", *args], cwd=cwd, env=e, capture_output=True, text=True)
    if check and p.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed: {p.stderr}")
    return p


class Clone:
    """A working clone of one room, committing as one agent."""

    def __init__(self, url, path, room="lobby", agent="core/juno"):
        self.path, self.room, self.url = str(path), room, url
        git("clone", "-q", "-b", f"rooms/{room}", url, self.path)
        self.as_(agent)

    def as_(self, agent):
        git("config", "user.name", agent, cwd=self.path)
        git("config", "user.email", f"{agent.replace('/', '.')}@example.org", cwd=self.path)
        return self

    def pull(self):
        git("fetch", "-q", "origin", cwd=self.path)
        git("reset", "-q", "--hard", f"origin/rooms/{self.room}", cwd=self.path)
        return self

    def write(self, path, text):
        full = os.path.join(self.path, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w") as f:
            f.write(text)
        return self

    def read(self, path):
        with open(os.path.join(self.path, path)) as f:
            return f.read()

    def delete(self, path):
        os.remove(os.path.join(self.path, path))
        return self

    def commit(self, message, allow_empty=False):
        git("add", "-A", cwd=self.path)
        git("commit", "-q", "--allow-empty" if allow_empty else "--no-allow-empty", "-m", message,
            cwd=self.path)
        return git("rev-parse", "HEAD", cwd=self.path).stdout.strip()

    def push(self):
        p = git("push", "origin", f"HEAD:rooms/{self.room}", cwd=self.path, check=False)
        return p.returncode == 0, p.stderr

    def local_verdict(self, base):
        """The in-process verdict (pygit2 reader, same rules) on the clone's new commits."""
        repo = pygit2.Repository(self.path)
        head = str(repo.head.target)
        try:
            check_commits(Reader(repo), model.ROOM_PREFIX + self.room, base, head)
        except Refusal as e:
            return e.rule
        return None

    def head(self):
        return git("rev-parse", "HEAD", cwd=self.path).stdout.strip()


@pytest.fixture
def clone(hub, tmp_path):
    made = []

    def make(agent="core/juno", room="lobby"):
        c = Clone(hub.path, tmp_path / f"clone{len(made)}", room, agent)
        made.append(c)
        return c
    return make


def refused_rule(stderr: str) -> str | None:
    for line in stderr.splitlines():
        if "refused by rule " in line:
            return line.split("refused by rule ", 1)[1].split()[0]
    return None
