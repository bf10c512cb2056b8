"""Setting up: `gitdrop mcp install` / `gitdrop mcp check` (an MCP client's config,
written into a throwaway HOME and project, checked by starting the server with the
MCP SDK's client as the client would) and `gitdrop http` (the hub over smart HTTP)."""

import json
import os
import stat
import subprocess
import sys
import tomllib

import pytest
from cli_helpers import ENTRY, Gitdrop
from conftest import git

from gitdrop import tokens
from gitdrop.cli import setup
from gitdrop.mcp import tools as mcp_tools

AGENT_ARGS = ["serve", "--as", "core/spartan", "--tools", "agent"]


@pytest.fixture
def where(tmp_path, hub):
    home, project = tmp_path / "home", tmp_path / "project"
    home.mkdir()
    project.mkdir()
    hub.room("lobby").register("core/spartan", ["coder"])
    g = Gitdrop(hub.path, str(home))
    g.env.pop("CODEX_HOME", None)
    return g, home, project


def config_of(client, home, project):
    return {"claude-code": project / ".mcp.json", "gemini": project / ".gemini" / "settings.json",
            "codex": home / ".codex" / "config.toml"}[client]


def load(path):
    if str(path).endswith(".toml"):
        return tomllib.loads(path.read_text())["mcp_servers"]
    return json.loads(path.read_text())["mcpServers"]


def assert_entry(entry, hub_path, args=AGENT_ARGS):
    """The command is this install's gitdrop by an absolute path (a venv is not on
    the client's PATH), or its python with -m gitdrop."""
    command = entry["command"]
    assert os.path.isabs(command) and os.access(command, os.X_OK), command
    prefix = ["-m", "gitdrop"] if entry["args"][:2] == ["-m", "gitdrop"] else []
    assert os.path.basename(command).startswith("python" if prefix else "gitdrop"), command
    assert entry["args"] == prefix + args
    assert entry["env"] == {"GITDROP_HUB": hub_path, "GITDROP_ROOM": "lobby"}


@pytest.mark.parametrize("client", ["claude-code", "gemini", "codex"])
def test_install_writes_the_client_config_and_starts_the_server(where, hub, client):
    g, home, project = where
    r = g("mcp", "install", "--client", client, "--as", "spartan", cwd=project)
    assert r.rc == 0, r
    assert "lists 18 tools (agent profile)" in r.err  # the server really answered
    path = config_of(client, home, project)
    entry = load(path)["gitdrop"]
    assert_entry(entry, hub.path)  # a short name is written as the full one
    assert entry.get("timeout") == (30000 if client == "gemini" else None)
    assert str(path) in r.out and "next:" in r.out
    # the entry agrees with the template's shape
    template = os.path.join(os.path.dirname(os.path.dirname(__file__)), "templates",
                            {"claude-code": "claude-code.mcp.json", "gemini": "gemini-settings.json",
                             "codex": "codex-config.toml"}[client])
    with open(template, "rb") as f:
        shape = tomllib.load(f)["mcp_servers"] if client == "codex" else json.load(f)["mcpServers"]
    assert set(shape["gitdrop"]) == set(entry)
    # check: starts what the file says, as the client would
    doc = g.js("mcp", "check", "--client", client, cwd=project)
    assert doc["check"] == {"ok": True, "tools": 18} and doc["path"] == str(path)
    assert doc["tools"] == mcp_tools.tools_for("agent")


def test_install_refuses_a_short_name_nobody_has(where, hub):
    """`--as nobody` (a typo) wrote a config for an agent that did not exist; its first
    register then made default/nobody, in a team of its own."""
    g, home, project = where
    doc = g.refused(2, "usage", "mcp", "install", "--client", "claude-code", "--as", "nobdy",
                    "--no-check", cwd=project)
    assert "team/name" in doc["fix"]
    assert not os.path.exists(config_of("claude-code", home, project))
    r = g("mcp", "install", "--client", "claude-code", "--as", "core/newbie", "--no-check",
          cwd=project)   # a full name registers on its first call: said, and written
    assert r.rc == 0 and "not registered in lobby yet" in r.err, r


