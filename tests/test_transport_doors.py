"""What a client can send through gitdrop's own doors beside git's protocol: the
environment of an SSH session (on an sshd that accepts client variables), the git
config of the serving account, and the bytes of an HTTP request. None of it turns
the hook off, runs a command on the server, or holds the server."""

import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from gitdrop import hub as hubmod, tokens
from gitdrop.transports import httpd

from conftest import Clone, git, refused_rule
from test_transports import Ssh, stop

EVIL_HOOKS = {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "core.hooksPath",
              "GIT_CONFIG_VALUE_0": "/nonexistent"}


class PermissiveSsh(Ssh):
    """gitdrop-shell behind an sshd that accepts every variable a client sends
    (AcceptEnv *: a careless configuration, or one made for other accounts)."""

    def spawn(self, cmd, **kw):
        if cmd and "sshd" in os.path.basename(cmd[0]):
            with open(cmd[cmd.index("-f") + 1], "a") as f:
                f.write("AcceptEnv *\n")
        return super().spawn(cmd, **kw)


@pytest.fixture(scope="module")
def permissive(tmp_path_factory):
    s = PermissiveSsh(tmp_path_factory.mktemp("ssh-env"))
    try:
        s.start()
        room = s.hub.room("lobby")
        room.register("core/juno", ["lead"])
        room.register("core/spartan", ["coder"])
        yield s
    finally:
        s.close()


def _ssh_with(served, variables: dict) -> dict:
    """GIT_SSH_COMMAND that sends `variables` to the server (ssh -o SetEnv, on a
    connection of its own: a shared one sends only its first session's)."""
    sent = " ".join(f'"{k}={v}"' for k, v in variables.items())
    return {"GIT_SSH_COMMAND": " ".join(served.ssh) + f" -S none -o 'SetEnv={sent}'"}


def test_a_clients_git_config_does_not_turn_the_hook_off(permissive, tmp_path):
    """juno's key, with git config sent as session variables: the hook still runs
    (a commit authored by spartan is refused) and no ref outside the rooms is made."""
    c = Clone(permissive.url("core/juno"), tmp_path / "c").as_("core/spartan")
    before = permissive.hub.store.room_tip("lobby")
    c.commit("forged: spartan's name on juno's key", allow_empty=True)
    env = _ssh_with(permissive, EVIL_HOOKS)
    p = git("push", "origin", "HEAD:rooms/lobby", "HEAD:refs/heads/not-a-room",
            cwd=c.path, env=env, check=False)
    assert p.returncode != 0 and refused_rule(p.stderr) == "authenticated-pusher", p.stderr
    assert permissive.hub.store.room_tip("lobby") == before
    refs = git("for-each-ref", "--format=%(refname)", cwd=permissive.hub.path).stdout
    assert "not-a-room" not in refs
    # The same push with the key's own name goes through: the variables changed nothing.
    c.as_("core/juno")
    git("commit", "-q", "--amend", "--reset-author", "--allow-empty", "-m", "hello",
        cwd=c.path)
    p = git("push", "origin", "HEAD:rooms/lobby", cwd=c.path, env=env, check=False)
    assert p.returncode == 0, p.stderr


def test_a_clients_git_config_runs_no_command_on_the_server(permissive, tmp_path):
    """uploadpack.packObjectsHook, given as command-line config, would run any command
    as the hub's account on a fetch."""
    mark = tmp_path / "ran"
    env = _ssh_with(permissive, {"GIT_CONFIG_COUNT": "1",
                                 "GIT_CONFIG_KEY_0": "uploadpack.packObjectsHook",
                                 "GIT_CONFIG_VALUE_0": f"touch {mark};"})
    p = git("clone", "-q", "-b", "rooms/lobby", permissive.url("core/juno"),
            str(tmp_path / "c2"), env=env, check=False)
    assert p.returncode == 0, p.stderr
    assert not mark.exists()


