"""Serve a hub over smart HTTP: `git http-backend` as CGI behind HTTP Basic auth.

    gitdrop http [HUB] [--host 127.0.0.1] [--port 8080] [--users FILE]
    gitdrop http --users FILE --add-user team/name   (prints a new password)
    python -m gitdrop.transports.httpd HUB ...        (the same without the CLI)

The hub is served at /<its directory name> (http://HOST:PORT/hub.git). Every
request must authenticate, by a line of the users file (`team/name:sha256:<hex of
the password>`) or by a gitdrop token of the hub (`gitdrop token`, any user name
or the token's agent). The agent becomes REMOTE_USER, which the pre-receive hook
reads: a pushed commit authored by anyone else is refused. --anonymous-read lets
fetches through without a password; pushes always need one.

It binds 127.0.0.1 unless told otherwise (check_bind): an address other machines
reach is refused when nobody could log in (no users file and --no-tokens), and
served with a warning otherwise, since Basic auth sends passwords and tokens in
clear text (put a TLS proxy in front).
"""

import argparse
import base64
import hashlib
import hmac
import ipaddress
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from socketserver import ThreadingMixIn
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from ..errors import GitdropError, NotFound, UsageError
from ..files import NOFOLLOW, never_world_writable
from ..hook import IDENTITY_VARS
from .shell import wanted_protocol

MAX_BODY = 256 * 1024 * 1024
CHUNK = 64 * 1024
_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
        "proxy-authenticate", "proxy-authorization"}


class Users:
    """The users file, re-read when it changes: `team/name:sha256:<hex>` per line."""

    def __init__(self, path: str = ""):
        self.path = path
        self._stamp = None
        self._hashes: dict[str, str] = {}

    def _refresh(self):
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        except OSError:
            stamp = None
        if stamp == self._stamp:
            return
        hashes = {}
        if stamp:
            with open(self.path) as f:
                for line in f:
                    line = line.strip()
                    if not line or line.startswith("#"):
                        continue
                    name, _, secret = line.partition(":")
                    scheme, _, value = secret.partition(":")
                    if scheme == "sha256" and value:
                        hashes[name] = value.lower()
        self._hashes, self._stamp = hashes, stamp

    def check(self, user: str, password: str) -> bool:
        if not self.path:
            return False
        self._refresh()
        want = self._hashes.get(user)
        got = hashlib.sha256(password.encode()).hexdigest()
        return want is not None and hmac.compare_digest(want, got)


def add_user(path: str, agent: str) -> str:
    """Append a user with a fresh random password; returns the password."""
    from ..model import is_agent_id
    if not is_agent_id(agent):
        raise UsageError(f"{agent!r} is not an agent id", "give the agent as team/name")
    password = secrets.token_urlsafe(24)
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_APPEND | NOFOLLOW, 0o600)
    with os.fdopen(fd, "a") as f:
        f.write(f"{agent}:sha256:{hashlib.sha256(password.encode()).hexdigest()}\n")
    return password


MIN_RATE = 500   # bytes a second a request body must come at, on average, after a grace


class Pace:
    """A body that comes at less than MIN_RATE on average, once `grace` seconds have
    passed, is cut (ValueError): a byte every minute passed the idle timeout, which
    bounds one read only, and held the connection for ever (Apache's mod_reqtimeout
    does the same)."""

    def __init__(self, grace: float):
        self.grace, self.start, self.got = grace, time.monotonic(), 0

    def add(self, n: int) -> None:
        self.got += n
        late = time.monotonic() - self.start - self.grace
        if late > 0 and self.got < late * MIN_RATE:
            raise ValueError(f"the request body came at under {MIN_RATE} bytes a second")