def test_install_keeps_the_other_servers_and_settings(where, hub):
    g, home, project = where
    mcp_json = project / ".mcp.json"
    other = {"command": "npx", "args": ["-y", "other-server"], "env": {"K": "v"}}
    mcp_json.write_text(json.dumps({"mcpServers": {"other": other,
                                                   "gitdrop": {"command": "gitdrop"}}}))
    doc = g.js("mcp", "install", "--client", "claude-code", "--as", "core/spartan", "--no-check",
               cwd=project)
    assert doc["written"] and doc["replaced"] and doc["others"] == ["other"]
    servers = load(mcp_json)
    assert servers["other"] == other and set(servers) == {"other", "gitdrop"}
    assert_entry(servers["gitdrop"], hub.path)

    # Claude Code's user config holds much else, privately
    user = home / ".claude.json"
    rest = {"numStartups": 7, "projects": {str(project): {"mcpServers": {"p": other}}},
            "mcpServers": {"u": other}}
    user.write_text(json.dumps(rest))
    user.chmod(0o600)
    g.ok("mcp", "install", "--client", "claude-code", "--scope", "user", "--as", "core/spartan",
         "--tools", "lead", "--no-check", cwd=project)
    after = json.loads(user.read_text())
    assert after["numStartups"] == 7 and after["projects"] == rest["projects"]
    assert after["mcpServers"]["u"] == other
    assert_entry(after["mcpServers"]["gitdrop"], hub.path, AGENT_ARGS[:3] + ["--tools", "lead"])
    assert stat.S_IMODE(user.stat().st_mode) == 0o600

    gemini = project / ".gemini" / "settings.json"
    gemini.parent.mkdir()
    gemini.write_text(json.dumps({"theme": "GitHub", "mcpServers": {"other": other}}))
    g.ok("mcp", "install", "--client", "gemini", "--as", "core/spartan", "--no-check", cwd=project)
    settings = json.loads(gemini.read_text())
    assert settings["theme"] == "GitHub" and settings["mcpServers"]["other"] == other
    assert settings["mcpServers"]["gitdrop"]["timeout"] == 30000


CODEX_BEFORE = '''# my Codex settings
model = "o3"   # the default model

[mcp_servers.other]
command = "npx"
args = ["-y", "other-server"]

[mcp_servers.gitdrop]
command = "gitdrop"
args = ["serve", "--as", "core/old"]

[mcp_servers.gitdrop.env]
GITDROP_HUB = "/old/hub.git"

# profiles stay as they are
[profiles.fast]
model = "o4-mini"
'''


def test_install_into_a_codex_config_edits_only_its_table(where, hub):
    g, home, _project = where
    config = home / ".codex" / "config.toml"
    config.parent.mkdir()
    config.write_text(CODEX_BEFORE)
    doc = g.js("mcp", "install", "--client", "codex", "--as", "core/spartan", "--no-check")
    assert doc["path"] == str(config) and doc["replaced"] and doc["others"] == ["other"]
    text = config.read_text()
    for kept in ("# my Codex settings\nmodel = \"o3\"   # the default model\n",
                 '[mcp_servers.other]\ncommand = "npx"\nargs = ["-y", "other-server"]\n',
                 '# profiles stay as they are\n[profiles.fast]\nmodel = "o4-mini"\n'):
        assert kept in text  # byte for byte, comments included
    assert "core/old" not in text and "/old/hub.git" not in text
    after = tomllib.loads(text)
    before = tomllib.loads(CODEX_BEFORE)
    assert after["model"] == "o3" and after["profiles"] == before["profiles"]
    assert after["mcp_servers"]["other"] == before["mcp_servers"]["other"]
    assert_entry(after["mcp_servers"]["gitdrop"], hub.path)
    # again: the same file (the entry is replaced, not added twice)
    g.ok("mcp", "install", "--client", "codex", "--as", "core/spartan", "--no-check")
    assert config.read_text() == text

    # CODEX_HOME moves the user config; --scope project writes the project's
    codex_home = home / "elsewhere"
    g.ok("mcp", "install", "--client", "codex", "--no-check", env={"CODEX_HOME": str(codex_home)})
    assert load(codex_home / "config.toml")["gitdrop"]["args"][-3:] == ["serve", "--tools", "agent"]