def test_gitdrop_shell_serves_gitdrop_hubs_only(tmp_path):
    """Without --hub on the key's line, $GITDROP_HUB names the hub, and a client may
    send it (AcceptEnv): it may name no repository that is not a gitdrop hub."""
    other = tmp_path / "other.git"
    git("init", "-q", "--bare", str(other))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT")}
    env.update(SSH_ORIGINAL_COMMAND=f"git-receive-pack '{other}'", GITDROP_HUB=str(other))
    p = subprocess.run([sys.executable, "-m", "gitdrop.transports.shell", "core/juno"],
                       env=env, input=b"0000", capture_output=True, timeout=30)
    assert p.returncode == 1 and b"not a gitdrop hub" in p.stderr, p.stderr
    assert b"refs/heads" not in p.stdout and b"capabilities" not in p.stdout


# --- the serving account's git config ------------------------------------------------

def _account_with_hooks_elsewhere(tmp_path) -> str:
    """A HOME whose global git config sends every repository's hooks elsewhere (a
    hooks manager's, or a company's dotfiles)."""
    home = tmp_path / "account"
    (home / "hooks").mkdir(parents=True)
    (home / ".gitconfig").write_text(f"[core]\n\thooksPath = {home / 'hooks'}\n")
    return str(home)


def test_a_global_hooks_path_does_not_turn_a_hubs_hook_off(tmp_path):
    """A hub made now keeps its own hooks; a push as anyone else is refused."""
    home = _account_with_hooks_elsewhere(tmp_path)
    h = hubmod.init(str(tmp_path / "hub.git"))
    h.room("lobby").register("core/juno", ["lead"])
    c = Clone(h.path, tmp_path / "c")
    c.write("nonsense.txt", "no rule knows this file\n").commit("a file no rule allows")
    p = git("push", "origin", "HEAD:rooms/lobby", cwd=c.path, env={"HOME": home},
            check=False)
    assert p.returncode != 0 and refused_rule(p.stderr), p.stderr
    assert h.store.room_tip("lobby") != c.head()


def _serve(hub_path, **kw):
    srv = httpd.serve(hub_path, port=0, quiet=True, **kw)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def test_gitdrop_http_runs_the_hubs_own_hook_whatever_the_account_says(tmp_path):
    """A hub made before hubs pinned their hooks, served by an account whose global
    config sends hooks elsewhere: gitdrop http still runs the hub's hook."""
    home = _account_with_hooks_elsewhere(tmp_path)
    h = hubmod.init(str(tmp_path / "hub.git"))
    h.room("lobby").register("core/juno", ["lead"])
    h.room("lobby").register("core/spartan", ["coder"])
    git("config", "--unset", "core.hooksPath", cwd=h.path, check=False)   # as older hubs are
    secret = tokens.mint(h.path, "core/juno")
    server = subprocess.Popen([sys.executable, "-m", "gitdrop.transports.httpd", h.path,
                               "--port", "0", "--quiet"], stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, HOME=home), start_new_session=True,
                              cwd=os.path.dirname(os.path.dirname(httpd.__file__)) + "/..")
    try:
        port = server.stdout.readline().split(":")[2].split("/")[0]
        url = f"http://core%2Fjuno:{secret}@127.0.0.1:{port}/hub.git"
        c = Clone(url, tmp_path / "c").as_("core/spartan")
        c.commit("forged", allow_empty=True)
        ok, err = c.push()
        assert not ok and refused_rule(err) == "authenticated-pusher", err
        assert h.store.room_tip("lobby") != c.head()
    finally:
        stop(server)


# --- the bytes of an HTTP request ----------------------------------------------------

def _request(port: int, raw: bytes, then: bytes = b"", timeout: float = 20) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout) as s:
        s.sendall(raw)
        if then:
            try:
                s.sendall(then)
            except OSError:
                pass   # the server answered and closed first
        out = b""
        while True:
            try:
                data = s.recv(65536)
            except ConnectionResetError:
                break
            if not data:
                break
            out += data
        return out