def copy(stream, out, size: int, short: str, pace: Pace | None = None) -> None:
    """Copy exactly `size` bytes; ValueError(short) if the stream ends first."""
    if size < 0:   # read(-1) reads to the end: the whole connection, into memory
        raise ValueError("a negative length")
    while size:
        data = stream.read1(min(size, CHUNK)) if hasattr(stream, "read1") else \
            stream.read(min(size, CHUNK))
        if not data:
            raise ValueError(short)
        out.write(data)
        size -= len(data)
        if pace is not None:
            pace.add(len(data))


def dechunk(stream, out, limit: int = MAX_BODY, pace: Pace | None = None) -> int:
    """Copy a chunked transfer-encoded body to `out` (wsgiref hands it over raw)."""
    total = 0
    while True:
        line = stream.readline(1024)
        if not line:
            raise ValueError("truncated chunked body")
        digits = line.split(b";", 1)[0].strip() or b"0"
        if len(digits) > 16 or digits.strip(b"0123456789abcdefABCDEF"):   # int() takes -1, 0x
            raise ValueError("a chunk size that is not hexadecimal digits")
        size = int(digits, 16)
        if size == 0:
            while stream.readline(1024) not in (b"\r\n", b"\n", b""):
                pass   # trailers
            return total
        total += size
        if total > limit:
            raise ValueError("request body too large")
        copy(stream, out, size, "truncated chunked body", pace)
        stream.readline(8)   # the CRLF after each chunk


