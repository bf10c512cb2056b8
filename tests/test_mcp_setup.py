"""Setting up: `gitdrop http` (the hub over smart HTTP)."""

import os
import stat
import subprocess
import sys

import pytest
from cli_helpers import ENTRY, Gitdrop
from conftest import git

from gitdrop import tokens


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
