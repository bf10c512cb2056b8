"""A hub hosted by real multi-user git servers on 127.0.0.1: gitolite over sshd
(gitolite's user is the pusher) and Apache running git http-backend behind Basic
auth (REMOTE_USER is the pusher). For each: a true identity's push lands, a forged
author is refused by rule authenticated-pusher whatever the client sends along, a
bad key or password gets nothing, the gitdrop command works through the URL, and 3
machines x 10 agents writing at once lose nothing."""

import json
import os
import shlex
import subprocess
import sys

import pytest

from gitdrop import hook, model
from gitdrop import hub as hubmod
from gitdrop.errors import Refusal

from conftest import Clone, git, refused_rule
from servers import AGENTS, SERVERS, load_agents, load_run, login, summary
from test_transports import ROOT, snapshot, task_file

# 30 agents at once, each claiming one of 10 tasks: one write each, kept small since
# every landed write makes the other 29 redo theirs (bench/bench_githosts.py sends more)
MACHINES, PER_MACHINE, SENDS = 3, 10, 0


@pytest.fixture(scope="module", params=sorted(SERVERS))
def served(request, tmp_path_factory):
    s = SERVERS[request.param](tmp_path_factory.mktemp(request.param),
                               AGENTS + tuple(load_agents(MACHINES, PER_MACHINE)))
    try:
        s.start()
        lobby = s.hub.room("lobby")
        for agent, roles in zip(AGENTS, (["lead"], ["coder"])):
            lobby.register(agent, roles)
        yield s
    finally:
        s.close()


def test_a_true_identity_pushes(served, tmp_path):
    c = Clone(served.url("core/juno"), tmp_path / "c", "lobby", "core/juno")
    c.write(model.task_path(1), task_file(1, "core/juno")).commit("task 1")
    ok, err = c.push()
    assert ok, err
    assert served.hub.store.room_tip("lobby") == c.head()
    assert served.hub.store.reader.commit(c.head()).author == "core/juno"
    assert served.hub.room("lobby").task(1)["creator"] == "core/juno"


def smuggling(served) -> tuple[list, dict]:
    """What a client may send along with a push, none of which is who pushed: SSH
    variables (this sshd accepts any), HTTP headers, push options."""
    if served.kind == "gitolite":
        ssh = served.ssh + ["-o", "SetEnv=GITDROP_PUSHER=core/spartan GL_USER=core+spartan "
                            "REMOTE_USER=core/spartan"]
        return [], {"GIT_SSH_COMMAND": shlex.join(ssh)}
    return ["-c", "http.extraHeader=Remote-User: core/spartan",
            "-c", "http.extraHeader=Gitdrop-Pusher: core/spartan"], {}


def test_a_forged_author_is_refused(served, tmp_path):
    c = Clone(served.url("core/juno"), tmp_path / "c", "lobby", "core/juno")
    c.as_("core/spartan")
    c.write(model.task_path(2), task_file(2, "core/spartan")).commit("task 2, as spartan")
    before = snapshot(served.hub.path)
    config, env = smuggling(served)
    for pre, e, opts in (([], {}, []), (config, env, ["-o", "GITDROP_PUSHER=core/spartan"])):
        p = git(*pre, "push", *opts, "origin", "HEAD:rooms/lobby", cwd=c.path, env=e,
                check=False)
        assert p.returncode != 0 and refused_rule(p.stderr) == "authenticated-pusher", p.stderr
        assert "push was authenticated as core/juno" in p.stderr, p.stderr
        assert "commit:" in p.stderr and "fix:" in p.stderr
        assert snapshot(served.hub.path) == before


def test_a_stranger_gets_nothing(served, tmp_path):
    if served.kind == "gitolite":   # a key gitolite does not know
        bad, said = ["ssh://stranger.gitolite/hub"], ("Permission denied",)
    else:                            # a wrong password, and none at all
        bad = [served.url("core/juno", secret="wrong"),
               f"http://127.0.0.1:{served.port}/git/hub.git"]
        said = ("Authentication failed", "could not read Username")
    c = Clone(served.url("core/juno"), tmp_path / "c", "lobby", "core/juno")
    c.write(model.task_path(4), task_file(4, "core/juno")).commit("task 4")
    before = snapshot(served.hub.path)
    for url in bad:
        p = git("ls-remote", url, check=False)
        assert p.returncode != 0 and "refs/heads" not in p.stdout, p.stdout
        assert any(x in p.stderr for x in said), p.stderr
        p = git("push", url, "HEAD:refs/heads/rooms/lobby", cwd=c.path, check=False)
        assert p.returncode != 0 and any(x in p.stderr for x in said), p.stderr
        assert snapshot(served.hub.path) == before


