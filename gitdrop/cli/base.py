"""What every CLI command shares: who, where and which hub (options and the
environment), one way to print a result (a line or a table for people, one JSON
document with --json), and one way to report a refusal.

Nothing heavy is imported here: pygit2 comes with the hub, rich only with a table.
"""

import contextlib
import functools
import inspect
import os
import signal
import sys
import threading
from typing import Annotated, Optional

import typer
from typer.core import TyperCommand, TyperGroup

from .. import fmt
from ..errors import GitdropError, Refusal, UsageError, storage

PANEL = "Who, where and how"
ENV_HINT = "--as team/name (or export GITDROP_AGENT=team/name)"

# The same options exist on the top level (where they read the environment) and on
# every command (so `gitdrop inbox --as juno --json` works); a command's own wins.
HubOpt = Annotated[Optional[str], typer.Option(
    "--hub", metavar="PATH|URL",
    help="Hub: a path or a git URL (env GITDROP_HUB; default ~/.gitdrop/hub.git).",
    rich_help_panel=PANEL, show_default=False)]
RoomOpt = Annotated[Optional[str], typer.Option(
    "--room", metavar="ROOM", help="Room (env GITDROP_ROOM; default lobby).",
    rich_help_panel=PANEL, show_default=False)]
AsOpt = Annotated[Optional[str], typer.Option(
    "--as", metavar="AGENT", help="Who you are: team/name, or a short name (env GITDROP_AGENT).",
    rich_help_panel=PANEL, show_default=False)]
JsonOpt = Annotated[bool, typer.Option(
    "--json", help="Print exactly one JSON document on stdout.", rich_help_panel=PANEL)]
COMMON = {"hub": HubOpt, "room": RoomOpt, "as_": AsOpt, "json_": JsonOpt}


class _Plain:
    """Converts a str, int, float or bool option (or a list of them) without pydantic,
    within the option's min and max.

    Recent Typer converts every value through a pydantic TypeAdapter; importing
    pydantic costs as much as the rest of a short command. Our options are plain
    types, so they get plain conversions; anything else keeps Typer's.
    """

    KINDS = {str: "a string", int: "an integer", float: "a number", bool: "a boolean"}

    def __init__(self, kind, multi: bool):
        self.kind, self.multi = kind, multi

    def one(self, v, param, ctx):
        if not isinstance(v, self.kind) or (self.kind is int and isinstance(v, bool)):
            try:
                if self.kind is bool:
                    return {"1": True, "true": True, "yes": True, "0": False, "false": False,
                            "no": False}[str(v).strip().lower()]
                v = self.kind(v)
            except (KeyError, ValueError, TypeError):
                raise typer.BadParameter(f"{v!r} is not {self.KINDS[self.kind]}.", ctx=ctx,
                                         param=param) from None
        low, high = getattr(param, "min", None), getattr(param, "max", None)
        if self.kind in (int, float) and (low is not None and v < low or
                                          high is not None and v > high):
            within = f"{low} to {high}" if low is not None and high is not None else \
                f"at least {low}" if low is not None else f"at most {high}"
            raise typer.BadParameter(f"{v} is out of range: give {within}.", ctx=ctx,
                                     param=param)
        return v

    def coerce(self, value, param, ctx):
        if value is None:
            return [] if self.multi else None
        if self.multi:
            return [self.one(v, param, ctx) for v in value]
        return self.one(value, param, ctx)


# What --help shows for a value of each plain type (Typer's own would be `<str>`).
METAVARS = {str: "TEXT", int: "N", float: "NUMBER"}


def _shown(p) -> None:
    """Help in the usual words: `--limit N`, `--assign TEXT`, a flag with nothing after
    it, an argument by its name in capitals (`TITLE`, `[PATH]`, `TO...`), instead of
    Typer's `<int>`, `<bool>` and `{title}`."""
    desc, is_arg = p.type_descriptor, p.param_type_name == "argument"
    ann = desc.annotation
    if getattr(ann, "__origin__", None) is list and len(getattr(ann, "__args__", ())) == 1:
        ann = ann.__args__[0]
    if is_arg:
        explicit = p.metavar is not None
        if not explicit:
            p.metavar = p.name.upper() + ("..." if p.nargs != 1 else "")
        usage = p.metavar if p.required or (explicit and p.metavar.startswith("[")) \
            else f"[{p.metavar}]"
        p._usage_display_name = lambda: usage
        p.display_type_rich = lambda ctx=None: None   # the name says it
        return
    if getattr(p, "is_flag", False) or ann is bool:
        shown = None
    elif p.metavar is not None:
        shown = p.metavar
    elif desc.is_choice:
        shown = "[" + p.display_type(None).strip("<>") + "]"
    else:
        shown = METAVARS.get(ann) or p.display_type(None).strip("<>").upper()
    p.display_type_rich = lambda ctx=None: shown