class GitApp:
    """The WSGI app: authenticate, then hand the request to git http-backend."""

    def __init__(self, hub: str, users: str = "", tokens: bool = True,
                 anonymous_read: bool = False, hosts=None, grace: float = 30.0):
        self.hub = os.path.realpath(hub)
        # Bound to this machine, a read without a login answers only requests addressed
        # to it by name: a web page whose name resolves to 127.0.0.1 (DNS rebinding)
        # would otherwise read the hub through the browser. None: any name.
        self.hosts = None if hosts is None else {h.lower() for h in hosts}
        if not os.path.exists(os.path.join(self.hub, "HEAD")):
            raise NotFound(f"no hub at {self.hub}", "pass the path of a hub (gitdrop init "
                           "PATH makes one)")
        from .. import wal
        wal.ensure(self.hub)   # after a crash: replay the log before serving it
        self.name = os.path.basename(self.hub)
        self.users = Users(users)
        self.tokens = None
        if tokens:
            try:
                from ..tokens import Verifier
                self.tokens = Verifier(self.hub)
            except ImportError:
                pass
        self.anonymous_read = anonymous_read
        self.grace = grace   # seconds before a body's pace counts (Pace)

    def identify(self, environ) -> str:
        """The authenticated agent, or ""."""
        auth = environ.get("HTTP_AUTHORIZATION", "")
        if not auth.lower().startswith("basic "):
            return ""
        try:
            user, _, password = base64.b64decode(auth[6:].strip()).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return ""
        if user and self.users.check(user, password):
            return user
        if self.tokens is not None:
            agent = self.tokens.agent(password)
            if agent and user in ("", "token", agent):
                return agent
        return ""

    def __call__(self, environ, start_response):
        path = environ.get("PATH_INFO", "")
        prefix = "/" + self.name
        if not (path == prefix or path.startswith(prefix + "/")) or "/../" in path + "/":
            return _plain(start_response, "404 Not Found", f"this server has {prefix} only\n")
        if any(ch < " " or ch == "\x7f" for ch in path + environ.get("QUERY_STRING", "")):
            # a NUL cannot go into git's environment: it was a 500
            return _plain(start_response, "400 Bad Request",
                          "a control character in the URL: no git path has one\n")
        # As git http-backend reads the query (decoded: git%2dreceive-pack is a push)
        service = parse_qs(environ.get("QUERY_STRING", "")).get("service", [""])
        push = path.endswith("/git-receive-pack") or "git-receive-pack" in service
        user = self.identify(environ)
        if not user and (push or not self.anonymous_read):
            return _plain(start_response, "401 Unauthorized",
                          "log in as your agent (team/name) with its password or token\n",
                          [("WWW-Authenticate", 'Basic realm="gitdrop"')])
        if not user and self.hosts is not None and \
                host_of(environ.get("HTTP_HOST", "")) not in self.hosts:
            return _plain(start_response, "421 Misdirected Request",
                          f"without a login this server answers to {', '.join(sorted(self.hosts))}"
                          " only: use the URL it printed, or log in\n")
        body = tempfile.TemporaryFile()
        try:
            length = self._read_body(environ, body)
        except ValueError as e:
            body.close()
            return _plain(start_response, "400 Bad Request", f"{e}\n")
        body.seek(0)
        return self._backend(environ, start_response, user, body, length)

    def _read_body(self, environ, out) -> int:
        stream, pace = environ["wsgi.input"], Pace(self.grace)
        if "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower():
            return dechunk(stream, out, pace=pace)
        given = environ.get("CONTENT_LENGTH") or "0"
        if not given.isdigit() or not given.isascii():
            raise ValueError(f"Content-Length {given[:20]!r} is not a length")
        length = int(given)
        if length > MAX_BODY:
            raise ValueError("request body too large")
        copy(stream, out, length, "truncated body", pace)
        return length

    def _backend(self, environ, start_response, user, body, length):
        env = {k: v for k, v in os.environ.items()
               if k not in IDENTITY_VARS and not k.startswith("HTTP_")}
        env.update({k: v for k, v in environ.items() if k.startswith("HTTP_") and
                    k != "HTTP_AUTHORIZATION" and isinstance(v, str) and "\0" not in v})
        env.update({
            "GIT_PROJECT_ROOT": os.path.dirname(self.hub), "GIT_HTTP_EXPORT_ALL": "1",
            "PATH_INFO": environ.get("PATH_INFO", ""), "REQUEST_METHOD":
            environ.get("REQUEST_METHOD", "GET"), "QUERY_STRING": environ.get("QUERY_STRING", ""),
            "CONTENT_TYPE": environ.get("CONTENT_TYPE", ""), "CONTENT_LENGTH": str(length),
            "REMOTE_ADDR": environ.get("REMOTE_ADDR", ""), "SERVER_PROTOCOL": "HTTP/1.1",
            "GATEWAY_INTERFACE": "CGI/1.1"})
        if user:
            env["REMOTE_USER"] = user
        env.pop("HTTP_GIT_PROTOCOL", None)
        protocol = wanted_protocol(environ.get("HTTP_GIT_PROTOCOL", ""))
        if protocol:
            env["GIT_PROTOCOL"] = protocol
        # The hub's own hooks, whatever the serving account's git config says.
        proc = subprocess.Popen(["git", "-c", f"core.hooksPath={os.path.join(self.hub, 'hooks')}",
                                 "http-backend"], stdin=body, stdout=subprocess.PIPE, env=env)
        body.close()   # the child holds its own descriptor
        status, headers = "200 OK", []
        while True:
            line = proc.stdout.readline()
            if not line or line in (b"\r\n", b"\n"):
                break
            k, _, v = line.decode("latin-1").rstrip("\r\n").partition(":")
            if k.lower() == "status":
                status = v.strip()
            elif k.lower() not in _HOP:
                headers.append((k.strip(), v.strip()))
        start_response(status, headers)
        return _stream(proc)


def _stream(proc):
    try:
        while True:
            data = proc.stdout.read1(CHUNK)
            if not data:
                break
            yield data
    finally:
        proc.stdout.close()
        proc.wait()


def _plain(start_response, status, text, extra=()):
    data = text.encode()
    start_response(status, [("Content-Type", "text/plain; charset=utf-8"),
                            ("Content-Length", str(len(data))), *extra])
    return [data]