@pytest.mark.parametrize("served", ["gitolite"], indirect=True)
def test_a_gitolite_user_who_is_no_agent_is_refused(served, tmp_path):
    """gitolite lets admin push to the hub; the hook does not: admin names no agent."""
    c = Clone("ssh://admin.gitolite/hub", tmp_path / "c", "lobby", "core/juno")
    c.write(model.task_path(3), task_file(3, "core/juno")).commit("task 3")
    before = snapshot(served.hub.path)
    ok, err = c.push()
    assert not ok and refused_rule(err) == "authenticated-pusher", err
    assert "gitolite user 'admin' is not an agent" in err and "core+juno.pub" in err
    assert snapshot(served.hub.path) == before


def test_a_forged_committer_is_refused(served, tmp_path):
    """The author was checked and the committer not: a commit of juno's could say it
    was committed by spartan, and git log --format=fuller, the audit trail, showed it.
    On the hub branch too."""
    for ref, path, text in (("rooms/lobby", model.task_path(6), task_file(6, "core/juno")),
                            (model.HUB_REF, "teams/core.toml", None)):
        c = Clone(served.url("core/juno"), tmp_path / ref.replace("/", "-"), "lobby",
                  "core/juno")
        if text is None:
            git("fetch", "-q", "origin", model.HUB_REF, cwd=c.path)
            git("checkout", "-q", "FETCH_HEAD", cwd=c.path)
            text = open(os.path.join(c.path, path)).read() + "\n# hi\n"
        c.write(path, text)
        git("add", "-A", cwd=c.path)
        git("commit", "-qm", "by juno", cwd=c.path,
            env={"GIT_COMMITTER_NAME": "core/spartan", "GIT_COMMITTER_EMAIL": "s@x"})
        before = snapshot(served.hub.path)
        p = git("push", "origin", f"HEAD:{ref}", cwd=c.path, check=False)
        assert p.returncode != 0 and refused_rule(p.stderr) == "authenticated-pusher", p.stderr
        assert "committer is core/spartan but the push was authenticated as core/juno" \
            in p.stderr, p.stderr
        assert snapshot(served.hub.path) == before
        git("commit", "-q", "--amend", "--no-edit", "--reset-author", cwd=c.path)
        assert git("push", "origin", f"HEAD:{ref}", cwd=c.path, check=False).returncode == 0


@pytest.mark.parametrize("served", ["apache"], indirect=True)
def test_a_push_nobody_logged_in_for_is_refused(served, tmp_path):
    """A location a web server lets through without a login: the hook saw no pusher
    and checked no identity, so anyone who reached the URL wrote as anyone."""
    url = f"http://127.0.0.1:{served.port}/nologin/hub.git"
    c = Clone(url, tmp_path / "c", "lobby", "core/juno")
    c.write(model.task_path(5), task_file(5, "core/juno")).commit("task 5")
    before = snapshot(served.hub.path)
    ok, err = c.push()
    assert not ok and refused_rule(err) == "authenticated-pusher", err
    assert "without a login" in err and "Require valid-user" in err, err
    assert snapshot(served.hub.path) == before


def test_the_gitdrop_command_through_the_url(served, tmp_path):
    env = dict(os.environ, GITDROP_CACHE=str(tmp_path / "cache"))

    def gitdrop(agent, *args):
        p = subprocess.run([sys.executable, "-m", "gitdrop", "--hub", served.url("core/juno"),
                            "--room", "lobby", "--as", agent, *args, "--json"], env=env,
                           capture_output=True, text=True, timeout=60, cwd=ROOT)
        return p.returncode, json.loads(p.stdout)
    code, out = gitdrop("core/juno", "send", "spartan", "-m", f"hello over {served.kind}")
    assert code == 0 and out["to"] == ["core/spartan"], out
    got = served.hub.room("lobby").inbox("core/spartan", peek=True)["messages"]
    assert got[-1]["text"].strip() == f"hello over {served.kind}"
    assert got[-1]["from"] == "core/juno"
    code, out = gitdrop("core/spartan", "status", "pretending")   # as someone else
    assert (code, out["rule"]) == (3, "authenticated-pusher"), out


