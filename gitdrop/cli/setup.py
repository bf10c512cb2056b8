"""Setting up: the hub served over smart HTTP (`gitdrop http`)."""

import json
import os
from typing import Annotated, Optional

import typer

from .base import Scope, command
from ..errors import UsageError

app = typer.Typer(add_completion=False)


@command(app, "http")
def http(s: Scope,
         hub_path: Annotated[Optional[str], typer.Argument(
             metavar="[HUB]", help="The hub to serve (default: --hub / GITDROP_HUB / "
             "~/.gitdrop/hub.git).", show_default=False)] = None,
         host: Annotated[str, typer.Option(
             "--host", help="Address to bind. Any but loopback needs logins (--users or "
             "tokens), and Basic auth sends them in clear: put TLS in front.")]
         = "127.0.0.1",
         port: Annotated[int, typer.Option("--port", help="Port; 0 picks a free one.")] = 8080,
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
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        srv.server_close()
