"""The shell face of gitdrop: `gitdrop <command>`.

Each command maps its arguments to one core call (gitdrop/core.py, gitdrop/hub.py)
and its result back to a line, a table or one JSON document. Commands live in
the modules of this package, loaded only when named, so `gitdrop inbox` does not
pay for the rest (start-up is most of a short command's cost).
"""

import importlib
import os
import sys
from typing import Annotated, Optional

import typer

from .base import TOP_COMMANDS, AsOpt, HubOpt, JsonOpt, PlainGroup, RoomOpt, Scope, error_doc
from ..errors import UsageError

# command -> (module, group?, help panel); the order is the order of --help.
COMMANDS = {
    "init": ("agents", False, "Start"),
    "register": ("agents", False, "Agents and messages"),
    "deregister": ("agents", False, "Agents and messages"),
    "who": ("agents", False, "Agents and messages"),
    "status": ("agents", False, "Agents and messages"),
    "ping": ("agents", False, "Agents and messages"),
    "send": ("agents", False, "Agents and messages"),
    "sent": ("agents", False, "Agents and messages"),
    "inbox": ("agents", False, "Agents and messages"),
    "history": ("agents", False, "Agents and messages"),
    "log": ("agents", False, "Agents and messages"),
    "task": ("task", True, "Work"),
    "ready": ("task", False, "Work"),
    "work": ("work", False, "Work"),
    "feedback": ("work", True, "Work"),
    "autorespond": ("autorespond", False, "Work"),
    "handshake": ("plan", True, "Work"),
    "contract": ("plan", True, "Work"),
    "context": ("plan", True, "Work"),
    "lease": ("lease", True, "Work"),
    "guard": ("lease", True, "Work"),
    "team": ("hub", True, "Hub"),
    "room": ("hub", True, "Hub"),
    "reap": ("hub", False, "Hub"),
    "verify": ("hub", False, "Hub"),
    "repair": ("repair", False, "Hub"),
    "sync": ("sync", False, "Hub"),
    "watch": ("tools", False, "Live"),
    "wait": ("tools", False, "Live"),
    "serve": ("tools", False, "Live"),
    "token": ("tools", False, "Live"),
    "http": ("setup", False, "Live"),
    "board": ("board", False, "Live"),
    "web": ("web", False, "Live"),
    "demo": ("tools", False, "Start"),
    "mcp": ("setup", True, "Start"),
}
TOP_COMMANDS[:] = COMMANDS   # the commands a refusal's next step may name (Scope.here)


class LazyGroup(PlainGroup):
    """Builds a command only when it is named (or listed, for help and completion)."""

    def list_commands(self, ctx):
        return list(COMMANDS)

    def get_command(self, ctx, name):
        if name not in self.commands and name in COMMANDS:
            module, group, panel = COMMANDS[name]
            mod = importlib.import_module(f"gitdrop.cli.{module}")
            if group:  # `task_app` etc.: the group is the command
                built = typer.main.get_command(getattr(mod, f"{name}_app"))
            else:  # build just this one of the module's commands
                info = next(c for c in mod.app.registered_commands if c.name == name)
                built = typer.main.get_command_from_info(
                    info, pretty_exceptions_short=mod.app.pretty_exceptions_short,
                    rich_markup_mode=mod.app.rich_markup_mode)
            built.name, built.rich_help_panel = name, panel
            self.commands[name] = built
        return self.commands.get(name)

    def suggest(self, ctx, word: str) -> list[str]:
        if word.lstrip("-") in ("version", "help"):   # options, not commands
            return [f"--{word.lstrip('-')}"]
        return super().suggest(ctx, word)


app = typer.Typer(
    cls=LazyGroup, no_args_is_help=True,
    help="gitdrop: git-native coordination for teams of AI agents. A bare git repository "
         "(the hub) is the server; every act is a commit on a room's branch.\n\n"
         "Exit codes: 0 ok, 1 unexpected error, 2 usage, 3 refused by a rule, 4 not found, "
         "5 ambiguous name, 6 conflict (the room kept moving), 7 a remote hub unreachable, "
         "8 damaged (gitdrop repair), 9 storage (disk full, read-only), 124 wait timed out, "
         "129/143 stopped by SIGHUP/SIGTERM, 130 interrupted.",
    epilog="Docs: README.md and docs/ (CLI.md, PROTOCOL.md).")


def _version(value: bool) -> None:
    if value:
        from .. import __version__
        print(f"gitdrop {__version__}")
        raise typer.Exit(0)


@app.callback()
def top(ctx: typer.Context,
        hub: HubOpt = None, room: RoomOpt = None, as_: AsOpt = None, json_: JsonOpt = False,
        version: Annotated[Optional[bool], typer.Option(
            "--version", help="Print the version and exit.", is_eager=True,
            callback=_version)] = None):
    ctx.obj = Scope(hub, room, as_, json_)


def _usage_json(err) -> None:
    """A usage error under --json still prints one JSON document."""
    import json
    reason = err.format_message() if hasattr(err, "format_message") else str(err)
    print(json.dumps(error_doc(UsageError(reason, "see gitdrop --help"))))


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    from ..files import never_world_writable
    never_world_writable()
    command = typer.main.get_command(app)
    try:
        rv = command.main(argv, prog_name="gitdrop", standalone_mode=False)
    except typer.Abort:
        print("Aborted.", file=sys.stderr)
        sys.exit(1)
    except BrokenPipeError:  # `gitdrop log | head`: the reader left; so do we
        sys.stdout = open(os.devnull, "w")
        sys.exit(1)
    except Exception as e:  # click's usage errors: they know how to show themselves
        if not (hasattr(e, "show") and hasattr(e, "exit_code")):
            raise
        if "--json" in argv:
            _usage_json(e)
        e.show()
        sys.exit(e.exit_code)
    sys.exit(rv if isinstance(rv, int) else 0)


if __name__ == "__main__":
    main()