@pytest.mark.timeout(300)
def test_three_machines_of_ten_agents_at_once(served, tmp_path, capsys):
    s = load_run(served, str(tmp_path), MACHINES, PER_MACHINE, sends=SENDS)
    with capsys.disabled():
        print("\n" + summary(s))
        for x in s["lost"]:
            print("LOST", x)
    agents = load_agents(MACHINES, PER_MACHINE)
    assert s["writes"] == s["expected"] == len(agents) * (SENDS + 1)
    assert not s["lost"], s["lost"]            # nothing failed without a rule
    assert not s["gave_up"], s["gave_up"]      # nor kept failing to get its turn
    assert not s["missing"], s["missing"]      # every accepted write is on the hub
    # each wanted task went to exactly one agent; the others were told by the rule
    assert s["refused"] == {"task-state-machine": len(agents) - len(s["tasks"])}, s["refused"]
    claims = sorted(x[0] for x in s["landed"] if x[1] == "claim")
    assert sorted(s["room"].task(t)["assignee"] for t in s["tasks"]) == claims
    assert len([x for x in s["landed"] if x[1] == "send"]) == len(agents) * SENDS
    for agent, _kind, _secs, _outcome, commit, _reruns in s["landed"]:
        assert served.hub.store.reader.commit(commit).author == agent   # each as itself
    assert s["retries"] > 0   # machines raced, and the losers redid their writes


def test_the_login_map(monkeypatch):
    assert hook.agent_for_login(login("core/juno")) == "core/juno"
    monkeypatch.setenv("GITDROP_PUSHER", "core/spartan")
    monkeypatch.setenv("REMOTE_USER", "core/spartan")
    assert hook.pusher() == "core/spartan"
    monkeypatch.setenv("GL_USER", "core+juno")   # gitolite's word wins over the others
    assert hook.pusher() == "core/juno"
    for bad in ("admin", "core.juno", "a+b+c", "+juno", "core+", "core+ju/no", ""):
        monkeypatch.setenv("GL_USER", bad)
        with pytest.raises(Refusal) as e:
            hook.pusher()
        assert e.value.rule == "authenticated-pusher" and "keydir/" in e.value.fix


def test_gitdrop_shell_drops_a_smuggled_gitolite_user(tmp_path):
    """gitdrop-shell names the pusher; a GL_USER that reached it from the client (an
    sshd that accepts any variable) must not reach the hook, where it would win."""
    h = hubmod.init(str(tmp_path / "hub.git"))
    for agent in AGENTS:
        h.room("lobby").register(agent)
    # what sshd does for a key with command="gitdrop-shell core/juno": the request in
    # SSH_ORIGINAL_COMMAND, plus whatever variables the client sent
    ssh = tmp_path / "ssh"
    ssh.write_text(f"""#!/bin/sh
while [ "$#" -gt 1 ]; do shift; done
SSH_ORIGINAL_COMMAND="$1" GL_USER=core+spartan GITDROP_PUSHER=core/spartan \\
    exec {sys.executable} -m gitdrop.transports.shell --hub {h.path} core/juno
""")
    ssh.chmod(0o755)
    env = {"GIT_SSH_COMMAND": str(ssh), "PYTHONPATH": ROOT}
    c = Clone(h.path, tmp_path / "c", "lobby", "core/spartan")
    git("remote", "set-url", "origin", f"ssh://hub.example.org{h.path}", cwd=c.path)
    c.write(model.task_path(5), task_file(5, "core/spartan")).commit("task 5, as spartan")
    p = git("push", "origin", "HEAD:rooms/lobby", cwd=c.path, env=env, check=False)
    assert p.returncode != 0 and refused_rule(p.stderr) == "authenticated-pusher", p.stderr
    assert "authenticated as core/juno" in p.stderr
    c.as_("core/juno")
    git("reset", "-q", "--hard", "HEAD~", cwd=c.path)
    c.write(model.task_path(5), task_file(5, "core/juno")).commit("task 5")
    p = git("push", "origin", "HEAD:rooms/lobby", cwd=c.path, env=env, check=False)
    assert p.returncode == 0, p.stderr   # the same door, as itself
    assert h.store.room_tip("lobby") == c.head()
