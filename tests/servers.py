"""Real multi-user git servers hosting a hub on 127.0.0.1: gitolite behind sshd, and
Apache running git http-backend behind Basic auth. Used by tests/test_githosts.py
and bench/bench_githosts.py (which also share the load run at the bottom)."""

import getpass
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from gitdrop import hub as hubmod
from gitdrop.errors import Conflict, Refusal
from gitdrop.transports.remote import RemoteHub

from test_transports import ROOT, Served, _sshd, free_port, ssh_client_config, wait_for_port

AGENTS = ("core/juno", "core/spartan")
HUB = "hub"   # the repository's name on both servers


def _need(what: str, found: bool, script: str) -> None:
    """A missing server package: installed as CI installs it (as root), else a skip."""
    if found:
        return
    path = os.path.join(ROOT, ".ci", "setup.d", script)
    if os.geteuid() == 0:
        subprocess.run(["sh", path], capture_output=True, timeout=600)
    if not shutil.which(what) and not os.path.exists(f"/usr/sbin/{what}"):
        pytest.skip(f"{what} is not installed (run .ci/setup.d/{script})")


def keygen(path: str) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", path],
                   check=True)
    with open(path + ".pub") as f:
        return f.read()


def login(agent: str) -> str:
    """gitolite's user name of an agent (its key file is keydir/<login>.pub)."""
    return agent.replace("/", "+")


