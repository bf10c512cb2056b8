"""Setting up: an MCP client's config for gitdrop's server (`gitdrop mcp install`,
`gitdrop mcp check`) and the hub served over smart HTTP (`gitdrop http`).

`mcp install` writes the entry the templates/ show, with the absolute path of this
install's `gitdrop` (a venv is not on the client's PATH), merged into the client's
config file: other servers and settings are kept, and a file that does not parse
is left alone. Before writing, it starts the server exactly as the client would
(the entry's command, args and env, over stdio, with the MCP SDK's client) and
lists its tools, so a config that cannot start is never written.
"""

import enum
import json
import os
import re
import sys
from dataclasses import dataclass
from typing import Annotated, Optional

import typer

from .base import Scope, command, sub_app
from .tools import Tools   # the MCP server's tool profiles, one enum for serve and install
from ..errors import GitdropError, NotFound, Refusal, UsageError

app = typer.Typer(add_completion=False)
mcp_app = sub_app("mcp", "Connect an MCP client (Claude Code, Gemini CLI, Codex) to the hub: "
                         "write its config, check that the server starts.")


class ClientName(str, enum.Enum):
    claude_code = "claude-code"
    gemini = "gemini"
    codex = "codex"


class ScopeName(str, enum.Enum):
    project = "project"
    user = "user"


@dataclass(frozen=True)
class Client:
    title: str
    project: str        # the config file, relative to the project directory
    user: str           # the config file for every project ("~" is HOME)
    default_scope: str
    toml: bool = False
    extra: tuple = ()   # keys the entry carries besides command, args and env


CLIENTS = {
    "claude-code": Client("Claude Code", ".mcp.json", "~/.claude.json", "project"),
    "gemini": Client("Gemini CLI", ".gemini/settings.json", "~/.gemini/settings.json",
                     "project", extra=(("timeout", 30000),)),
    "codex": Client("Codex", ".codex/config.toml", "$CODEX_HOME/config.toml", "user", toml=True),
}

NAME = re.compile(r"[A-Za-z0-9_-]+")
CHECK_TIMEOUT = 60.0


class CheckFailed(GitdropError):
    """The server did not start, or did not list its tools, as the client starts it."""

    rule = "mcp-check"
    exit_code = 1


def config_path(client: Client, scope: str, project: str) -> str:
    if scope == "project":
        return os.path.join(project, client.project)
    if client.user.startswith("$CODEX_HOME/"):
        home = os.environ.get("CODEX_HOME") or os.path.expanduser("~/.codex")
        return os.path.join(home, client.user.split("/", 1)[1])
    return os.path.expanduser(client.user)


def server_command() -> list[str]:
    """This install's gitdrop: the script next to the running Python (a venv's bin/),
    else that Python with -m gitdrop. Not resolved through symlinks: a venv's python
    is a link out of the venv."""
    script = os.path.join(os.path.dirname(sys.executable), "gitdrop")
    if os.path.isfile(script) and os.access(script, os.X_OK):
        return [os.path.abspath(script)]
    return [os.path.abspath(sys.executable), "-m", "gitdrop"]


def make_entry(client: Client, hub: str, room: str, agent: str, tools: str) -> dict:
    cmd = server_command()
    args = cmd[1:] + ["serve"] + (["--as", agent] if agent else []) + ["--tools", tools]
    entry = {"command": cmd[0], "args": args, "env": {"GITDROP_HUB": hub, "GITDROP_ROOM": room}}
    entry.update(client.extra)
    return entry


# --- config files -------------------------------------------------------------------

def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        return ""
    except (OSError, UnicodeDecodeError) as e:
        raise Refusal("client-config", f"cannot read {path}: {e}",
                      "check the file's permissions and encoding; nothing was written") from None


def _unparsed(path: str, err, snippet: str) -> Refusal:
    return Refusal("client-config", f"{path} does not parse ({err}); it was left as it is",
                   "fix the file (or move it away) and run this again, or add the entry "
                   f"by hand:\n{snippet}")


def json_snippet(name: str, entry: dict) -> str:
    return json.dumps({"mcpServers": {name: entry}}, indent=2, ensure_ascii=False)


