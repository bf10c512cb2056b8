"""`gitdrop web`: the web board (gitdrop/web does the work)."""

from typing import Annotated, Optional

import typer

from .base import Scope, command

app = typer.Typer(add_completion=False)


@command(app, "web")
def web(s: Scope,
        host: Annotated[str, typer.Option(
            "--host", help="Address to bind. Off this machine (not a loopback address) "
            "every page needs a login.")] = "127.0.0.1",
        port: Annotated[int, typer.Option(
            "--port", min=0, max=65535, help="Port to listen on; 0 picks a free one.")] = 8787,
        allow_host: Annotated[Optional[list[str]], typer.Option(
            "--allow-host", metavar="NAME", help="Also answer requests addressed to this name "
            "(repeat): a forwarded port's, e.g. in a dev container. Without a login, the "
            "board answers only to this machine's names.")] = None):
    """The web board of the hub's rooms, live: the board, tasks, agents, the log, charts;
    log in with a hub token (gitdrop token team/name) to answer, approve, reject and
    send as that agent. Runs until Ctrl-C."""
    from ..transports.httpd import LOOPBACK, is_local, listen, url_host
    from ..web.app import make_app, server
    hub = s.hub.path   # opens the hub (or words what is missing) before anything is bound
    need = not is_local(host)
    sock = listen(host, port)   # bound first: the address printed is the one served
    port = sock.getsockname()[1]
    s.note(f"gitdrop: the web board of {hub} at http://{url_host(host)}:{port}/"
           + (" (every page needs a login)" if need else " (log in to act)"))
    from .. import pauses
    pauses.keep_short()   # it serves for hours: see gitdrop.pauses
    try:
        hosts = LOOPBACK + (host,) + tuple(allow_host or ())
        server(make_app(hub, require_login=need, hosts=hosts), host, port
               ).run(sockets=[sock])
    except KeyboardInterrupt:
        pass