def _plain(params):
    for p in params:
        desc = getattr(p, "type_descriptor", None)
        if desc is None or not hasattr(p, "get_runtime_param") or "get_runtime_param" in vars(p):
            continue  # not Typer's parameter machinery, or done already
        if hasattr(p, "display_type"):
            _shown(p)
        ann, multi = desc.annotation, False
        if getattr(ann, "__origin__", None) is list and len(getattr(ann, "__args__", ())) == 1:
            ann, multi = ann.__args__[0], True
        if ann in _Plain.KINDS and getattr(desc, "file_annotation", None) is None:
            plain = _Plain(ann, multi)
            p.get_runtime_param = lambda plain=plain: plain
    return params


def _help_colour() -> None:
    """Typer's rich help keeps bold and dim under NO_COLOR (rich drops colours only):
    without colour, it gets no styles at all."""
    if not colour_on(sys.stdout):
        from typer import rich_utils
        rich_utils.COLOR_SYSTEM = None


class PlainCommand(TyperCommand):
    def get_params(self, ctx):
        return _plain(super().get_params(ctx))

    def format_help(self, ctx, formatter):
        _help_colour()
        return super().format_help(ctx, formatter)


class PlainGroup(TyperGroup):
    def get_params(self, ctx):
        return _plain(super().get_params(ctx))

    def resolve_command(self, ctx, args):
        """An unknown command is answered with the closest one or two (click's own
        list offered `reap` and `retry` for `task creat`; a lazy group's knows only
        the commands built so far)."""
        try:
            return super().resolve_command(ctx, args)
        except Exception as e:  # click's usage error (Typer carries its own click)
            msg = getattr(e, "message", None)
            if args and isinstance(msg, str) and msg.startswith("No such command"):
                close = self.suggest(ctx, args[0])
                e.message = msg.split(" Did you mean")[0].rstrip(".") + (
                    ". Did you mean " + " or ".join(repr(c) for c in close) + "?" if close
                    else ".")
            raise

    def suggest(self, ctx, word: str) -> list[str]:
        """The commands nearest `word`: the best match, and any nearly as near."""
        import difflib
        names = self.list_commands(ctx)
        began = [n for n in names if word and n.startswith(word)]
        if began:   # `task st`: start, not list
            return began[:3]
        score = {n: difflib.SequenceMatcher(None, word, n).ratio() for n in names}
        close = difflib.get_close_matches(word, names, n=3, cutoff=0.6)
        return [n for n in close if score[n] >= score[close[0]] - 0.1] if close else []

    def format_help(self, ctx, formatter):
        _help_colour()
        # Typer's rich help lists a command by its help's first paragraph with its
        # line breaks kept: a docstring wrapped at 90 columns broke mid-sentence.
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is not None and not cmd.short_help and cmd.help:
                first = " ".join(inspect.cleandoc(cmd.help).split("\n\n")[0].split())
                # its first sentence: a paragraph (sync's ran 14 lines) buried the list
                cmd.short_help = first.split(". ")[0].rstrip(".") + "."
        return super().format_help(ctx, formatter)




