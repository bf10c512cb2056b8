"""Long-running and helper commands: watch, wait, serve (MCP), token, demo.

Their bodies live elsewhere (notifier, mcp.server, tokens, demo) and are imported
only when the command runs: `import mcp` alone costs most of a second.
"""

import enum
import sys
from typing import Annotated, Optional

import typer

from .base import Scope, command

app = typer.Typer(add_completion=False)


class Transport(str, enum.Enum):
    stdio = "stdio"
    http = "http"


class Registration(str, enum.Enum):
    open = "open"
    closed = "closed"


class Tools(str, enum.Enum):
    agent = "agent"
    lead = "lead"
    all = "all"


@command(app, "watch")
def watch(s: Scope):
    """Print what arrives for you, as it arrives (until Ctrl-C)."""
    from ..notifier import run_watch
    raise typer.Exit(run_watch(s.hub_value, s.room_name, s.agent, s.json))


@command(app, "wait")
def wait(s: Scope, timeout: Annotated[Optional[float], typer.Option(
        "--timeout", metavar="SECONDS", min=0,
        help="Give up after this many seconds (exit 124). Default: no limit.",
        show_default=False)] = None):
    """Block until something waits for you (at once if it already does) or a task you
    could take becomes ready, print it, exit."""
    from ..notifier import run_wait
    raise typer.Exit(run_wait(s.hub_value, s.room_name, s.agent, timeout, s.json))


@command(app, "serve")
def serve(s: Scope,
          transport: Annotated[Transport, typer.Option(
              "--transport", help="stdio or http.")] = Transport.stdio,
          host: Annotated[str, typer.Option("--host", help="Address for http.")] = "127.0.0.1",
          port: Annotated[int, typer.Option("--port", min=0, max=65535, help="Port for http.")] = 9400,
          tools: Annotated[Tools, typer.Option(
              "--tools", help="Which MCP tools to offer: agent, lead or all.")] = Tools.agent,
          registration: Annotated[Optional[Registration], typer.Option(
              "--registration", help="http: whether a new agent may register without a "
              "token (and get one). Default: open on this machine, closed when --host "
              "is reachable from others (then mint tokens: gitdrop token).",
              show_default=False)] = None):
    """Run the MCP server (stdio for one agent; http with per-agent bearer tokens)."""
    from ..mcp.server import serve as run
    # a git URL goes through as it is: the server writes through the remote hub
    from ..transports.remote import is_url
    hub = s.hub_value if is_url(s.hub_value) else s.hub.path
    if transport is Transport.stdio and sys.stdin.isatty():   # a person, not a client
        s.note(f"gitdrop: the MCP server for {s.agent_value or 'an agent that registers'} in "
               f"{s.room_name}, on stdin/stdout: an MCP client starts it and talks JSON-RPC "
               "here (gitdrop mcp install writes a client's config); Ctrl-C stops it")
    try:
        run(hub, s.room_name, s.agent_value, transport.value, host, port, tools.value,
            registration.value if registration else None)
    except KeyboardInterrupt:   # Ctrl-C, or the client's SIGTERM: how a server stops
        s.note("gitdrop: the MCP server stopped")


@command(app, "token")
def token(s: Scope, agent: Annotated[str, typer.Argument(help="The agent (team/name).")]):
    """Mint a bearer token that binds an MCP HTTP client to one agent."""
    from ..tokens import mint
    tok = mint(s.hub.path, agent)
    s.note(f"{agent}'s token (shown once; a new one replaces it): its MCP client sends "
           "Authorization: Bearer TOKEN to gitdrop serve --transport http, and it logs in to "
           "gitdrop web with it")
    s.emit({"agent": agent, "token": tok}, tok)


@command(app, "demo")
def demo(s: Scope, keep: Annotated[bool, typer.Option(
        "--keep", help="Keep the throwaway hub and print where it is.")] = False):
    """Play two teams through the protocol on a throwaway hub, narrating each step.

    With --hub PATH (a new or empty directory) the demo hub is built there and kept."""
    from .base import progress
    from .demo import STEPS, run, where
    if s.hub_option:
        where(s.hub_option)   # refused before anything runs
    with progress("demo", STEPS, quiet=s.json, unit="steps") as step:
        r = run(keep=keep, narrate=not s.json, out=step.echo, hub=s.hub_option,
                progress=step)
    failed = [st for st in r["steps"] if not st["ok"]]
    s.emit({"steps": r["steps"], "failed": len(failed), "hub": r["hub"] if r["kept"] else "",
            "kept": r["kept"]})
    if failed:
        raise typer.Exit(1)
