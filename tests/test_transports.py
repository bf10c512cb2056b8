"""A hub served over git's own transports on 127.0.0.1: git daemon (no identity),
smart HTTP through gitdrop.httpd (Basic auth: a users file and gitdrop tokens) and
SSH through a real sshd with forced `gitdrop-shell team/name` keys. Each transport:
a clone, core writes through the remote hub client, a raw push of a task file, a
refused push that leaves no trace, and two claimers racing for one task."""

import getpass
import io
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from gitdrop import fmt, model, tokens
from gitdrop.transports import httpd, remote, shell
from gitdrop import hub as hubmod
from gitdrop.errors import Refusal
from gitdrop.transports.remote import RemoteHub

from conftest import Clone, free_port, git, refused_rule

AGENTS = ("core/juno", "core/spartan")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def wait_for_port(port: int, proc: subprocess.Popen, what: str, timeout: float = 20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited: {proc.stderr.read() if proc.stderr else ''}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on {port}")


def stop(proc: subprocess.Popen):
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)   # its own session: the server and its children
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


class Served:
    """A hub behind one transport; how each agent reaches it."""

    kind = ""
    authenticates = True

    def __init__(self, base):
        self.base = str(base)
        self.hub = hubmod.init(os.path.join(self.base, "hub.git"))
        self.procs = []

    def url(self, agent: str) -> str:
        raise NotImplementedError

    def client(self, agent: str, cache, **kw) -> RemoteHub:
        return RemoteHub(self.url(agent), cache=str(cache), **kw)

    def close(self):
        for p in self.procs:
            stop(p)

    def spawn(self, cmd, **kw):
        p = subprocess.Popen(cmd, start_new_session=True, stdin=subprocess.DEVNULL, **kw)
        self.procs.append(p)
        return p


class Daemon(Served):
    kind = "daemon"
    authenticates = False

    def start(self):
        self.port = free_port()
        p = self.spawn(["git", "daemon", "--reuseaddr", "--listen=127.0.0.1",
                        f"--port={self.port}", f"--base-path={self.base}", "--export-all",
                        "--enable=receive-pack", "--init-timeout=20", "--timeout=60",
                        "--max-connections=64", self.base],   # as docs/TRANSPORTS.md runs it
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        wait_for_port(self.port, p, "git daemon")
        return self

    def url(self, agent):
        return f"git://127.0.0.1:{self.port}/hub.git"


class Http(Served):
    kind = "http"

    def start(self):
        self.users = os.path.join(self.base, "users")
        # juno logs in from the users file, spartan with a gitdrop token of the hub
        out = subprocess.run([sys.executable, "-m", "gitdrop.transports.httpd", self.hub.path, "--users",
                              self.users, "--add-user", "core/juno"], capture_output=True,
                             text=True, check=True, cwd=ROOT)
        self.secrets = {"core/juno": out.stdout.strip(),
                        "core/spartan": tokens.mint(self.hub.path, "core/spartan")}
        self.port = free_port()
        p = self.spawn([sys.executable, "-m", "gitdrop.transports.httpd", self.hub.path, "--port",
                        str(self.port), "--users", self.users, "--quiet"], cwd=ROOT,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert p.stdout.readline().startswith("serving ")
        wait_for_port(self.port, p, "gitdrop.httpd")
        return self

    def url(self, agent, secret=None):
        user = agent.replace("/", "%2F")
        return f"http://{user}:{secret or self.secrets[agent]}@127.0.0.1:{self.port}/hub.git"


def ssh_client_config(path: str, hosts, port: int, user: str, ctl: str,
                      persist: int = 0) -> None:
    """An ssh config with one alias per identity [(alias, key file)], each multiplexed
    over one connection (ControlPath under `ctl`, a short path)."""
    with open(path, "w") as f:
        for alias, key in hosts:
            f.write(f"""Host {alias}
  HostName 127.0.0.1
  Port {port}
  User {user}
  IdentityFile {key}
  IdentitiesOnly yes
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  BatchMode yes
  LogLevel ERROR
  ControlMaster auto
  ControlPath {ctl}/%n
""" + (f"  ControlPersist {persist}\n" if persist else ""))


def _sshd() -> str:
    found = shutil.which("sshd") or ("/usr/sbin/sshd" if os.path.exists("/usr/sbin/sshd") else "")
    if not found and os.geteuid() == 0:   # what CI's setup step does, for a bare checkout
        subprocess.run(["sh", os.path.join(ROOT, ".ci", "setup.d", "10-sshd.sh")],
                       capture_output=True, timeout=300)
        found = "/usr/sbin/sshd" if os.path.exists("/usr/sbin/sshd") else ""
    return found


def _gitdrop_shell_dir(base: str) -> str:
    """Where sshd's session finds gitdrop-shell: the installed console script, else a shim."""
    here = os.path.dirname(sys.executable)
    if os.path.exists(os.path.join(here, "gitdrop-shell")):
        return here
    d = os.path.join(base, "bin")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "gitdrop-shell"), "w") as f:
        f.write(f"#!/bin/sh\nexec {sys.executable} -m gitdrop.transports.shell \"$@\"\n")
    os.chmod(os.path.join(d, "gitdrop-shell"), 0o755)
    return d