class Scope:
    """One invocation: the hub, room and agent it acts on, and how it prints."""

    def __init__(self, hub=None, room=None, agent=None, as_json=False):
        self.hub_value = hub or os.environ.get("GITDROP_HUB") or ""
        self.hub_option = hub or ""   # --hub as given, without the environment's
        self.room_name = room or os.environ.get("GITDROP_ROOM") or "lobby"
        self.agent_value = agent or os.environ.get("GITDROP_AGENT") or ""
        self.agent_option = agent or ""   # --as as given
        self.json = as_json
        # An idempotency key for this invocation's write: a retried command with the
        # same key is applied once (see Gitdrop-Id in docs/PROTOCOL.md).
        self.key = os.environ.get("GITDROP_KEY", "")
        self._hub = None

    def again(self, args: str, room: str = "") -> str:
        """A gitdrop command line to run next, with the --hub and --as this one was
        given (pasted without them, a hint acted as the environment's agent, or on
        the default hub); `room` when it is not where the environment points."""
        import shlex
        parts = ["gitdrop"]
        if self.hub_option:   # never its password: said on stderr, and in --json
            hub = self.hub_option
            if "://" in hub:
                from ..transports.remote import public_url
                hub = public_url(hub)
            parts += ["--hub", shlex.quote(hub)]
        if room and room != (os.environ.get("GITDROP_ROOM") or "lobby"):
            parts += ["--room", shlex.quote(room)]
        if self.agent_option:
            parts += ["--as", shlex.quote(self.agent_option)]
        return " ".join(parts + [args])

    def here(self, text: str) -> str:
        """`text` with each gitdrop command in it given this one's --hub, --room and
        --as where the step is the caller's own: the core says "gitdrop inbox", which,
        pasted, read another agent's inbox, or the lobby's. A step for someone else
        ("ask juno to sign it (gitdrop task sign 4)") is left as it is: who runs it
        where is theirs to know."""
        mine = self.again("", self.room_name)[len("gitdrop "):]
        if not mine:
            return text
        import re
        # init makes a hub where it is told: no hub, room or agent of this one's
        names = "|".join(sorted(set(TOP_COMMANDS) - {"init"}, key=len, reverse=True))
        if not names:
            return text

        def flags(m):
            clause = re.split(r";|\.\s|, then", text[:m.start()])[-1]
            rest = re.split(r"[)`;]", text[m.end():])[0]
            other = re.search(r"\b(ask|runs|a lead|the hub's (owner|operator))\b", clause) \
                or "--as" in rest
            return "gitdrop " + ("" if other else mine)
        return re.sub(rf"\bgitdrop (?=(?:{names})\b)", flags, text)

    # --- where ------------------------------------------------------------------
    @property
    def hub(self):
        if self._hub is None:
            from ..opener import open_hub
            self._hub = open_hub(self.hub_value)
        return self._hub

    @property
    def room(self):
        """The room, on a store that needs no pygit2 when the hub is on this machine
        (pygit2's import costs more than a short command); the hub's own operations
        and remote hubs go through `hub`."""
        if self._hub is None:
            from ..core import Room, default_hub
            from ..leanstore import LeanStore, is_hub
            path = os.path.abspath(os.path.expanduser(self.hub_value or default_hub()))
            if is_hub(path):
                store = LeanStore(path)
                if store.tip(store.room_ref(self.room_name)):
                    from ..layout import upgrade
                    upgrade(store, [self.room_name])   # a room of an older layout moves now
                    return Room(store, self.room_name)
        return self.hub.room(self.room_name)  # creates the built-in hub, words what is missing

    @property
    def agent(self) -> str:
        if not self.agent_value:
            raise UsageError("this command acts as an agent, and none was given",
                             f"say who you are: {ENV_HINT}")
        return self.agent_value

    # --- printing ---------------------------------------------------------------
    def emit(self, data: dict, human=None) -> None:
        """The result: one JSON document, or what a person reads (a str or a callable).
        A write a remote hub could not take yet says so (queued: true, and a line)."""
        answer = getattr(getattr(self._hub, "store", None), "queued_answer", None)
        queued = answer(shell=True) if answer else {}
        data = dict(data, **queued)
        if self.json:
            print(fmt.json_line(dict({"ok": True}, **data), default=str))
        elif callable(human):
            human()
        elif human is not None:
            print(human)
        if queued and not self.json:
            print(paint(queued["note"], "yellow"))

    def note(self, text: str) -> None:
        """A line for people only, on stderr (stdout stays for the result)."""
        if not self.json:
            print(text, file=sys.stderr)

    def fail(self, err: GitdropError) -> "typer.Exit":
        if err.fix:
            err.fix = self.here(err.fix)
        if self.json:
            print(fmt.json_line(error_doc(err)))
        print(paint(render(err), "red", sys.stderr), file=sys.stderr)
        return typer.Exit(err.exit_code)


TOP_COMMANDS: list[str] = []   # gitdrop's commands (cli.main lists them here)


def error_doc(err: GitdropError) -> dict:
    return dict({"ok": False, "exit_code": err.exit_code}, **err.to_dict())


def render(err: GitdropError) -> str:
    """A refusal names its rule and commit; other errors say what kind they are."""
    if isinstance(err, Refusal):
        return err.render()
    lines = [f"gitdrop: {err.rule}", f"  why: {err.reason}"]
    if err.fix:
        lines.append(f"  fix: {err.fix}")
    return "\n".join(lines)


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where the command is, as Ctrl-C raises
    KeyboardInterrupt: what holds a lock or a half-made file lets go on the way out."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