class Gitolite(Served):
    """gitolite in a HOME of its own, reached through a real sshd whose only keys are
    gitolite's; the hub is an adopted repository with gitdrop's hook as gitolite's
    repo-specific pre-receive hook."""

    kind = "gitolite"

    def __init__(self, base, agents=AGENTS):
        self.base, self.procs, self.agents = str(base), [], tuple(agents)

    def gitolite(self, *args, **kw):
        return subprocess.run(["gitolite", *args], env=dict(os.environ, HOME=self.home),
                              capture_output=True, text=True, check=True, **kw)

    def start(self):
        _need("gitolite", bool(shutil.which("gitolite")), "40-gitolite.sh")
        sshd = _sshd()
        if not sshd:
            pytest.skip("sshd is not installed (run .ci/setup.d/10-sshd.sh)")
        self.home = os.path.join(self.base, "gitolite")   # the gitolite account's HOME
        k = self.keys = os.path.join(self.base, "keys")
        os.makedirs(self.home)
        os.makedirs(k)
        for user in ("host_key", "admin", "stranger") + tuple(login(a) for a in self.agents):
            keygen(f"{k}/{user}")
        # 1. gitolite itself, administered by the key admin.pub
        self.gitolite("setup", "-pk", f"{k}/admin.pub")
        rc = os.path.join(self.home, ".gitolite.rc")
        with open(rc) as f:
            text = f.read()
        for line in ('LOCAL_CODE                =>  "$ENV{HOME}/local",',
                     "'repo-specific-hooks',"):
            assert "# " + line in text, line
            text = text.replace("# " + line, line, 1)
        with open(rc, "w") as f:
            f.write(text)
        # 2. the hub, and gitdrop's hook where gitolite looks for repo-specific hooks
        path = os.path.join(self.home, "repositories", HUB + ".git")
        self.hub = hubmod.init(path)
        hooks = os.path.join(self.home, "local", "hooks", "repo-specific")
        os.makedirs(hooks)
        shutil.copy(os.path.join(path, "hooks", "pre-receive"), os.path.join(hooks, "gitdrop"))
        # 3. sshd: gitolite's authorized_keys, gitolite's HOME. It accepts any
        # variable a client sends, as a careless admin's might: none may change who
        # pushed (GL_USER is gitolite's own).
        self.port = free_port()
        user = getpass.getuser()
        with open(f"{k}/sshd_config", "w") as f:
            f.write(f"""Port {self.port}
ListenAddress 127.0.0.1
HostKey {k}/host_key
PidFile {k}/sshd.pid
AuthorizedKeysFile {self.home}/.ssh/authorized_keys
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PermitRootLogin prohibit-password
AllowUsers {user}
AcceptEnv *
SetEnv HOME={self.home}
MaxStartups 100:30:200
LogLevel ERROR
""")
        # One connection per key, shared by its fetches and pushes (ended in close())
        self.ctl = tempfile.mkdtemp(prefix="gd-gl-")   # socket paths must be short
        self.names = ("admin", "stranger") + tuple(login(a) for a in self.agents)
        ssh_client_config(f"{k}/config", [(f"{n}.gitolite", f"{k}/{n}") for n in self.names],
                          self.port, user, self.ctl, persist=120)
        if os.geteuid() == 0:
            os.makedirs("/run/sshd", exist_ok=True)
        p = self.spawn([sshd, "-D", "-e", "-f", f"{k}/sshd_config"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        wait_for_port(self.port, p, "sshd")
        self.ssh = ["ssh", "-F", f"{k}/config"]
        self.old_env = os.environ.get("GIT_SSH_COMMAND")
        os.environ["GIT_SSH_COMMAND"] = " ".join(self.ssh)
        # 4. the admin gives each agent a key and the hub the hook, by a push
        admin = os.path.join(self.base, "gitolite-admin")
        run = dict(capture_output=True, text=True, check=True, timeout=120)
        subprocess.run(["git", "clone", "-q", "ssh://admin.gitolite/gitolite-admin", admin], **run)
        for a in self.agents:
            shutil.copy(f"{k}/{login(a)}.pub", os.path.join(admin, "keydir"))
        with open(os.path.join(admin, "conf", "gitolite.conf"), "w") as f:
            f.write(self.conf())
        for args in (["add", "-A"], ["-c", "user.name=admin", "-c", "user.email=admin@localhost",
                                      "commit", "-q", "-m", "the gitdrop hub"],
                     ["push", "-q", "origin", "HEAD"]):
            subprocess.run(["git", *args], cwd=admin, **run)
        assert os.path.islink(os.path.join(path, "hooks", "pre-receive.h00-gitdrop"))
        return self

    def conf(self) -> str:
        agents = " ".join(login(a) for a in self.agents)
        # admin may push to the hub as far as gitolite cares; gitdrop refuses it (no agent)
        return f"""repo gitolite-admin
    RW+     =   admin

@agents     =   {agents}

repo {HUB}
    RW      =   @agents
    RW      =   admin
    option hook.pre-receive = gitdrop
"""

    def url(self, agent: str) -> str:
        return f"ssh://{login(agent)}.gitolite/{HUB}"

    def close(self):
        if hasattr(self, "ctl"):
            for name in self.names:
                if os.path.exists(os.path.join(self.ctl, name + ".gitolite")):
                    subprocess.run(self.ssh + ["-O", "exit", name + ".gitolite"],
                                   capture_output=True, timeout=10)
            shutil.rmtree(self.ctl, ignore_errors=True)
        if hasattr(self, "old_env"):
            if self.old_env is None:
                os.environ.pop("GIT_SSH_COMMAND", None)
            else:
                os.environ["GIT_SSH_COMMAND"] = self.old_env
        super().close()


HTTP_BACKEND = "/usr/lib/git-core/git-http-backend"
MODULES = ("mpm_prefork", "authn_core", "authn_file", "authz_core", "authz_user", "auth_basic",
           "alias", "env", "cgi")


class Apache(Served):
    """Apache with a config of its own: git http-backend as CGI under /git/, every
    request behind Basic auth (htpasswd), so REMOTE_USER is the agent."""

    kind = "apache"

    def __init__(self, base, agents=AGENTS):
        self.base, self.procs, self.agents = str(base), [], tuple(agents)

    def start(self):
        _need("apache2", os.path.exists("/usr/sbin/apache2") and bool(shutil.which("htpasswd")),
              "50-apache.sh")
        self.root = os.path.join(self.base, "repos")   # GIT_PROJECT_ROOT
        self.hub = hubmod.init(os.path.join(self.root, HUB + ".git"))
        d = self.dir = os.path.join(self.base, "apache")
        os.makedirs(d)
        self.htpasswd = os.path.join(d, "htpasswd")
        self.secrets = {}
        for a in self.agents:
            self.secrets[a] = os.urandom(12).hex()
            self.add_user(a, self.secrets[a])
        self.port = free_port()
        with open(os.path.join(d, "httpd.conf"), "w") as f:
            f.write(self.conf())
        cmd = ["apache2", "-d", d, "-f", os.path.join(d, "httpd.conf"), "-DFOREGROUND"]
        if os.geteuid() == 0:
            # Apache will not serve as root; run it as an ordinary user id that is
            # root's on disk (a user namespace), so it owns the hub as the tests do.
            userns = ["unshare", "--user", "--map-user=65534", "--map-group=65534", "--"]
            if subprocess.run(userns + ["true"], capture_output=True).returncode != 0:
                pytest.skip("Apache does not serve as root, and this machine has no user "
                            "namespaces to run it as another user: run the tests as an "
                            "ordinary user")
            cmd = userns + cmd
        p = self.spawn(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        wait_for_port(self.port, p, "apache2")
        return self

    def add_user(self, agent: str, password: str) -> None:
        flags = "-bB" if os.path.exists(self.htpasswd) else "-cbB"
        subprocess.run(["htpasswd", flags, "-C", "5", self.htpasswd, agent, password],
                       check=True, capture_output=True)

    def conf(self) -> str:
        d = self.dir
        mods = "\n".join(f"LoadModule {m}_module /usr/lib/apache2/modules/mod_{m}.so"
                         for m in MODULES)
        return f"""{mods}
ServerName 127.0.0.1
Listen 127.0.0.1:{self.port}
PidFile {d}/httpd.pid
DefaultRuntimeDir {d}
ErrorLog {d}/error.log
LogLevel warn
StartServers 4
MaxRequestWorkers 64

SetEnv GIT_PROJECT_ROOT {self.root}
SetEnv GIT_HTTP_EXPORT_ALL 1
ScriptAlias /git/ {HTTP_BACKEND}/

<Location /git/>
    AuthType Basic
    AuthName "gitdrop hub"
    AuthBasicProvider file
    AuthUserFile {self.htpasswd}
    Require valid-user
</Location>

# A mistake an operator can make: the same hub with no login (see test_githosts)
ScriptAlias /nologin/ {HTTP_BACKEND}/
<Location /nologin/>
    Require all granted
</Location>
"""

    def url(self, agent: str, secret: str | None = None) -> str:
        user = agent.replace("/", "%2F")
        return (f"http://{user}:{secret or self.secrets[agent]}@127.0.0.1:{self.port}"
                f"/git/{HUB}.git")


SERVERS = {"gitolite": Gitolite, "apache": Apache}


# --- the load run: machines × agents writing at once -----------------------------

def load_agents(machines: int, per_machine: int) -> list[str]:
    return [f"load/m{m}a{i}" for m in range(machines) for i in range(per_machine)]


def percentile(values: list[float], p: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, max(0, round(p / 100 * len(v) + 0.5) - 1))] if v else 0.0


def load_run(served, work: str, machines: int = 3, per_machine: int = 10, sends: int = 1,
             room: str = "load", reruns: int = 5) -> dict:
    """Each agent on its machine (a cache directory: one mirror per agent's URL there)
    sends `sends` messages to the desk and then claims one of a few tasks that three
    agents want, all at once. Every write lands or is refused by a rule; the rest is
    "lost" (an error that is no refusal). A client that gave up (Conflict: the room
    kept moving) is run again, as its message says, at most `reruns` times."""
    agents = load_agents(machines, per_machine)
    hub = served.hub
    if room not in hub.store.rooms():
        hub.create_room("hub/admin", room, open_=True, settings={"loop_cap": 0})
    server_room = hub.room(room)
    desk = "load/desk"   # reads nothing, so no sender has unread mail from it
    for a in agents + [desk]:
        server_room.register(a, ["coder"])
    tasks = [server_room.create_task(desk, f"wanted {i}")["id"]
             for i in range(max(1, len(agents) // 3))]
    clients = {}

    def connect(a, m):
        clients[a] = RemoteHub(served.url(a), cache=os.path.join(work, f"machine{m}"))
    threads = [threading.Thread(target=connect, args=(a, i // per_machine))
               for i, a in enumerate(agents)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(clients) == len(agents), "not every client reached the hub"
    gate = threading.Barrier(len(agents))
    results = []   # (agent, kind, seconds, outcome, commit | rule | error, reruns)
    lock = threading.Lock()

    def agent_run(i, a):
        r = clients[a].room(room)
        jobs = [("send", lambda k=k: r.send(a, desk, f"load {k} from {a}")) for k in range(sends)]
        jobs.append(("claim", lambda: r.move_task(a, tasks[i % len(tasks)], "claim")))
        gate.wait(60)
        for kind, job in jobs:
            t0 = time.monotonic()
            for rerun in range(reruns + 1):
                try:
                    out = ("landed", job()["commit"])
                except Refusal as e:
                    out = ("refused", e.rule)
                except Conflict as e:   # nothing written; the message says to run it again
                    out = ("gave up", f"{reruns + 1} times: {e}")
                    continue
                except Exception as e:   # noqa: BLE001 - what the run must never see
                    out = ("lost", f"{type(e).__name__}: {e}")
                break
            with lock:
                results.append((a, kind, time.monotonic() - t0) + out + (rerun,))
    t0 = time.monotonic()
    threads = [threading.Thread(target=agent_run, args=(i, a)) for i, a in enumerate(agents)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    wall = time.monotonic() - t0
    log = set(subprocess.run(["git", "rev-list", f"refs/heads/rooms/{room}"], cwd=hub.path,
                             capture_output=True, text=True, check=True).stdout.split())
    lat = [x[2] for x in results]
    refused = {}
    for x in results:
        if x[3] == "refused":
            refused[x[4]] = refused.get(x[4], 0) + 1
    return {
        "server": served.kind, "machines": machines, "agents": len(agents), "sends": sends,
        "writes": len(results), "expected": len(agents) * (sends + 1),
        "landed": [x for x in results if x[3] == "landed"],
        "missing": [x for x in results if x[3] == "landed" and x[4] not in log],
        "refused": refused, "lost": [x for x in results if x[3] == "lost"],
        "gave_up": [x for x in results if x[3] == "gave up"],
        "retries": sum(c.store.lost_races for c in clients.values()),
        "reruns": sum(x[5] for x in results),
        "p50": percentile(lat, 50), "p99": percentile(lat, 99), "max": max(lat, default=0),
        "wall": wall, "tasks": tasks, "room": server_room,
    }


def summary(s: dict) -> str:
    landed = len(s["landed"])
    return (f"{s['server']}: {s['machines']} machines x {s['agents'] // s['machines']} agents, "
            f"{s['writes']} writes ({landed} landed, refused {s['refused'] or 0}, "
            f"gave up {len(s['gave_up'])}, lost {len(s['lost'])}) in {s['wall']:.1f} s = {landed / s['wall']:.1f} writes/s; "
            f"latency p50 {s['p50'] * 1000:.0f} ms, p99 {s['p99'] * 1000:.0f} ms, "
            f"max {s['max'] * 1000:.0f} ms; {s['retries']} pushes redone after a lost race, "
            f"{s['reruns']} commands run again after the client gave up")


if __name__ == "__main__":   # start one server by hand: python tests/servers.py apache
    base = tempfile.mkdtemp(prefix="gd-host-")
    s = SERVERS[sys.argv[1]](base).start()
    print(s.url(AGENTS[0]), flush=True)
    try:
        time.sleep(3600)
    finally:
        s.close()