def toml_snippet(name: str, entry: dict) -> str:
    from ..fmt import dumps_toml
    plain = {k: v for k, v in entry.items() if not isinstance(v, dict)}
    lines = [f"[mcp_servers.{name}]", dumps_toml(plain).rstrip("\n")]
    for k, v in entry.items():
        if isinstance(v, dict):  # env: an inline table, as templates/codex-config.toml has it
            inner = ", ".join(dumps_toml(v).splitlines())
            lines.append(f"{k} = {{ {inner} }}")
    return "\n".join(lines) + "\n"


def merge_json(path: str, text: str, name: str, entry: dict) -> tuple[str, dict]:
    """The file with the entry set under mcpServers; (new text, old document)."""
    try:
        doc = json.loads(text) if text.strip() else {}
    except ValueError as e:
        raise _unparsed(path, e, json_snippet(name, entry)) from None
    servers = doc.get("mcpServers", {}) if isinstance(doc, dict) else None
    if not isinstance(servers, dict):
        raise _unparsed(path, "not an object with an mcpServers object",
                        json_snippet(name, entry))
    new = dict(doc, mcpServers=dict(servers, **{name: entry}))
    return json.dumps(new, indent=2, ensure_ascii=False) + "\n", doc


def _header(line: str) -> str | None:
    """The dotted name of a TOML table header line ([a.b] or [[a.b]]), or None."""
    m = re.match(r"\s*\[\[?\s*([^\]]*?)\s*\]\]?\s*(#.*)?$", line)
    if not m:
        return None
    return ".".join(p.strip().strip("\"'") for p in m.group(1).split("."))


def merge_toml(path: str, text: str, name: str, entry: dict) -> tuple[str, dict]:
    """The file with [mcp_servers.NAME] (and its sub-tables) replaced by the entry, or
    the entry appended; everything else is kept byte for byte. The result must read
    back as the old document plus the entry, or nothing is written."""
    import tomllib
    snippet = toml_snippet(name, entry)
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise _unparsed(path, e, snippet) from None
    if not isinstance(doc.get("mcp_servers", {}), dict):
        raise _unparsed(path, "mcp_servers is not a table", snippet)
    ours = f"mcp_servers.{name}"
    kept, dropped, skipping = [], [], False
    for line in text.splitlines(keepends=True):
        header = _header(line)
        if header is not None:
            was, skipping = skipping, header == ours or header.startswith(ours + ".")
            if was and not skipping:  # comments just above the next table are that table's
                tail = len(dropped)
                while tail and (not dropped[tail - 1].strip() or
                                dropped[tail - 1].lstrip().startswith("#")):
                    tail -= 1
                kept.extend(dropped[tail:])
            dropped = []
        (dropped if skipping else kept).append(line)
    body = "".join(kept).rstrip()
    new_text = body + "\n\n" + snippet if body else snippet
    want = json.loads(json.dumps(doc, default=str))
    want.setdefault("mcp_servers", {})[name] = entry
    try:
        got = json.loads(json.dumps(tomllib.loads(new_text), default=str))
    except tomllib.TOMLDecodeError:
        got = None
    if got != want:
        raise Refusal("client-config", f"{path} defines [{ours}] in a way this command does not "
                      "edit (an inline table, dotted keys); it was left as it is",
                      f"replace that definition by hand with:\n{snippet}")
    return new_text, doc


def read_entry(client: Client, path: str, name: str) -> dict:
    text = _read(path)
    key = next(k for k, c in CLIENTS.items() if c is client)
    if not text.strip():
        raise NotFound(f"no {client.title} config at {path}",
                       f"write one: gitdrop mcp install --client {key} --as team/name")
    if client.toml:
        import tomllib
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise Refusal("client-config", f"{path} does not parse ({e})", "fix the file") from None
        servers = doc.get("mcp_servers", {})
    else:
        try:
            doc = json.loads(text)
        except ValueError as e:
            raise Refusal("client-config", f"{path} does not parse ({e})", "fix the file") from None
        servers = doc.get("mcpServers", {}) if isinstance(doc, dict) else {}
    entry = servers.get(name) if isinstance(servers, dict) else None
    if not isinstance(entry, dict):
        raise NotFound(f"{path} has no MCP server named {name!r}",
                       f"write it: gitdrop mcp install --client {key} --as team/name (or "
                       "pass --name)")
    return entry


