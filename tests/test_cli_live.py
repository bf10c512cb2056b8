"""The long-running commands as wired into the CLI: wait, watch, token, serve."""

import json
import queue
import signal
import subprocess
import threading
import time

import pytest

from cli_helpers import ENTRY, Gitdrop


@pytest.fixture
def gd(hub, tmp_path):
    return Gitdrop(hub.path, str(tmp_path / "home"))


@pytest.fixture
def team(lobby):
    lobby.register("core/juno", ["lead"])
    lobby.register("core/spartan", ["coder"])
    return lobby


def test_wait_times_out_with_124_then_returns_what_waits(gd, team):
    r = gd("--as", "spartan", "wait", "--timeout", "0.5")
    assert r.rc == 124, r
    team.send("core/juno", "core/spartan", "your turn")
    r = gd("--as", "spartan", "wait", "--timeout", "10", "--json")
    assert r.rc == 0, r
    doc = r.json
    assert doc["unread"] == 1 and doc["agent"] == "core/spartan"
    # waiting marks nothing read: the inbox still has it
    assert [m["text"] for m in gd.js("--as", "spartan", "inbox")["messages"]] == ["your turn"]


def test_watch_prints_what_arrives_until_interrupted(gd, team):
    p = subprocess.Popen([*ENTRY, "--as", "spartan", "watch", "--json"], env=gd.env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in p.stdout], daemon=True).start()
    try:
        got = None
        deadline = time.monotonic() + 30
        while got is None and time.monotonic() < deadline:
            team.send("core/juno", "core/spartan", "are you there?")
            try:
                got = json.loads(lines.get(timeout=3))
            except queue.Empty:
                continue  # the watcher may not have started yet: send again
        assert got is not None, p.stderr.read() if p.poll() is not None else "no line"
        assert "are you there?" in json.dumps(got)
    finally:
        p.send_signal(signal.SIGINT)
        try:
            rc = p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
            raise
    assert rc == 0


def test_token_mints_a_bearer_token_per_agent(gd, team, hub):
    doc = gd.js("token", "core/spartan")
    assert doc["agent"] == "core/spartan" and len(doc["token"]) > 30
    r = gd.ok("token", "core/spartan")
    plain = r.out.strip()   # stdout: the token alone, for scripts; where it goes: stderr
    assert plain != doc["token"] and "Authorization: Bearer" in r.err  # rotation
    from gitdrop import tokens
    assert tokens.Verifier(hub.path).agent(plain) == "core/spartan"
    # no token for what is not an agent's name (`gitdrop token list` made one for "list")
    assert gd.refused(2, "usage", "token", "list")["fix"].startswith("give the agent as team/name")
    assert not tokens.has(hub.path, "list")


def test_serve_speaks_mcp_over_stdio_as_the_agent_given(gd, team):
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                       "clientInfo": {"name": "test", "version": "0"}}}
    p = subprocess.Popen([*ENTRY, "--as", "core/juno", "serve"], env=gd.env,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        p.stdin.write(json.dumps(init) + "\n")
        p.stdin.flush()
        reply = json.loads(p.stdout.readline())
    finally:
        p.stdin.close()
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
    assert reply["id"] == 1 and reply["result"]["serverInfo"]["name"] == "gitdrop", reply
    assert "core/juno" in reply["result"]["instructions"]


def test_serve_is_registered_with_its_options(gd):
    out = gd.ok("serve", "--help", env={"COLUMNS": "150"}).out
    for opt in ("--transport", "--host", "--port", "--tools", "--as", "stdio", "http"):
        assert opt in out
    r = gd("serve", "--transport", "pigeon")
    assert r.rc == 2 and "pigeon" in r.err