_RESET: set = set()   # the signals _on_stop gave back to the system
_AGAIN = {"signal": 0, "busy": False, "timer": None}   # a stop to deliver again (_unraisable)


def _dropped_in(frame) -> bool:
    """Whether what is raised in `frame` is dropped by Python, which goes on as if
    nothing had been raised ("Exception ignored in"): a collector's callback, a
    finalizer, an import lock's weakref callback, or _unraisable itself."""
    if _AGAIN["busy"]:
        return True
    import gc
    callbacks = {getattr(cb, "__code__", None) for cb in gc.callbacks}
    while frame is not None:
        code = frame.f_code
        if code in callbacks or code.co_name == "__del__" or \
                (code.co_name == "cb" and "importlib" in code.co_filename):
            return True
        frame = frame.f_back
    return False


def _on_stop(signum, frame):
    if _dropped_in(frame):   # raised there, the stop would be lost: again, once out
        return _deliver_again(signum)
    _not_again()   # this one stops it: one sent again later would cut its clean-up short
    for s in STOP_SIGNALS + (signal.SIGINT,):   # a second signal ends the process at once
        if signal.getsignal(s) is _on_stop:
            signal.signal(s, signal.SIG_DFL)
            _RESET.add(s)
    # git commands run in sessions of their own (a kill of this one misses them),
    # and other threads' too: the exception raised here reaches this thread only
    remote = sys.modules.get("gitdrop.transports.remote")
    if remote is not None:
        remote.end_git_commands()
    raise Stopped(signum)


def _deliver_again(signum: int) -> None:
    """The stop again in a moment, from a thread (once; the handler back in place)."""
    for s in _RESET:
        signal.signal(s, _on_stop)
    _RESET.clear()
    if not _AGAIN["signal"]:
        _AGAIN["signal"] = signum

        def send():
            sig, _AGAIN["signal"] = _AGAIN["signal"], 0
            if sig:
                os.kill(os.getpid(), sig)
        _AGAIN["timer"] = threading.Timer(0.05, send)
        _AGAIN["timer"].daemon = True
        _AGAIN["timer"].start()


def _not_again() -> None:
    timer, _AGAIN["timer"], _AGAIN["signal"] = _AGAIN["timer"], None, 0
    if timer is not None:
        timer.cancel()


def _unraisable(hook):
    """sys.unraisablehook while a command runs. Stopped raised where Python drops what
    is raised and goes on (a collector's callback, a weakref's, a finalizer: "Exception
    ignored in") is delivered again, once out of there: a server stopped just as it
    started (a full collection runs then) ignored its Ctrl-C and served on for good."""
    def unraisable(u):
        if not isinstance(u.exc_value, Stopped):
            return hook(u)
        _AGAIN["busy"] = True
        try:
            _deliver_again(u.exc_value.signum)
        finally:
            _AGAIN["busy"] = False
    return unraisable