IDLE = 60.0       # seconds a connection may stay silent (reading or writing) before it is closed
HEADER_WAIT = 30.0   # seconds a connection has to send its whole request line and headers
CONNECTIONS = 64  # connections served at once; the next ones wait to be accepted
# Connections one client of another machine (client_key) may hold before its
# request's headers are in, before any login: 64 silent sockets from one address
# held every slot, and a logged-in fetch waited 20 s. Past it one is closed at once.
UNHEARD = 8


class Server(ThreadingMixIn, WSGIServer):
    """A thread per connection, at most `connections` at once. Without a bound and
    the handler's idle timeout, connections opened and left silent (a crashed client,
    or anyone who reaches the port, before any login) each held a thread for ever."""
    daemon_threads = True
    allow_reuse_address = True
    connections = CONNECTIONS

    def process_request(self, request, client_address):
        if not hasattr(self, "_slots"):
            self._slots = threading.BoundedSemaphore(self.connections)
            self._unheard, self._guard = {}, threading.Lock()
        key = client_key(client_address[0])
        with self._guard:
            # not this machine's: its agents share one address, and its own users
            # can stall a local server in other ways anyway (the MCP door does so too)
            if key != "loopback" and sum(1 for k in self._unheard.values()
                                         if k == key) >= UNHEARD:
                self.shutdown_request(request)   # closed: its address has enough waiting
                return
            self._unheard[request] = key
        self._slots.acquire()   # the accept loop waits here: the rest queue in the backlog
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            self.heard(request)
            raise

    def heard(self, request) -> None:
        """The connection has sent its request's headers, or is gone."""
        with self._guard:
            self._unheard.pop(request, None)

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.heard(request)
            self._slots.release()


class _Handler(WSGIRequestHandler):
    quiet = False
    timeout = IDLE   # set on the socket (StreamRequestHandler.setup)
    header_wait = HEADER_WAIT

    def setup(self):
        super().setup()
        # IDLE bounds one read only: a byte every minute held a connection, and 64
        # of them every slot, before any login. Whole headers, or the door closes.
        self._cut = threading.Timer(self.header_wait, self._too_slow)
        self._cut.daemon = True
        self._cut.start()

    def _heard(self):
        heard = getattr(self.server, "heard", None)
        if heard is not None:
            heard(self.request)

    def _too_slow(self):
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def parse_request(self):
        try:
            return super().parse_request()   # the request line and headers are read
        finally:
            self._cut.cancel()
            self._heard()

    def finish(self):
        self._cut.cancel()
        self._heard()
        super().finish()

    def log_message(self, fmt, *args):
        if not self.quiet:
            super().log_message(fmt, *args)


def client_key(peer: str) -> str:
    """Whom a per-address budget counts `peer` as: every loopback address is one
    client (a process here may connect from any 127.x.y.z, and took a fresh budget
    from each), and an IPv6 client is its /64 (one host holds a whole /64)."""
    try:
        ip = ipaddress.ip_address(peer.strip("[]").split("%")[0])
    except ValueError:
        return peer
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return "loopback"
    if ip.version == 6:
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