class Ssh(Served):
    kind = "ssh"

    def start(self):
        sshd = _sshd()
        if not sshd:
            pytest.skip("sshd is not installed and could not be installed "
                        "(apt-get install openssh-server; see .ci/setup.d/10-sshd.sh)")
        d = self.keys = os.path.join(self.base, "ssh")
        os.makedirs(d)
        # ControlPath sockets need a short path
        self.ctl = tempfile.mkdtemp(prefix="gd-ssh-")
        keygen = ["ssh-keygen", "-q", "-t", "ed25519", "-N", ""]
        subprocess.run(keygen + ["-f", f"{d}/host_key"], check=True)
        lines = []
        for agent in AGENTS + ("core/kai",):
            name = agent.split("/")[1]
            subprocess.run(keygen + ["-f", f"{d}/{name}"], check=True)
            with open(f"{d}/{name}.pub") as f:
                pub = f.read().strip()
            if agent != "core/kai":   # kai's key is not authorized
                lines.append(f'command="gitdrop-shell {agent}",restrict {pub}\n')
        with open(f"{d}/authorized_keys", "w") as f:
            f.writelines(lines)
        self.port = free_port()
        user = getpass.getuser()
        with open(f"{d}/sshd_config", "w") as f:
            f.write(f"""Port {self.port}
ListenAddress 127.0.0.1
HostKey {d}/host_key
PidFile {d}/sshd.pid
AuthorizedKeysFile {d}/authorized_keys
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PermitRootLogin prohibit-password
AllowUsers {user}
SetEnv GITDROP_HUB={self.hub.path} PATH={_gitdrop_shell_dir(self.base)}:/usr/local/bin:/usr/bin:/bin
LogLevel ERROR
""")
        # One alias per identity, each multiplexed over one connection (sshd is slow
        # to start a session on a busy machine).
        names = [agent.split("/")[1] for agent in AGENTS + ("core/kai",)]
        ssh_client_config(f"{d}/config", [(f"{n}.gitdrop", f"{d}/{n}") for n in names],
                          self.port, user, self.ctl)
        if os.geteuid() == 0:
            os.makedirs("/run/sshd", exist_ok=True)   # sshd's privilege-separation directory
        p = self.spawn([sshd, "-D", "-e", "-f", f"{d}/sshd_config"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        wait_for_port(self.port, p, "sshd")
        self.ssh = ["ssh", "-F", f"{d}/config"]
        self.old_env = os.environ.get("GIT_SSH_COMMAND")
        os.environ["GIT_SSH_COMMAND"] = " ".join(self.ssh)
        for agent in AGENTS:   # the multiplexing masters, ended in close()
            subprocess.run(self.ssh + ["-M", "-N", "-f", agent.split("/")[1] + ".gitdrop"],
                           check=True, timeout=30, stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return self

    def url(self, agent):
        return f"ssh://{agent.split('/')[1]}.gitdrop{self.hub.path}"

    def plain_env(self, agent):
        """The one-line form users start with: a key and a port, no ssh config."""
        key = f"{self.keys}/{agent.split('/')[1]}"
        return {"GIT_SSH_COMMAND": f"ssh -i {key} -p {self.port} -o IdentitiesOnly=yes "
                "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes "
                "-o LogLevel=ERROR"}

    def close(self):
        if not hasattr(self, "ssh"):   # skipped or failed before sshd started
            return super().close()
        for agent in AGENTS:
            subprocess.run(self.ssh + ["-O", "exit", agent.split("/")[1] + ".gitdrop"],
                           capture_output=True, timeout=10)
        if self.old_env is None:
            os.environ.pop("GIT_SSH_COMMAND", None)
        else:
            os.environ["GIT_SSH_COMMAND"] = self.old_env
        super().close()
        shutil.rmtree(self.ctl, ignore_errors=True)


@pytest.fixture(scope="module", params=["daemon", "http", "ssh"])
def served(request, tmp_path_factory):
    cls = {"daemon": Daemon, "http": Http, "ssh": Ssh}[request.param]
    s = cls(tmp_path_factory.mktemp(request.param))
    try:
        yield s.start()
    finally:
        s.close()


_rooms = itertools.count(1)


@pytest.fixture
def room(served):
    """A fresh open room per test, so the tests of one served hub stay apart."""
    name = f"r{next(_rooms)}"
    served.hub.create_room("hub/admin", name, open_=True)
    return name


@pytest.fixture
def team(served, room):
    """juno (lead) and spartan, registered on the hub's own machine."""
    for agent, roles in zip(AGENTS, (["lead"], ["coder"])):
        served.hub.room(room).register(agent, roles)
    return room


def snapshot(path):
    refs = git("for-each-ref", "--format=%(refname) %(objectname)", cwd=path).stdout
    objs = git("cat-file", "--batch-all-objects", "--batch-check=%(objectname)", cwd=path).stdout
    return refs, set(objs.split())


def task_file(tid, creator, body="Do the thing."):
    return fmt.dumps_doc({"id": str(tid), "title": f"task {tid}", "state": "pending",
                          "creator": creator}, body)


def test_clone(served, room, tmp_path):
    env = served.plain_env("core/juno") if served.kind == "ssh" else {}
    url = f"ssh://127.0.0.1{served.hub.path}" if served.kind == "ssh" else served.url("core/juno")
    git("clone", "-q", "-b", f"rooms/{room}", url, str(tmp_path / "c"), env=env)
    with open(tmp_path / "c" / "room.toml") as f:
        assert f'name = "{room}"' in f.read()


def test_core_writes_through_the_remote_hub(served, room, tmp_path):
    hubs = {a: served.client(a, tmp_path / a.split("/")[1]) for a in AGENTS}
    juno, spartan = hubs["core/juno"].room(room), hubs["core/spartan"].room(room)
    juno.register("core/juno", ["lead"])
    spartan.register("core/spartan", ["coder"])
    # juno's mirror may predate spartan's registration: the refusal it would build
    # (unknown recipient) is checked again on a fresh fetch, and the send goes through
    sent = juno.send("core/juno", "core/spartan", "over the wire")
    task = juno.create_task("core/juno", "wire it", assignee="core/spartan")
    server = served.hub.room(room)
    assert server.task(task["id"])["assignee"] == "core/spartan"
    assert served.hub.store.room_tip(room) == task["commit"]
    assert [a["agent"] for a in server.who()] == list(AGENTS)
    hubs["core/spartan"].refresh()     # reads are as of the last fetch (GITDROP_REMOTE_FRESH)
    got = spartan.inbox("core/spartan")                  # a read, then a write (the cursor)
    assert [m["id"] for m in got["messages"] if m["op"] == "send"] == [sent["commit"]]
    assert server.inbox("core/spartan", peek=True)["unread"] == 0
    assert {served.hub.store.reader.commit(x["commit"]).author for x in (sent, task)} == \
        {"core/juno"}
    assert [op for _, op in served.hub.verify(room)][-3:] == ["send", "task-create", "read"]


def test_raw_push_of_a_task_file(served, room, team, tmp_path):
    c = Clone(served.url("core/spartan"), tmp_path / "c", room, "core/spartan")
    # a big, incompressible body: over HTTP a small postBuffer makes git send it chunked
    body = os.urandom(4096).hex()
    c.write(model.task_path(7), task_file(7, "core/spartan", body)).commit("task 7 by hand")
    p = git("-c", "http.postBuffer=1024", "push", "origin", f"HEAD:rooms/{room}",
            cwd=c.path, check=False)
    assert p.returncode == 0, p.stderr
    assert served.hub.store.room_tip(room) == c.head()
    t = served.hub.room(room).task(7)
    assert (t["creator"], t["state"], t["body"].strip()) == ("core/spartan", "pending", body)
    juno = served.client("core/juno", tmp_path / "juno")
    assert [x["id"] for x in juno.room(room).list_tasks()] == ["7"]   # fetched by the client


def test_refused_push_leaves_no_trace(served, room, team, tmp_path):
    c = Clone(served.url("core/juno"), tmp_path / "c", room, "core/juno")
    # over SSH/HTTP juno may not push spartan's work; git daemon knows no one, so
    # there an unregistered author is what the hook refuses
    author, rule = (("core/spartan", "authenticated-pusher") if served.authenticates
                    else ("core/nobody", "registered-author"))
    c.as_(author)
    c.write(model.task_path(9), task_file(9, author)).commit("task 9 as someone else")
    before = snapshot(served.hub.path)
    ok, err = c.push()
    assert not ok and refused_rule(err) == rule, err
    assert "commit:" in err and "why:" in err and "fix:" in err
    assert snapshot(served.hub.path) == before
    assert git("cat-file", "-e", c.head(), cwd=served.hub.path, check=False).returncode != 0
    if served.authenticates:
        # the same refusal through the client, which puts its mirror back
        h = served.client("core/juno", tmp_path / "juno")
        with pytest.raises(Refusal) as e:
            h.room(room).create_task("core/spartan", "not mine to make")
        assert e.value.rule == "authenticated-pusher" and "core/juno" in e.value.reason
        assert h.store.tip(f"refs/heads/rooms/{room}") == served.hub.store.room_tip(room)
        assert snapshot(served.hub.path) == before


def test_two_claimers_one_winner(served, room, team, tmp_path):
    tid = served.hub.room(room).create_task("core/juno", "only one of you")["id"]
    # each claimer on its own machine (its own mirror), both up to date, then racing
    hubs = {a: served.client(a, tmp_path / f"race-{a.split('/')[1]}", fresh=3600)
            for a in AGENTS}
    gate = threading.Barrier(len(hubs))
    results = {}

    def claim(agent):
        room_ = hubs[agent].room(room)
        gate.wait(10)
        try:
            results[agent] = room_.move_task(agent, tid, "claim")
        except Refusal as e:
            results[agent] = e
    threads = [threading.Thread(target=claim, args=(a,)) for a in AGENTS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    won = [a for a, r in results.items() if isinstance(r, dict)]
    lost = [a for a, r in results.items() if isinstance(r, Refusal)]
    assert len(won) == 1 and len(lost) == 1, results
    refusal = results[lost[0]]
    assert refusal.rule == "task-state-machine" and won[0] in refusal.reason
    assert served.hub.room(room).task(tid)["assignee"] == won[0]
    assert hubs[lost[0]].store.lost_races >= 1           # its push lost and was redone
    assert hubs[won[0]].store.lost_races == 0


def test_the_gitdrop_command_takes_the_url(served, team, tmp_path):
    env = dict(os.environ, GITDROP_CACHE=str(tmp_path / "cache"), GITDROP_ROOM=team,
               GITDROP_HUB=served.url("core/juno"))
    gitdrop = [sys.executable, "-m", "gitdrop"]

    def run(*args):
        p = subprocess.run(gitdrop + list(args) + ["--json"], env=env, capture_output=True,
                           text=True, timeout=60, cwd=ROOT)
        return p.returncode, json.loads(p.stdout)
    code, out = run("--as", "core/juno", "send", "spartan", "-m", "from the shell")
    assert code == 0 and out["to"] == ["core/spartan"]
    assert served.hub.room(team).inbox("core/spartan", peek=True)["unread"] == 1
    if served.authenticates:
        code, out = run("--as", "core/spartan", "status", "pretending")
        assert (code, out["rule"]) == (3, "authenticated-pusher")
        # told to act as the login's agent, not to rebase commits it never made by hand
        assert "knows you as core/juno" in out["fix"] and "rebase" not in out["fix"], out
    # status names the hub, never its password (it is pasted and logged)
    p = subprocess.run(gitdrop + ["--as", "core/juno", "status"], env=env, capture_output=True,
                       text=True, timeout=60, cwd=ROOT)
    code, out = run("--as", "core/juno", "status")
    assert code == 0 and p.returncode == 0, p.stderr
    for secret in getattr(served, "secrets", {}).values():
        assert secret not in p.stdout + p.stderr and secret not in json.dumps(out)
    assert out["hub"] == remote.public_url(served.url("core/juno"))


# --- what only one transport has --------------------------------------------------

@pytest.mark.parametrize("served", ["http"], indirect=True)
def test_http_needs_a_login(served, room):
    bare = f"http://127.0.0.1:{served.port}/hub.git"
    for url in (bare, served.url("core/juno", secret="wrong")):
        p = git("ls-remote", url, check=False)
        assert p.returncode != 0
        assert "Authentication failed" in p.stderr or "could not read Username" in p.stderr
    assert f"refs/heads/rooms/{room}" in git("ls-remote", served.url("core/juno")).stdout
    p = git("ls-remote", f"http://127.0.0.1:{served.port}/other.git", check=False)
    assert p.returncode != 0
    # A printed next step carries the URL without its password: pasted, it is told why
    # it failed, not only to check its credentials.
    env = dict(os.environ, GITDROP_CACHE=os.path.join(served.base, "cache-login"))
    p = subprocess.run([sys.executable, "-m", "gitdrop", "--hub",
                        remote.public_url(served.url("core/juno")), "--as", "core/juno",
                        "--room", room, "inbox", "--json"], env=env, capture_output=True,
                       text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 7 and "the hub asks for a login: give it in the URL" in \
        json.loads(p.stdout)["fix"], (p.stdout, p.stderr)
    p = subprocess.run([sys.executable, "-m", "gitdrop", "--hub",
                        served.url("core/juno", secret="wrong"), "--as", "core/juno",
                        "--room", room, "inbox", "--json"], env=env, capture_output=True,
                       text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 7 and "the hub turned away the login in the URL" in \
        json.loads(p.stdout)["fix"], (p.stdout, p.stderr)


def test_a_room_cannot_be_forged_through_any_door(served, team, tmp_path):
    """A room's first commit pushed by hand, authored by the hub's own identity with a
    made-up lead: refused on every transport (an authenticated one knows the pusher is
    juno; git daemon knows nobody, and the registry says core's lead is juno)."""
    name = f"forged-{served.kind}"
    path = tmp_path / name
    git("init", "-q", str(path))
    git("config", "user.name", "hub/admin", cwd=path)
    git("config", "user.email", "admin@example.org", cwd=path)
    (path / "room.toml").write_text(
        f'name = "{name}"\ncreated = {int(time.time())}\nopen = false\nteams = ["core"]\n'
        f'pinned = false\nlayout = {model.LAYOUT}\n\n[leads]\ncore = "core/mallory"\n')
    git("add", "-A", cwd=path)
    git("commit", "-q", "-m", "room\n\nGitdrop-Op: room-create", cwd=path)
    url = served.url("core/juno")
    p = git("push", url, f"HEAD:refs/heads/rooms/{name}", cwd=path, check=False)
    want = "authenticated-pusher" if served.authenticates else "lead-only"
    assert p.returncode != 0 and refused_rule(p.stderr) == want, p.stderr
    assert not served.hub.store.tip(f"refs/heads/rooms/{name}")
    # the registry's lead, as herself, may create it
    git("config", "user.name", "core/juno", cwd=path)
    (path / "room.toml").write_text((path / "room.toml").read_text().replace(
        "core/mallory", "core/juno"))
    git("commit", "-q", "-a", "--amend", "--reset-author", "-m",
        "room\n\nGitdrop-Op: room-create", cwd=path)
    p = git("push", url, f"HEAD:refs/heads/rooms/{name}", cwd=path, check=False)
    assert p.returncode == 0, p.stderr
    assert served.hub.room(name).view().room["leads"] == {"core": "core/juno"}


@pytest.mark.parametrize("served", ["http"], indirect=True)
def test_http_answers_hostile_requests_without_a_server_error(served):
    """Raw requests a client could send, logged in: a NUL in the path was a 500 (it
    cannot go into git's environment); none is one now, nothing outside git's paths
    is served, and the server serves the next request."""
    import base64
    import socket
    auth = base64.b64encode(f"core/juno:{served.secrets['core/juno']}".encode()).decode()

    def ask(line: str, headers: str = "", body: bytes = b"") -> str:
        with socket.create_connection(("127.0.0.1", served.port), 10) as s:
            s.sendall(f"{line} HTTP/1.0\r\nAuthorization: Basic {auth}\r\n{headers}\r\n"
                      .encode("latin-1") + body)
            out = b""
            while chunk := s.recv(65536):
                out += chunk
        return out.split(b"\r\n")[0].decode("latin-1")

    answers = {
        "GET /hub.git/info/refs%00x": ask("GET /hub.git/info/refs%00x"),
        "GET /hub.git/%2e%2e/%2e%2e/etc/passwd": ask("GET /hub.git/%2e%2e/%2e%2e/etc/passwd"),
        "GET /hub.git/gitdrop/tokens.json": ask("GET /hub.git/gitdrop/tokens.json"),
        "GET /hub.git/config": ask("GET /hub.git/config"),
        "GET /hub.git/info/refs?service=git-upload-archive":
            ask("GET /hub.git/info/refs?service=git-upload-archive"),
        "POST length -5": ask("POST /hub.git/git-upload-pack", "Content-Length: -5\r\n"),
        "POST length abc": ask("POST /hub.git/git-upload-pack", "Content-Length: abc\r\n"),
        "a NUL in a header": ask("GET /hub.git/info/refs", "X-A: a\x00b\r\n"),
    }
    status = {k: int(a.split()[1]) for k, a in answers.items()}
    assert all(code < 500 for code in status.values()), answers
    assert status["GET /hub.git/info/refs%00x"] == 400, answers
    for path in ("GET /hub.git/%2e%2e/%2e%2e/etc/passwd", "GET /hub.git/gitdrop/tokens.json",
                 "GET /hub.git/config"):
        assert status[path] >= 400, answers
    assert "refs/heads/rooms" in git("ls-remote", served.url("core/juno")).stdout


@pytest.mark.parametrize("served", ["ssh"], indirect=True)
def test_ssh_keys_reach_only_git_on_the_hub(served):
    p = subprocess.run(served.ssh + ["juno.gitdrop", "cat /etc/passwd"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode != 0 and "only git fetch and push" in p.stderr
    assert "root:" not in p.stdout
    p = git("ls-remote", "ssh://juno.gitdrop/etc", check=False)
    assert p.returncode != 0 and "only reaches the gitdrop hub" in p.stderr
    p = git("ls-remote", "ssh://kai.gitdrop" + served.hub.path, check=False)  # not authorized
    assert p.returncode != 0 and "refs/heads" not in p.stdout


# --- the pieces, without a server ------------------------------------------------------

def test_dechunk():
    raw = b"4\r\nWiki\r\n5;ext=1\r\npedia\r\n0\r\nX-Trailer: y\r\n\r\nNEXT"
    out, stream = io.BytesIO(), io.BytesIO(raw)
    assert httpd.dechunk(stream, out) == 9
    assert out.getvalue() == b"Wikipedia" and stream.read() == b"NEXT"
    with pytest.raises(ValueError):
        httpd.dechunk(io.BytesIO(b"5\r\nab"), io.BytesIO())
    with pytest.raises(ValueError):
        httpd.dechunk(io.BytesIO(b"10\r\n" + b"x" * 16 + b"\r\n0\r\n\r\n"), io.BytesIO(), limit=8)


@pytest.mark.parametrize("request_, ok", [
    ("git-receive-pack '/srv/hub.git'", True), ("git-upload-pack '/srv/hub.git'", True),
    ("git upload-pack '/srv/hub'", True), ("git-upload-pack 'hub.git'", False),
    ("git-receive-pack '/srv/other.git'", False), ("git-upload-archive '/srv/hub.git'", False),
    ("sh -c 'git-receive-pack /srv/hub.git'", False), ("git-receive-pack '/srv/hub.git' x", False),
    ("", False)])
def test_shell_resolve(request_, ok, tmp_path):
    args = ("core/juno", "/srv/hub.git", request_, "/home/juno")
    if ok:
        cmd, _ = shell.resolve(*args)
        assert cmd[0] == "git" and cmd[2] == "/srv/hub.git"
        assert cmd[1] == ("receive-pack" if "receive" in request_ else "upload-pack")
    else:
        with pytest.raises(ValueError):
            shell.resolve(*args)
    with pytest.raises(ValueError):
        shell.resolve("juno", "/srv/hub.git", "git-upload-pack '/srv/hub.git'", "/h")
    assert shell.parse(["--hub", "/x", "core/juno"]) == ("core/juno", "/x")


def test_shell_runs_git_as_the_agent(tmp_path):
    """gitdrop-shell itself, as sshd runs it: git on the hub, nothing else."""
    h = hubmod.init(str(tmp_path / "hub.git"))
    h.room("lobby").register("core/juno", ["lead"])
    env = dict(os.environ, SSH_ORIGINAL_COMMAND=f"git-upload-pack '{h.path}'",
               GITDROP_HUB=h.path, GITDROP_PUSHER="core/someone-else", REMOTE_USER="x")
    p = subprocess.run([sys.executable, "-m", "gitdrop.transports.shell", "core/juno"], env=env,
                       input=b"0000", capture_output=True, timeout=30)
    assert p.returncode == 0 and b"refs/heads/rooms/lobby" in p.stdout
    env["SSH_ORIGINAL_COMMAND"] = "env"
    p = subprocess.run([sys.executable, "-m", "gitdrop.transports.shell", "core/juno"], env=env,
                       capture_output=True, timeout=30)
    assert p.returncode == 1 and b"GITDROP" not in p.stdout