@contextlib.contextmanager
def stop_signals():
    """While a command runs, SIGTERM and SIGHUP raise Stopped (only the main thread
    can catch a signal; a command with handlers of its own, a worker, sets them).
    So does Ctrl-C (SIGINT), unless it is ignored (a background job): it reached the
    git commands, each in a session of its own, no more than a kill does, and it
    ended the command in a traceback."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    mine = STOP_SIGNALS
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        mine += (signal.SIGINT,)
    old = {s: signal.signal(s, _on_stop) for s in mine}
    hook, sys.unraisablehook = sys.unraisablehook, _unraisable(sys.unraisablehook)
    try:
        yield
    finally:
        _not_again()   # the command is over: a stop sent now would kill the process
        sys.unraisablehook = hook
        for s, handler in old.items():
            signal.signal(s, handler)


def stopped(e: Stopped) -> GitdropError:
    """What a command stopped by a signal reports: exit 128 + the signal, as a shell
    shows a process it ended."""
    name = signal.Signals(e.signum).name
    err = GitdropError(f"gitdrop was stopped by {name} before it finished; the git "
                       "commands it ran against the hub were ended with it",
                       "run the command again; writes waiting in this machine's offline "
                       "queue are still there (gitdrop status lists them), and a write cut "
                       "off while it was being sent may or may not be on the hub: read it "
                       "back before you make it again")
    err.rule, err.exit_code = "stopped", 128 + e.signum
    return err


def merged(ctx, **given) -> Scope:
    """The command's own options over the top level's (which read the environment)."""
    top = ctx.find_root().obj if ctx is not None else None
    top = top if isinstance(top, Scope) else Scope()
    s = Scope(given.get("hub") or top.hub_value, given.get("room") or top.room_name,
              given.get("as_") or top.agent_value, bool(given.get("json_")) or top.json)
    s.hub_option = given.get("hub") or top.hub_option
    s.agent_option = given.get("as_") or top.agent_option
    return s


def command(app: typer.Typer, name: str | None = None, **kw):
    """Register `fn(scope, ...)` as a command that also takes the common options.

    The wrapper turns a GitdropError into its report and exit code, so no command
    handles errors itself.
    """
    def deco(fn):
        sig = inspect.signature(fn)
        own = list(sig.parameters.values())[1:]  # drop the scope
        extra = [inspect.Parameter("_ctx", inspect.Parameter.KEYWORD_ONLY,
                                   annotation=typer.Context)]
        extra += [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, annotation=a,
                                    default=False if k == "json_" else None)
                  for k, a in COMMON.items()]

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            ctx = kwargs.pop("_ctx", None)
            scope = merged(ctx, **{k: kwargs.pop(k, None) for k in COMMON})
            try:
                with stop_signals():
                    return fn(scope, *args, **kwargs)
            except Stopped as e:
                raise scope.fail(stopped(e)) from None
            except GitdropError as e:
                raise scope.fail(e) from None
            except OSError as e:   # a full or read-only disk outside the write loop
                err = storage(e)
                if err is None:
                    raise
                raise scope.fail(err) from None

        wrapper.__signature__ = sig.replace(parameters=own + extra)
        wrapper.__annotations__ = {p.name: p.annotation for p in own + extra}
        if fn.__doc__ and "help" not in kw:
            # each paragraph on one line: the help page kept the docstring's line
            # breaks, and a sentence broke where the source wrapped it
            kw["help"] = "\n\n".join(
                p if any(ln.startswith("gitdrop ") for ln in p.splitlines()) else
                " ".join(p.split()) for p in inspect.cleandoc(fn.__doc__).split("\n\n"))
        app.command(name, cls=PlainCommand, **kw)(wrapper)
        return fn
    return deco


def sub_app(name: str, help: str) -> typer.Typer:
    return typer.Typer(name=name, help=help, no_args_is_help=True, add_completion=False,
                       cls=PlainGroup)


# --- text for people --------------------------------------------------------------

COLOURS = {"red": 31, "green": 32, "yellow": 33, "blue": 34, "magenta": 35, "cyan": 36,
           "dim": 2, "bold": 1}


def colour_on(stream=None) -> bool:
    """Colour only on a terminal; NO_COLOR (any value) turns it off, FORCE_COLOR on."""
    stream = stream or sys.stdout
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    return stream.isatty() and os.environ.get("TERM") != "dumb"


def console(stream=None, **kw):
    """A rich Console on `stream` (stdout) that follows colour_on: under NO_COLOR (or
    off a terminal) it writes no styles at all, not even bold; FORCE_COLOR forces them."""
    from rich.console import Console
    stream = stream or sys.stdout
    if not colour_on(stream):
        kw.setdefault("color_system", None)
    elif not stream.isatty():
        kw.setdefault("force_terminal", True)
    return Console(file=stream, **kw)


def paint(text: str, colour: str, stream=None) -> str:
    if not colour_on(stream):
        return text
    return f"\033[{COLOURS[colour]}m{text}\033[0m"


def progress_on(quiet: bool = False) -> bool:
    """A progress bar only for a person watching: not with --json, and only when both
    stdout and stderr are terminals (a pipe or a file means a script, or a log)."""
    if quiet or os.environ.get("TERM") == "dumb":
        return False
    try:
        return sys.stdout.isatty() and sys.stderr.isatty()
    except (AttributeError, ValueError):   # no stream, or a closed one
        return False


class Bar:
    """What progress() yields. Call it as step(done, total=None, what=None) as work
    goes; echo(text) prints a line on stdout above the bar (or just prints it)."""

    def __init__(self, bar=None):
        self.bar, self.last = bar, 0.0

    def __call__(self, done: int, total: int | None = None, what: str | None = None) -> None:
        if self.bar is None:
            return
        import time
        task = self.bar.tasks[0]
        self.bar.update(task.id, completed=done, **{k: v for k, v in (
            ("total", total), ("description", what)) if v is not None})
        now = time.monotonic()
        if now - self.last >= 0.1 or done == task.total:   # at most 10 frames a second
            self.last = now
            self.bar.refresh()

    def echo(self, text: str = "") -> None:
        if self.bar is None:
            print(text)
            return
        sys.stderr.write("\r\033[2K")   # the bar's line goes, the text takes it, the bar
        sys.stderr.flush()              # comes back below: stdout stays stdout
        print(text, flush=True)
        self.bar.refresh()


@contextlib.contextmanager
def progress(what: str, total: int | None = None, quiet: bool = False, unit: str = "",
             after: float = 0.0):
    """A one-line progress bar on stderr (rich, imported only when drawn) for work that
    can take more than a second; yields a Bar. Quiet (the Bar draws nothing) when
    progress_on says so; the bar is gone when the work is.

    With `after`, for work that cannot count its steps (no total, no unit): the bar
    comes only if the work still runs after that many seconds, and rich's thread
    animates it (then do not echo)."""
    if not progress_on(quiet):
        yield Bar()
        return
    import threading
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn)
    counts = [MofNCompleteColumn(), TextColumn(unit)] if total is not None or unit else []
    # Without `after`, redrawn only by Bar (no refresh thread, no redirection of stdout
    # into the console on stderr), so a line printed by echo never lands inside it.
    bar = Progress(TextColumn("{task.description}"), BarColumn(), *counts,
                   TimeElapsedColumn(), console=console(sys.stderr), transient=True,
                   auto_refresh=after > 0, redirect_stdout=False, redirect_stderr=False)
    bar.add_task(what, total=total)
    if not after:
        with bar:
            yield Bar(bar)
        return
    lock, state = threading.Lock(), {"done": False, "shown": False}

    def show():
        with lock:
            if not state["done"]:
                bar.start()
                state["shown"] = True
    timer = threading.Timer(after, show)
    timer.daemon = True
    timer.start()
    try:
        yield Bar(bar)
    finally:
        with lock:
            state["done"] = True
            timer.cancel()
            if state["shown"]:
                bar.stop()


def ago(ts: int, now: int | None = None) -> str:
    import time
    if not ts:
        return "never"
    d = int((now or time.time()) - ts)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if d >= size:
            return f"{d // size}{unit} ago"
    return f"{max(d, 0)}s ago"


def short_id(oid: str) -> str:
    return (oid or "")[:10]


def table(columns, rows, title: str = "") -> None:
    """A table for people (rich, imported only here). Cells are short: no bodies.
    A cell is text, or (text, colour); text is never read as markup."""
    from rich.table import Table
    from rich.text import Text
    t = Table(title=title or None, box=None, header_style="bold", pad_edge=False)
    cells = [[Text(fmt.shown(str(c[0])), style=c[1]) if isinstance(c, tuple)
              else Text(fmt.shown(str(c))) for c in row] for row in rows]
    for i, col in enumerate(columns):
        widest = max([len(col)] + [r[i].cell_len for r in cells if i < len(r)])
        if i == 0 or col in NEVER_CUT or widest <= SHORT:
            # what a row is about is never cut ("core/spar…" twice read as one agent),
            # nor a short column: the long ones (a status, a list) give way
            t.add_column(col, no_wrap=True, min_width=widest)
        else:
            t.add_column(col, overflow="fold" if col in ("title", "subject", "text")
                         else "ellipsis")
    for row in cells:
        t.add_row(*row)
    console(highlight=False, soft_wrap=False).print(t)


NEVER_CUT = ("agent", "assignee", "holder", "id", "room", "from")
SHORT = 9   # a column no wider than this (a health, an age, an id) is shown whole


def read_text(text: str | None, path: str | None, what: str) -> str:
    """TEXT, or the file F ('-' for stdin)."""
    if text is not None and path is not None:
        raise UsageError(f"give the {what} as text or as a file, not both", "drop one of them")
    if path is not None:
        if path == "-":
            return sys.stdin.read()
        try:   # bytes that are not UTF-8 reach the core as such, which names the rule
            with open(path, encoding="utf-8", errors="surrogateescape") as f:
                return f.read()
        except OSError as e:
            raise UsageError(f"cannot read {path}: {e.strerror}", "check the path") from None
    return text or ""


def split_list(values) -> list[str]:
    """Repeatable options that also accept comma lists: --tag a --tag b,c."""
    return [x.strip() for v in (values or []) for x in v.split(",") if x.strip()]