def is_local(host: str) -> bool:
    """Whether an address to bind is reachable from this machine only (loopback).
    A name counts as local when every address it resolves to is loopback."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0].split("%")[0]).is_loopback
                               for i in infos)


def check_bind(host: str, users: str, tokens: bool, anonymous_read: bool) -> list[str]:
    """The policy for an address other machines reach: refused (UsageError) when
    nobody could log in (no users file, --no-tokens): it would serve either nothing or,
    with --anonymous-read, the whole hub to anyone on the network; otherwise allowed,
    with warnings for the operator. Loopback: always allowed, no warning."""
    if is_local(host):
        return []
    if not users and not tokens:
        raise UsageError(f"--host {host} is reachable from other machines and nobody could "
                         "log in (no --users file, and --no-tokens)",
                         "add logins (--users FILE, or drop --no-tokens), or bind 127.0.0.1 "
                         "behind a proxy")
    warnings = [f"{host} is reachable from other machines, and HTTP Basic sends passwords "
                "and tokens in clear text: put a TLS proxy (Caddy, nginx) in front, or bind "
                "127.0.0.1 behind it"]
    if anonymous_read:
        warnings.append("--anonymous-read: anyone who reaches this address can clone the hub")
    return warnings


LOOPBACK = ("127.0.0.1", "localhost", "::1")   # names of this machine in a Host header


def host_of(header: str) -> str:
    """The name in a Host header, without its port ([::1]:8787 -> ::1)."""
    header = header.strip().lower()
    if header.startswith("["):
        inside, bracket, _ = header[1:].partition("]")
        return inside if bracket else header
    return header.rpartition(":")[0] if header.count(":") == 1 else header


def url_host(host: str) -> str:
    """The host as it goes in a URL (an IPv6 address in brackets)."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def listen(host: str, port: int):
    """A socket bound to host:port (0 picks a free port: getsockname() says which),
    for a server that prints its address before it serves (gitdrop web, gitdrop serve)."""
    import socket
    try:
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET,
                             socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
        sock.listen(128)   # a client may connect as soon as the address is printed
    except OSError as e:  # in use, not an address of this machine, a privileged port
        raise UsageError(f"cannot listen on {url_host(host)}:{port}: {e.strerror or e}",
                         "pick another --port (0: any free one) or --host") from None
    return sock


def serve(hub: str, host: str = "127.0.0.1", port: int = 8080, users: str = "",
          tokens: bool = True, anonymous_read: bool = False, quiet: bool = False,
          idle: float = IDLE, connections: int = CONNECTIONS, header_wait: float = HEADER_WAIT):
    """A server ready to serve_forever(); port 0 picks a free one (server.server_port)."""
    if not shutil.which("git"):
        raise NotFound("git is not on PATH", "install git")
    app = GitApp(hub, users, tokens, anonymous_read,
                 LOOPBACK + (host.strip("[]"),) if is_local(host) else None, header_wait)
    handler = type("Handler", (_Handler,), {"quiet": quiet, "timeout": idle,
                                            "header_wait": header_wait})
    server = type("Bounded", (Server,), {"connections": connections})
    try:
        return make_server(host, port, app, server_class=server, handler_class=handler)
    except OSError as e:  # in use, not an address of this machine, a privileged port
        raise UsageError(f"cannot listen on {url_host(host)}:{port}: {e.strerror or e}",
                         "pick another --port (0: any free one) or --host") from None


def run(srv) -> None:
    """Serve until Ctrl-C, then close the socket."""
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        srv.server_close()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m gitdrop.transports.httpd", description=__doc__.split("\n")[0])
    p.add_argument("hub")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="0 picks a free port")
    p.add_argument("--users", default="", help="users file: team/name:sha256:<hex> lines")
    p.add_argument("--no-tokens", action="store_true", help="ignore the hub's gitdrop tokens")
    p.add_argument("--anonymous-read", action="store_true", help="fetch without a password")
    p.add_argument("--add-user", metavar="AGENT", help="add AGENT to --users, print its password")
    p.add_argument("--quiet", action="store_true", help="no request log")
    a = p.parse_args(argv)
    never_world_writable()
    if a.add_user and not a.users:
        p.error("--add-user needs --users FILE")
    try:
        if a.add_user:
            print(add_user(a.users, a.add_user))
            return 0
        for warning in check_bind(a.host, a.users, not a.no_tokens, a.anonymous_read):
            print(f"warning: {warning}", file=sys.stderr)
        srv = serve(a.hub, a.host, a.port, a.users, not a.no_tokens, a.anonymous_read, a.quiet)
    except GitdropError as e:
        print(f"{p.prog}: {e.reason}" + (f" ({e.fix})" if e.fix else ""), file=sys.stderr)
        return e.exit_code
    print(f"serving {srv.get_app().hub} at http://{url_host(a.host)}:{srv.server_port}/"
          f"{srv.get_app().name}", flush=True)
    run(srv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