@pytest.fixture
def http_hub(tmp_path):
    h = hubmod.init(str(tmp_path / "hub.git"))
    h.room("lobby").register("core/juno", ["lead"])
    return h, tokens.mint(h.path, "core/juno")


def _auth(secret: str) -> bytes:
    import base64
    return b"Authorization: Basic " + base64.b64encode(f"core/juno:{secret}".encode()) + b"\r\n"


@pytest.mark.parametrize("framing", [b"Content-Length: -1\r\n",
                                     b"Transfer-Encoding: chunked\r\n"])
def test_a_negative_length_is_refused_before_the_body_is_read(http_hub, framing):
    """Content-Length -1, or a chunk of size -1, read the whole connection into memory
    (read(-1)): 400 at once, with the body still coming."""
    h, secret = http_hub
    srv = _serve(h.path)
    try:
        head = (b"POST /hub.git/git-upload-pack HTTP/1.1\r\nHost: 127.0.0.1\r\n" + _auth(secret)
                + framing + b"Content-Type: application/x-git-upload-pack-request\r\n\r\n")
        first = b"-1\r\n" if b"chunked" in framing else b""
        start = time.monotonic()
        out = _request(srv.server_port, head + first, b"x" * (1 << 20))
        assert out.startswith(b"HTTP/1.0 400") or out.startswith(b"HTTP/1.1 400"), out[:200]
        assert time.monotonic() - start < 10
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_nul_in_the_git_protocol_header_is_not_a_server_error(http_hub):
    h, secret = http_hub
    srv = _serve(h.path)
    try:
        out = _request(srv.server_port, b"GET /hub.git/info/refs?service=git-upload-pack "
                       b"HTTP/1.1\r\nHost: 127.0.0.1\r\n" + _auth(secret)
                       + b"Git-Protocol: version=2\x00x\r\n\r\n")
        assert out.split(b"\r\n")[0].endswith(b"200 OK"), out[:200]
        assert b"refs/heads/rooms/lobby" in out
    finally:
        srv.shutdown()
        srv.server_close()