@pytest.mark.parametrize("client,name,text", [
    ("claude-code", ".mcp.json", '{"mcpServers": {"other": {"command": "x"},}'),
    ("claude-code", ".mcp.json", '["not", "an", "object"]'),
    ("gemini", ".gemini/settings.json", '{\n  // a comment\n  "theme": "GitHub"\n}'),
    ("codex", ".codex/config.toml", 'model = "o3"\n[mcp_servers.other\ncommand = "x"\n'),
    ("codex", ".codex/config.toml",  # an entry this command does not rewrite
     'mcp_servers = { gitdrop = { command = "gitdrop" } }\n'),
])
def test_a_config_that_does_not_parse_is_left_alone(where, client, name, text):
    g, home, project = where
    path = (home if client == "codex" else project) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    doc = g.refused(3, "client-config", "mcp", "install", "--client", client, "--as",
                    "core/spartan", cwd=project)
    assert str(path) in doc["reason"] and "by hand" in doc["fix"]
    assert path.read_text() == text
    assert sorted(os.listdir(path.parent)) == [os.path.basename(name)]  # no stray temp file


def test_a_bad_hub_or_room_is_exit_4_and_nothing_is_written(where, tmp_path):
    g, home, project = where
    for client in ("claude-code", "gemini", "codex"):
        r = g("mcp", "install", "--client", client, "--hub", str(tmp_path / "nohub.git"),
              cwd=project)
        assert r.rc == 4 and "no such hub" in r.err and "gitdrop init" in r.err, r
        r = g("mcp", "install", "--client", client, "--room", "nowhere", cwd=project)
        assert r.rc == 4 and "nowhere" in r.err, r
    assert os.listdir(project) == [] and os.listdir(home) == []


def test_print_shows_the_entry_and_writes_nothing(where, hub):
    g, home, project = where
    r = g.ok("mcp", "install", "--client", "codex", "--as", "core/spartan", "--print",
             cwd=project)
    assert_entry(tomllib.loads(r.out)["mcp_servers"]["gitdrop"], hub.path)
    assert "nothing written" in r.err and "lists" not in r.err  # nothing started either
    r = g.ok("mcp", "install", "--client", "gemini", "--as", "core/spartan", "--print",
             cwd=project)
    assert_entry(json.loads(r.out)["mcpServers"]["gitdrop"], hub.path)
    assert os.listdir(project) == [] and os.listdir(home) == []