def write_atomic(path: str, text: str) -> None:
    """Replace the file in one step (a reader never sees half of it), keeping its
    mode (~/.claude.json is 0600); a new file gets 0644, as an editor would make it."""
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    try:
        mode = os.stat(path).st_mode & 0o777
    except FileNotFoundError:
        mode = 0o644
    tmp = os.path.join(folder, f".{os.path.basename(path)}.gitdrop-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


# --- the check ------------------------------------------------------------------------

def _leaf(e: BaseException) -> BaseException:
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    return e


def probe(entry: dict, cwd: str, timeout: float = CHECK_TIMEOUT) -> list[str]:
    """Start the server as an MCP client does (the entry's command and args, its env
    over a minimal environment, over stdio), initialize, list the tools; their names.
    CheckFailed says what went wrong, with the end of the server's stderr."""
    import tempfile

    import anyio
    from mcp import Client as McpClient, StdioServerParameters
    from mcp.client.stdio import stdio_client

    if "command" not in entry:
        raise UsageError("the entry has no command (an HTTP server?): only stdio entries are "
                         "checked", "check an HTTP server by connecting a client to its URL")
    params = StdioServerParameters(command=str(entry["command"]),
                                   args=[str(a) for a in entry.get("args", [])],
                                   env={str(k): str(v) for k, v in
                                        (entry.get("env") or {}).items()} or None,
                                   cwd=cwd if os.path.isdir(cwd) else None)

    async def listed(errlog):
        with anyio.fail_after(timeout):
            async with McpClient(stdio_client(params, errlog=errlog), mode="legacy") as c:
                return [t.name for t in (await c.list_tools()).tools]

    with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as errlog:
        try:
            return anyio.run(listed, errlog)
        except Exception as e:
            errlog.seek(0)
            stderr = errlog.read().strip()
            leaf = _leaf(e)
            what = "it did not answer within {:.0f} s".format(timeout) \
                if isinstance(leaf, TimeoutError) else f"{type(leaf).__name__}: {leaf}"
            shown = " ".join([entry["command"], *map(str, entry.get("args", []))])
            reason = f"the server did not start as the client would start it ({what})"
            if stderr:
                reason += "; its stderr ends:\n" + "\n".join(stderr.splitlines()[-12:])
            env = " ".join(f"{k}={v}" for k, v in (entry.get("env") or {}).items())
            by_hand = f"{env + ' ' if env else ''}{shown} </dev/null"
            raise CheckFailed(reason, (f"fix what its stderr says; to run it by hand: {by_hand}"
                                       if stderr else f"run it by hand to see why: {by_hand}")
                              ) from None


def _show(entry: dict) -> str:
    return " ".join([entry["command"], *map(str, entry.get("args", []))])


# --- commands ---------------------------------------------------------------------------

ClientOpt = Annotated[ClientName, typer.Option(
    "--client", help="The MCP client: claude-code, gemini or codex.", show_default=False)]
ScopeOpt = Annotated[Optional[ScopeName], typer.Option(
    "--scope", help="project: the project's config (.mcp.json, .gemini/settings.json, "
    ".codex/config.toml); user: yours for every project (~/.claude.json, "
    "~/.gemini/settings.json, ~/.codex/config.toml). Default: project, codex user.",
    show_default=False)]
ProjectOpt = Annotated[Optional[str], typer.Option(
    "--project", metavar="DIR", help="The project directory (default: the current one).",
    show_default=False)]
NameOpt = Annotated[str, typer.Option(
    "--name", help="The server's name in the config.")]


def _where(client: ClientName, scope: Optional[ScopeName], project: Optional[str]):
    spec = CLIENTS[client.value]
    scope_name = scope.value if scope else spec.default_scope
    folder = os.path.abspath(os.path.expanduser(project or os.getcwd()))
    return spec, scope_name, folder, config_path(spec, scope_name, folder)


@command(mcp_app, "install")
def mcp_install(s: Scope, client: ClientOpt,
                scope: ScopeOpt = None,
                tools: Annotated[Tools, typer.Option(
                    "--tools", help="Which tools the server offers: agent, lead (reviewers "
                    "and leads) or all.")] = Tools.agent,
                name: NameOpt = "gitdrop",
                project: ProjectOpt = None,
                print_: Annotated[bool, typer.Option(
                    "--print", help="Show the entry; write nothing, start nothing.")] = False,
                no_check: Annotated[bool, typer.Option(
                    "--no-check", help="Write without starting the server first.")] = False):
    """Write an MCP client's config for this hub's server, after starting it as the client will.

    The entry runs this install's gitdrop by its absolute path; other servers are kept.

    Nothing is written if the hub or room is missing (4), the file does not parse (3) or
    the server does not start (1)."""
    if not NAME.fullmatch(name):
        raise UsageError(f"--name {name!r}: use letters, digits, - and _", "pass --name gitdrop")
    spec, scope_name, folder, path = _where(client, scope, project)
    from ..transports.remote import is_url
    hub = s.hub_value if is_url(s.hub_value) else s.hub.path  # NotFound: exit 4
    room = s.hub.room(s.room_name)                               # NotFound: exit 4
    agent = s.agent_value
    if agent and "/" not in agent:
        try:
            agent = room.resolve(agent)  # the full name, so the entry means one agent
        except NotFound:
            # A typo got a config for nobody, whose first register then made
            # default/<typo> in a team of its own.
            raise UsageError(f"{agent!r} is not registered in room {s.room_name!r}, and a "
                             "short name does not say its team", "give the full name "
                             "(--as team/name: it registers on its first call), or check "
                             "gitdrop who") from None
    elif agent and room.view().agent(agent) is None:
        from ..rules import non_member, team_member
        teams = s.hub.store.teams()
        if not team_member(teams, room.view().room, agent):   # its register would be refused
            reason, fix = non_member(teams, s.room_name, agent, "install again")
            raise Refusal("room-membership", reason, fix)
        s.note(f"{agent} is not registered in {s.room_name} yet: its first call, register, "
               "adds it")
    entry = make_entry(spec, hub, s.room_name, agent, tools.value)
    text = _read(path)
    merge = merge_toml if spec.toml else merge_json
    new_text, old_doc = merge(path, text, name, entry)
    old_servers = (old_doc.get("mcp_servers") if spec.toml else old_doc.get("mcpServers")) or {}
    others = sorted(k for k in old_servers if k != name)
    snippet = toml_snippet(name, entry) if spec.toml else json_snippet(name, entry)
    doc = {"client": client.value, "scope": scope_name, "path": path, "name": name,
           "entry": entry, "replaced": name in old_servers, "others": others}
    if print_:
        s.note(f"{spec.title}, {scope_name} scope: {path} (--print: nothing written)")
        s.emit(dict(doc, written=False), snippet.rstrip("\n"))
        return
    if not no_check:
        s.note(f"checking: starting the server as {spec.title} will (a few seconds) ...")
        tools_found = probe(entry, folder)
        doc["check"] = {"ok": True, "tools": len(tools_found)}
        s.note(f"checked: {_show(entry)} started as {spec.title} will start it, "
               f"and lists {len(tools_found)} tools ({tools.value} profile)")
    write_atomic(path, new_text)
    doc["written"] = True

    def human():
        kept = f"; kept {len(others)} other server(s): {', '.join(others)}" if others else ""
        verb = "replaced" if doc["replaced"] else "added"
        print(f"{verb} MCP server {name!r} in {path}{kept}")
        who = f"as {agent}" if agent else "unbound (its first call, register, binds it)"
        print(f"  {who}, room {s.room_name} of {hub}, tools: {tools.value}")
        nxt = {"claude-code": f"start Claude Code in {folder}" + (
                   " (it asks you to approve the project's servers)"
                   if scope_name == "project" else ""),
               "gemini": f"start Gemini CLI in {folder}" if scope_name == "project"
               else "start Gemini CLI",
               "codex": "start Codex" + (f" in {folder} (a trusted project)"
                                         if scope_name == "project" else "")}[client.value]
        print(f"next: {nxt}; the agent calls register, then check_inbox")
    s.emit(doc, human)


@command(mcp_app, "check")
def mcp_check(s: Scope, client: ClientOpt, scope: ScopeOpt = None, name: NameOpt = "gitdrop",
              project: ProjectOpt = None):
    """Start the server of an MCP client's config as the client would, and list its tools."""
    spec, scope_name, folder, path = _where(client, scope, project)
    entry = read_entry(spec, path, name)
    s.note(f"checking: starting the server as {spec.title} will (a few seconds) ...")
    found = probe(entry, folder)
    s.emit({"client": client.value, "scope": scope_name, "path": path, "name": name,
            "entry": entry, "check": {"ok": True, "tools": len(found)}, "tools": found},
           f"ok: {_show(entry)} ({path}, {name!r}) starts and lists {len(found)} tools")


@command(app, "http")
def http(s: Scope,
         hub_path: Annotated[Optional[str], typer.Argument(
             metavar="[HUB]", help="The hub to serve (default: --hub / GITDROP_HUB / "
             "~/.gitdrop/hub.git).", show_default=False)] = None,
         host: Annotated[str, typer.Option(
             "--host", help="Address to bind. Any but loopback needs logins (--users or "
             "tokens), and Basic auth sends them in clear: put TLS in front.")]
         = "127.0.0.1",
         port: Annotated[int, typer.Option("--port", min=0, max=65535, help="Port; 0 picks a free one.")] = 8080,
         users: Annotated[Optional[str], typer.Option(
             "--users", metavar="FILE", help="Users file: team/name:sha256:<hex> lines "
             "(re-read when it changes).", show_default=False)] = None,
         add_user: Annotated[Optional[str], typer.Option(
             "--add-user", metavar="AGENT", help="Add AGENT (team/name) to --users with a new "
             "random password, print the password, exit.", show_default=False)] = None,
         no_tokens: Annotated[bool, typer.Option(
             "--no-tokens", help="Do not accept the hub's gitdrop tokens as passwords.")] = False,
         anonymous_read: Annotated[bool, typer.Option(
             "--anonymous-read", help="Let fetches through without a login "
             "(pushes always need one).")] = False,
         quiet: Annotated[bool, typer.Option("--quiet", help="No request log.")] = False):
    """Serve the hub over smart HTTP (git clone/fetch/push) behind HTTP Basic logins."""
    from ..transports import httpd
    if add_user:
        if not users:
            raise UsageError("--add-user needs the users file", "pass --users FILE")
        password = httpd.add_user(users, add_user)
        team, _, name = add_user.partition("/")
        s.note(f"user {add_user}'s password (shown once); its hub URL, once gitdrop http "
               f"--users {users} runs: http://{team}%2F{name}:PASSWORD@HOST:PORT/hub.git")
        s.emit({"agent": add_user, "users": os.path.abspath(users), "password": password},
               password)
        return
    from ..transports.remote import is_url
    given = hub_path or s.hub_value
    if given and is_url(given):
        raise UsageError(f"{given} is a URL: gitdrop http serves a hub on this machine",
                         "pass the hub's path")
    hub = os.path.abspath(os.path.expanduser(hub_path)) if hub_path else s.hub.path
    for warning in httpd.check_bind(host, users or "", not no_tokens, anonymous_read):
        s.note(f"warning: {warning}")
    srv = httpd.serve(hub, host, port, users or "", not no_tokens, anonymous_read, quiet)
    app_ = srv.get_app()
    url = f"http://{httpd.url_host(host)}:{srv.server_port}/{app_.name}"
    logins = [f"the users file {os.path.abspath(users)}"] if users else []
    if not no_tokens:
        logins.append("the hub's gitdrop tokens (gitdrop token team/name)")
    if s.json:
        print(json.dumps({"ok": True, "serving": app_.hub, "url": url, "host": host,
                          "port": srv.server_port}), flush=True)
    else:
        print(f"serving {app_.hub} at {url}", flush=True)
        s.note("logins: " + (" or ".join(logins) or "none")
               + ("; fetches need none (--anonymous-read)" if anonymous_read else ""))
        s.note(f"clone: git clone -b rooms/{s.room_name} http://TEAM%2FNAME:PASSWORD@"
               f"{httpd.url_host(host)}:{srv.server_port}/{app_.name}   (Ctrl-C stops)")
    httpd.run(srv)
