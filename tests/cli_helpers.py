"""Helpers for the CLI tests: the real `gitdrop` entry point in a subprocess."""

import json
import os
import subprocess
import sys

BIN = os.path.join(os.path.dirname(sys.executable), "gitdrop")
ENTRY = [BIN] if os.path.exists(BIN) else [sys.executable, "-m", "gitdrop"]
OWN_ENV = ("GITDROP_HUB", "GITDROP_ROOM", "GITDROP_AGENT", "NO_COLOR", "FORCE_COLOR")


class Result:
    def __init__(self, p: subprocess.CompletedProcess):
        self.rc, self.out, self.err = p.returncode, p.stdout, p.stderr

    @property
    def json(self):
        """stdout must be exactly one JSON document."""
        return json.loads(self.out)

    def __repr__(self):
        return f"<rc={self.rc} out={self.out[-800:]!r} err={self.err[-800:]!r}>"


class Gitdrop:
    """Runs `gitdrop` against one hub, as one agent by default."""

    def __init__(self, hub_path: str, home: str, agent: str = ""):
        self.hub = hub_path
        self.env = {k: v for k, v in os.environ.items() if k not in OWN_ENV}
        self.env.update(HOME=home, GITDROP_HUB=hub_path, GIT_TERMINAL_PROMPT="0")
        if agent:
            self.env["GITDROP_AGENT"] = agent

    def __call__(self, *args, input=None, env=None, cwd=None, timeout=60) -> Result:
        e = dict(self.env, **(env or {}))
        p = subprocess.run([*ENTRY, *map(str, args)], input=input, env=e, cwd=cwd,
                           capture_output=True, text=True, timeout=timeout,
                           stdin=None if input is not None else subprocess.DEVNULL)
        return Result(p)

    def ok(self, *args, **kw) -> Result:
        r = self(*args, **kw)
        assert r.rc == 0, r
        return r

    def js(self, *args, **kw) -> dict:
        """Run with --json; expect success and return the document."""
        r = self(*args, "--json", **kw)
        assert r.rc == 0, r
        doc = r.json
        assert doc["ok"] is True, doc
        return doc

    def refused(self, rc: int, rule: str, *args, **kw) -> dict:
        """Expect a refusal: the exit code, and the rule, reason and next step both in the
        JSON document on stdout and in the words on stderr."""
        r = self(*args, "--json", **kw)
        assert r.rc == rc, r
        doc = r.json
        assert doc["ok"] is False and doc["rule"] == rule and doc["exit_code"] == rc, doc
        assert doc["reason"] and doc["fix"], doc
        assert f"rule {rule}" in r.err or f"gitdrop: {rule}" in r.err, r
        assert doc["reason"] in r.err and "fix:" in r.err, r
        return doc