def test_the_check_starts_exactly_the_entry_and_reports_a_failure(where, hub, tmp_path,
                                                                  monkeypatch, capsys):
    """In-process, with the command swapped for a wrapper that records how it was
    started: the check runs the entry's command, args and env; when the server fails
    its stderr is reported and nothing is written."""
    from gitdrop.cli.main import main
    _g, home, project = where
    log = tmp_path / "started"
    wrapper = tmp_path / "gitdrop-wrapper"
    real = ENTRY
    wrapper.write_text("#!/bin/sh\n"
                       f'echo "$* | $GITDROP_HUB | $GITDROP_ROOM | $(pwd)" >> {log}\n'
                       f'exec {" ".join(real)} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setattr(setup, "server_command", lambda: [str(wrapper)])
    monkeypatch.setenv("HOME", str(home))
    for name in ("GITDROP_AGENT", "GITDROP_ROOM", "GITDROP_HUB"):
        monkeypatch.delenv(name, raising=False)

    def run(*args):
        with pytest.raises(SystemExit) as done:
            main(["--hub", hub.path, "mcp", "install", "--project", str(project), *args])
        return done.value.code, capsys.readouterr()

    code, out = run("--client", "claude-code", "--as", "core/spartan", "--tools", "lead")
    assert code == 0, out
    assert "lists 39 tools (lead profile)" in out.err
    assert log.read_text() == f"serve --as core/spartan --tools lead | {hub.path} | lobby | " \
                              f"{project}\n"
    assert load(project / ".mcp.json")["gitdrop"]["command"] == str(wrapper)

    wrapper.write_text("#!/bin/sh\necho 'gitdrop: the wrapper refuses to start' >&2\nexit 3\n")
    code, out = run("--client", "gemini", "--as", "core/spartan")
    assert code == 1, out
    assert "did not start as the client would start it" in out.err
    assert "the wrapper refuses to start" in out.err and "fix what its stderr says" in out.err
    assert not (project / ".gemini").exists()


def test_check_says_what_is_missing(where):
    g, _home, project = where
    r = g("mcp", "check", "--client", "claude-code", cwd=project)
    assert r.rc == 4 and "no Claude Code config" in r.err, r
    (project / ".mcp.json").write_text(json.dumps({"mcpServers": {"other": {"command": "x"}}}))
    r = g("mcp", "check", "--client", "claude-code", cwd=project)
    assert r.rc == 4 and "no MCP server named 'gitdrop'" in r.err, r
    r = g("mcp", "check", "--client", "claude-code", "--name", "other", cwd=project)
    assert r.rc == 1 and "FileNotFoundError" in r.err and "run it by hand" in r.err, r


def test_toml_merge_appends_and_refuses_what_it_cannot_place():
    entry = {"command": "/v/bin/gitdrop", "args": ["serve"], "env": {"GITDROP_HUB": "/h"}}
    new, old = setup.merge_toml("c.toml", "", "gitdrop", entry)
    assert old == {} and tomllib.loads(new) == {"mcp_servers": {"gitdrop": entry}}
    text = 'a = 1\n[mcp_servers]\n[mcp_servers.gitdrop-2]\ncommand = "x"'  # no final newline
    new, _ = setup.merge_toml("c.toml", text, "gitdrop", entry)
    assert new.startswith(text + "\n") and tomllib.loads(new)["mcp_servers"]["gitdrop"] == entry
    dotted = '[mcp_servers]\ngitdrop.command = "x"\n'
    with pytest.raises(Exception, match="does not edit"):
        setup.merge_toml("c.toml", dotted, "gitdrop", entry)


def test_the_gitdrop_http_command_serves_a_clone_to_a_login(hub, tmp_path):
    g = Gitdrop(hub.path, str(tmp_path))
    users = tmp_path / "users"
    password = g.ok("http", "--users", users, "--add-user", "core/juno").out.strip()
    assert len(password) > 20 and stat.S_IMODE(users.stat().st_mode) == 0o600
    token = tokens.mint(hub.path, "core/spartan")
    proc = subprocess.Popen([*ENTRY, "http", hub.path, "--port", "0", "--users", str(users),
                             "--quiet"], env=g.env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith(f"serving {os.path.realpath(hub.path)} at http://127.0.0.1:"), \
            line + proc.stderr.read() if proc.poll() is not None else line
        url = line.split(" at ", 1)[1].strip()
        assert url.endswith("/hub.git")
        login = url.replace("http://", f"http://core%2Fjuno:{password}@")
        git("clone", "-q", "-b", "rooms/lobby", login, str(tmp_path / "juno"))
        assert (tmp_path / "juno" / ".git").is_dir()
        git("clone", "-q", "-b", "rooms/lobby", url.replace("http://", f"http://token:{token}@"),
            str(tmp_path / "spartan"))
        refused = git("clone", "-q", url, str(tmp_path / "nobody"), check=False)
        assert refused.returncode != 0 and not (tmp_path / "nobody" / ".git").exists()
        wrong = url.replace("http://", "http://core%2Fjuno:wrong@")
        assert git("ls-remote", wrong, check=False).returncode != 0
    finally:
        proc.terminate()
        proc.wait(10)
        proc.stdout.close()
        proc.stderr.close()


def test_anonymous_reads_on_loopback_answer_only_to_this_machine_by_name(hub, tmp_path):
    """A web page whose own name resolves to 127.0.0.1 (DNS rebinding) would read the
    hub through the browser: without a login, only 127.0.0.1, localhost and [::1]."""
    import threading
    import urllib.error
    import urllib.request
    from gitdrop.transports import httpd
    srv = httpd.serve(hub.path, "127.0.0.1", 0, tokens=False, anonymous_read=True, quiet=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        port = srv.server_port
        url = f"http://127.0.0.1:{port}/hub.git/info/refs?service=git-upload-pack"
        ok = urllib.request.urlopen(url, timeout=10).read()
        assert b"refs/heads/rooms/lobby" in ok
        assert git("ls-remote", f"http://localhost:{port}/hub.git").returncode == 0
        for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1.evil.example:{port}"):
            req = urllib.request.Request(url, headers={"Host": host})
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(req, timeout=10)
            assert e.value.code == 421 and b"rooms" not in e.value.read(), host
    finally:
        srv.shutdown()
        srv.server_close()


def test_silent_connections_are_closed_and_cannot_take_every_thread(hub):
    """Connections opened and left silent held a server thread each, for ever (before
    any login): now they are closed after `idle` seconds, and at most `connections`
    are served at once, the next waiting its turn instead of a new thread."""
    import socket
    import threading
    import time
    import urllib.request
    from gitdrop.transports import httpd
    srv = httpd.serve(hub.path, "127.0.0.1", 0, tokens=False, anonymous_read=True, quiet=True,
                      idle=1.0, connections=2)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    silent = [socket.create_connection(("127.0.0.1", srv.server_port), 10) for _ in range(2)]
    try:
        start = time.monotonic()
        url = f"http://127.0.0.1:{srv.server_port}/hub.git/info/refs?service=git-upload-pack"
        got = urllib.request.urlopen(url, timeout=15).read()
        took = time.monotonic() - start
        assert b"refs/heads/rooms/lobby" in got
        assert 0.5 < took < 10, took   # it waited for a silent one to be closed
        for s in silent:
            s.settimeout(10)
            assert s.recv(100) == b""   # closed by the server
    finally:
        for s in silent:
            s.close()
        srv.shutdown()
        srv.server_close()


def test_gitdrop_http_binds_loopback_and_refuses_a_public_address_nobody_logs_in_to(
        hub, tmp_path):
    from gitdrop.errors import UsageError
    from gitdrop.transports import httpd
    g = Gitdrop(hub.path, str(tmp_path))
    r = g("http", hub.path, "--host", "0.0.0.0", "--no-tokens", "--anonymous-read")
    assert r.rc == 2 and "nobody could log in" in r.err, r
    r = g("http", str(tmp_path / "nohub.git"), "--port", "0")
    assert r.rc == 4 and "no hub at" in r.err, r
    r = g("http", "--add-user", "core/juno")
    assert r.rc == 2 and "--users FILE" in r.err, r
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        assert httpd.check_bind(host, "", False, True) == [], host
    warned = httpd.check_bind("0.0.0.0", "", True, True)
    assert "clear text" in warned[0] and "clone the hub" in warned[1]
    assert len(httpd.check_bind("::", "users", False, False)) == 1
    with pytest.raises(UsageError):
        httpd.check_bind("0.0.0.0", "", False, False)
    # the module still runs by itself, with the same policy
    p = subprocess.run([sys.executable, "-m", "gitdrop.transports.httpd", hub.path, "--host",
                        "0.0.0.0", "--no-tokens"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "nobody could log in" in p.stderr, p.stderr
