"""Shared fixtures: a real hub with the real hooks, and clones that push to it."""

import os
import subprocess

import pygit2
import pytest

from gitdrop import hub as hubmod
from gitdrop import model
from gitdrop.errors import Refusal
from gitdrop.store import Reader
from gitdrop.verify import check_commits


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