def test_an_encoded_push_service_needs_a_login(http_hub):
    """--anonymous-read lets fetches through without a login; a push's advertisement,
    however its name is encoded in the query, is not a fetch."""
    h, _ = http_hub
    srv = _serve(h.path, anonymous_read=True)
    try:
        for query in (b"service=git-receive-pack", b"service=git%2dreceive-pack",
                      b"service=%67it-receive-pack"):
            out = _request(srv.server_port, b"GET /hub.git/info/refs?" + query +
                           b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert out.split(b"\r\n")[0].endswith(b"401 Unauthorized"), (query, out[:200])
        out = _request(srv.server_port, b"GET /hub.git/info/refs?service=git-upload-pack "
                       b"HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert out.split(b"\r\n")[0].endswith(b"200 OK"), out[:200]
    finally:
        srv.shutdown()
        srv.server_close()


def test_connections_that_trickle_their_headers_do_not_hold_the_server(http_hub, tmp_path):
    """Every connection slot taken by a client sending a byte now and then (before
    any login): each is cut once its headers are late, and a real fetch goes through."""
    h, secret = http_hub
    srv = _serve(h.path, connections=4, header_wait=1.0)
    slow, stop_trickle = [], threading.Event()
    try:
        for _ in range(4):
            s = socket.create_connection(("127.0.0.1", srv.server_port), 5)
            s.sendall(b"G")
            slow.append(s)

        def trickle():
            while not stop_trickle.wait(0.3):
                for s in slow:
                    try:
                        s.sendall(b"E")
                    except OSError:
                        pass
        threading.Thread(target=trickle, daemon=True).start()
        time.sleep(0.3)
        start = time.monotonic()
        p = subprocess.run(["git", "ls-remote", f"http://core%2Fjuno:{secret}@127.0.0.1:"
                            f"{srv.server_port}/hub.git"], capture_output=True, text=True,
                           timeout=20, env=dict(os.environ, GIT_TERMINAL_PROMPT="0"))
        assert p.returncode == 0 and "refs/heads/rooms/lobby" in p.stdout, p.stderr
        assert time.monotonic() - start < 10
    finally:
        stop_trickle.set()
        for s in slow:
            s.close()
        srv.shutdown()
        srv.server_close()


def test_one_address_of_another_machine_holds_few_connections_before_its_headers(http_hub):
    """64 silent sockets from one address held every slot before any login, and a
    logged-in fetch waited 20 s. Past UNHEARD, such an address's next connection is
    closed at once. (The server sees these as coming from another machine: a test
    server listens on 127.0.0.1 only, so the address accept() returns is rewritten.)"""
    h, secret = http_hub
    srv = _serve(h.path, connections=16, header_wait=30.0)
    accept = srv.get_request
    srv.get_request = lambda: (lambda sock_addr: (sock_addr[0], ("198.51.100.7",
                                                                 sock_addr[1][1])))(accept())
    silent = []
    try:
        for _ in range(httpd.UNHEARD):
            silent.append(socket.create_connection(("127.0.0.1", srv.server_port), 5))
        time.sleep(0.5)
        extra = socket.create_connection(("127.0.0.1", srv.server_port), 5)
        extra.settimeout(5)
        try:   # closed at once, not held for the header wait
            assert extra.recv(1) == b""
        except ConnectionResetError:
            pass
        finally:
            extra.close()
        start = time.monotonic()   # the address's own next request, with its headers
        got = _request(srv.server_port, b"GET /hub.git/info/refs?service=git-upload-pack "
                       b"HTTP/1.1\r\nHost: 127.0.0.1\r\n" + _auth(secret) +
                       b"Connection: close\r\n\r\n")
        assert got == b"" or time.monotonic() - start < 5   # refused at once, or served
        silent.pop().close()   # one of the silent ones gone: room for one more
        time.sleep(0.5)
        got = _request(srv.server_port, b"GET /hub.git/info/refs?service=git-upload-pack "
                       b"HTTP/1.1\r\nHost: 127.0.0.1\r\n" + _auth(secret) +
                       b"Connection: close\r\n\r\n")
        assert got.startswith(b"HTTP/1.0 200") or got.startswith(b"HTTP/1.1 200"), got[:200]
    finally:
        for s in silent:
            s.close()
        srv.shutdown()
        srv.server_close()


def test_a_body_that_trickles_is_cut(http_hub):
    """Whole headers, then a body of a byte now and then (each read well within the
    idle timeout): cut once it comes at under the minimum pace, with a 400."""
    h, secret = http_hub
    srv = _serve(h.path, header_wait=1.0)
    try:
        with socket.create_connection(("127.0.0.1", srv.server_port), 20) as s:
            s.sendall(b"POST /hub.git/git-upload-pack HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                      + _auth(secret) + b"Content-Length: 100000\r\n"
                      b"Content-Type: application/x-git-upload-pack-request\r\n\r\n")
            start, answer = time.monotonic(), b""
            s.settimeout(0.2)
            while time.monotonic() - start < 15 and not answer:
                try:
                    s.sendall(b"0")
                    answer = s.recv(4096)
                except socket.timeout:
                    continue
                except OSError:
                    break
            s.settimeout(5)
            while answer and not answer.endswith(b"\n\n") and b"bytes a second" not in answer:
                try:   # the rest of the answer, in as many pieces as it comes
                    more = s.recv(4096)
                except OSError:
                    break
                if not more:
                    break
                answer += more
            assert answer.split(b"\r\n")[0].endswith(b"400 Bad Request"), answer[:200]
            assert b"bytes a second" in answer
            assert time.monotonic() - start < 8
    finally:
        srv.shutdown()
        srv.server_close()
