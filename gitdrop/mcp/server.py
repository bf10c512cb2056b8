"""gitdrop's MCP server: registration and transport only. The tools' bodies are in
mcp_tools.py; every tool call becomes one core call, so one commit checked by the
same rules as a `git push`.

Identity: over stdio the process speaks for the agent given with --as (or the one
that registers in this session); over streamable HTTP every call carries the
agent's bearer token (`register` hands it out) and acts for that agent only.

Push: the notifier watches the hub's refs, so whatever lands for a connected agent
(another MCP call, the CLI, a raw `git push`) reaches its session as a resource
update of its inbox plus tools/list_changed: on `subscriptions/listen` streams
(protocol 2026-07-28) and on legacy (2025-11-25) sessions alike.

Importing this module imports mcp (~0.9 s): only `gitdrop serve` should.
"""

import argparse
import asyncio
import contextvars
import functools
import importlib
import inspect
import json
import logging
import os
import sys
import threading
import typing

import anyio
from mcp.server import MCPServer
from mcp.server.lowlevel.server import NotificationOptions
from mcp.server.mcpserver.exceptions import ResourceError
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from mcp.shared.subscriptions import ResourceUpdated, ToolsListChanged
from mcp_types import INVALID_PARAMS, INVALID_REQUEST, SERVER_INFO_META_KEY, \
    CallToolRequestParams, EmptyResult, SubscribeRequestParams, ToolAnnotations, \
    UnsubscribeRequestParams, jsonrpc_message_adapter
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from . import tools as mcp_tools
from .. import model
from ..errors import GitdropError
from ..writequeue import SyncLater, sync_all
from .tools import CALLER, ToolBox, inbox_uri

logger = logging.getLogger("gitdrop.mcp")
_LISTENER: contextvars.ContextVar[str] = contextvars.ContextVar("gitdrop_listener", default="")


class AgentBus:
    """A subscription bus whose listen streams belong to agents: an agent's news
    goes to that agent's streams only (the SDK's bus fans out to everyone)."""

    def __init__(self, per_agent: bool):
        self.per_agent = per_agent  # stdio: one client, every stream is its own
        self._listeners: dict[object, tuple[str, object]] = {}

    async def publish(self, event) -> None:
        for _agent, listener in list(self._listeners.values()):
            listener(event)
        await anyio.lowlevel.checkpoint()

    def subscribe(self, listener):
        token = object()
        self._listeners[token] = (_LISTENER.get(), listener)  # set by the middleware
        return lambda: self._listeners.pop(token, None)

    def publish_to(self, agent: str, event) -> None:
        for owner, listener in list(self._listeners.values()):
            if owner == agent or not self.per_agent:
                try:
                    listener(event)
                except Exception:  # a closed stream must not stop the others
                    pass


# Keywords that apply to values of one JSON type only: alternatives that differ in
# type and carry no others can be one schema with a `type` list.
_OWN_TYPE = {"type", "items", "additionalProperties"}


def _merged(any_of):
    """anyOf alternatives as one schema, or None: each of another type (integer and
    number overlap) and with keywords of its own type only."""
    if not all(isinstance(x, dict) and isinstance(x.get("type"), str) and x.keys() <= _OWN_TYPE
               for x in any_of):
        return None
    types = [x["type"] for x in any_of]
    others = [k for x in any_of for k in x if k != "type"]
    if len(set(types)) < len(types) or {"integer", "number"} <= set(types) or \
            len(set(others)) < len(others):
        return None
    out = {k: v for x in any_of for k, v in x.items() if k != "type"}
    out["type"] = types
    return out


def _compact(schema):
    """A schema without what costs an agent's context and says nothing: pydantic's
    titles, empty defaults; a union of types as one `type` list where it means the
    same (`{"type": ["string", "array"], "items": ...}`)."""
    if isinstance(schema, list):
        return [_compact(x) for x in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for k, v in schema.items():
        if k == "title" and isinstance(v, str):
            continue
        if k == "default" and (v is None or not isinstance(v, bool) and v in ("", 0, [], {})):
            continue
        if k in ("properties", "$defs") and isinstance(v, dict):
            out[k] = {name: _compact(sub) for name, sub in v.items()}
        else:
            out[k] = _compact(v)
    any_of = out.get("anyOf")
    merged = _merged(any_of) if any_of else None
    if merged is not None:
        out.pop("anyOf")
        out.update(merged)
    return out


def _outline(schema: dict) -> dict:
    """An output schema as an outline: an object whose description names its fields,
    and in brackets the fields of the records a list of them holds ("messages[id op
    from ...] remaining"). It validates every result; the full shapes are the
    TypedDicts in tools.py (tests hold every result to them) and docs/MCP.md. Typing
    each top-level field cost about a fifth of tools/list."""
    def deref(sub):
        return schema["$defs"][sub["$ref"].rsplit("/", 1)[1]] if "$ref" in sub else sub
    parts = []
    for name, sub in schema.get("properties", {}).items():
        record = deref(deref(sub).get("items", {}))
        parts.append(f"{name}[{' '.join(record['properties'])}]"
                     if "properties" in record else name)
    return {"type": "object", "description": " ".join(parts)}


def _described(schema: dict, params: dict[str, str], hidden=()) -> dict:
    """An input schema whose properties carry their parameters' descriptions, less
    the `hidden` ones (optional: never required)."""
    props = schema.get("properties", {})
    return dict(schema, properties={name: dict(sub, description=params[name])
                                    if params.get(name) else sub
                                    for name, sub in props.items() if name not in hidden})


class GitdropServer(MCPServer):
    """MCPServer whose tools/list carries compact schemas (computed once): every
    tool description is paid for in the agent's context on every call."""

    _listed = None
    params: dict[str, dict[str, str]]  # tool → parameter → description (build)
    hidden: tuple[str, ...] = ()       # parameters left out of tools/list (build)

    async def list_tools(self):
        if self._listed is None:
            self._listed = [t.model_copy(update={
                "input_schema": _described(_compact(t.input_schema), self.params.get(t.name, {}),
                                           self.hidden if t.name != "register" else ()),
                "output_schema": _outline(_compact(t.output_schema)) if t.output_schema
                else None}) for t in await super().list_tools()]
        return self._listed


def _schema_only(fn):
    """The method's signature for MCPServer to derive the tool's input and output
    schemas from (tools/list); calls go through ToolCalls, never through this."""
    @functools.wraps(fn)
    async def call(**kw):
        raise AssertionError("tools/call is served by ToolCalls")
    return call


class BadArgument(ValueError):
    pass


def _as_str(v):
    if isinstance(v, str):
        return v
    raise BadArgument("a string")


def _as_int(v):
    if isinstance(v, int):  # bool included, as pydantic's lax mode does
        return int(v)
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str):
        try:
            return int(v.strip())
        except ValueError:
            pass
        try:
            f = float(v)
        except ValueError:
            f = 0.5
        if f.is_integer():  # "5.0"
            return int(f)
    raise BadArgument("an integer")


_TRUE = {"true", "t", "yes", "y", "on", "1"}
_FALSE = {"false", "f", "no", "n", "off", "0"}


def _as_bool(v):
    if isinstance(v, bool):
        return v
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    if isinstance(v, str) and v.strip().lower() in _TRUE | _FALSE:
        return v.strip().lower() in _TRUE
    raise BadArgument("true or false")


def _as_str_or_int(v):
    if isinstance(v, (str, int)):
        return int(v) if isinstance(v, bool) else v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    raise BadArgument("a string or an integer")


def _as_int_map(v):
    """An object of whole numbers ({"loop_cap": 5}), or "loop_cap=5,loop_window=60"."""
    if v is None:
        return None
    if isinstance(v, str):
        pairs = [p.partition("=") for p in v.split(",") if p.strip()]
        if any(not sep for _k, sep, _v in pairs):
            raise BadArgument('an object of whole numbers, or "key=value,..."')
        v = {k.strip(): x.strip() for k, _sep, x in pairs}
    if not isinstance(v, dict):
        raise BadArgument("an object of whole numbers")
    try:
        return {str(k): _as_int(x) for k, x in v.items()}
    except BadArgument:
        raise BadArgument("an object of whole numbers") from None


def _as_str_list(v):
    """A list of strings, or one string of comma-separated items ("a.py, b.py")."""
    if isinstance(v, str):
        return [x.strip() for x in v.split(",") if x.strip()]
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        return [x.strip() for x in v if x.strip()]
    raise BadArgument("a list of strings or a comma-separated string")


_COERCE = {str: _as_str, int: _as_int, bool: _as_bool, str | int: _as_str_or_int,
           dict[str, int] | None: _as_int_map, str | list[str]: _as_str_list}


class Params:
    """One tool's parameters, checked as the published input schema says (and as
    leniently as pydantic's lax mode: "5" for an integer, "false" for a boolean),
    with the checks worked out once: building a pydantic model per call cost more
    than some core calls. Unknown arguments are ignored, as before."""

    def __init__(self, fn):
        hints = typing.get_type_hints(fn)
        self.params = []  # (name, coerce, required, default)
        for name, p in inspect.signature(fn).parameters.items():
            if name == "self":  # the unbound method (tests)
                continue
            coerce = _COERCE[hints[name]]  # a new parameter type needs a checker here
            required = p.default is inspect.Parameter.empty
            self.params.append((name, coerce, required, None if required else p.default))
        self.names = [p[0] for p in self.params]

    def check(self, arguments) -> dict:
        """The keyword arguments for the tool body; BadArgument names what is wrong."""
        kw = {}
        for name, coerce, required, default in self.params:
            if name not in arguments:
                if required:
                    raise BadArgument(f"missing required argument {name!r}")
                kw[name] = default
                continue
            v = arguments[name]
            try:
                kw[name] = coerce(v)
            except BadArgument as e:
                raise BadArgument(f"argument {name!r} must be {e}, not "
                                  f"{json.dumps(v, ensure_ascii=False)[:80]}") from None
        return kw


def _error(text: str) -> dict:
    return {"content": [{"type": "text", "text": text}], "isError": True}


def _complete(ctx, result: dict) -> dict:
    """A wire result; protocol 2026-07-28 requires its resultType."""
    if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
        result["resultType"] = "complete"
    return result


class ToolCalls:
    """tools/call on the SDK's lowlevel handler: the name looked up, the arguments
    checked (Params), the body run on the event loop (a core call is a few ms of
    blocking git writes: a worker thread would add a hop per call), the result sent
    as structured content plus its compact JSON text (the SDK's text is indented
    and lands in the agent's context). A refusal is a tool error naming the rule
    and the next call. Results are the TypedDicts of mcp_tools.py: what
    outputSchema says, which tests check against every tool's schema."""

    def __init__(self, box: ToolBox, names, profile: str = "all"):
        self.box = box
        self.profile = profile
        self.tools = {name: (getattr(box, name), Params(getattr(box, name))) for name in names}

    async def __call__(self, ctx, params: CallToolRequestParams) -> dict:
        return _complete(ctx, await durable_call(self.call, params.name,
                                                 params.arguments or {}))

    def unknown(self, name: str) -> str:
        """Unknown here; a tool of a larger profile says which and how to get it."""
        wider = mcp_tools.TOOLS.get(name)
        if wider is None:
            return f"Unknown tool: {name}"
        also = " or --tools all" if wider != "all" else ""
        return (f"Unknown tool: {name}: it is a tool of the {wider} profile, and this server "
                f"was started with --tools {self.profile}\nNext: start the server with --tools "
                f"{wider}{also} (gitdrop mcp install --tools {wider} rewrites the client's "
                "config), or ask a lead to do it")

    def call(self, name: str, arguments: dict) -> dict:
        entry = self.tools.get(name)
        if entry is None:
            return _error(self.unknown(name))
        fn, checks = entry
        try:
            kw = checks.check(arguments)
        except BadArgument as e:
            return _error(f"Error executing tool {name}: {e}\nNext: call {name} with "
                          f"the parameters of its input schema ({', '.join(checks.names)})")
        take = getattr(getattr(self.box.hub, "store", None), "take_queued", None)
        if take:
            take()   # this call's queued writes only (a remote hub that was unreachable)
        try:
            self.box.authorize(name)
            result = fn(**kw)
            queued = self.box.hub.store.queued_answer(shell=False) if take else {}
            if queued and isinstance(result, dict):
                result = dict(result, **queued)
        except GitdropError as e:
            return _error(f"Error executing tool {name}: {mcp_tools.render_error(e)}")
        except Exception:
            logger.exception("Tool %r raised an unexpected exception", name)
            return _error(f"Error executing tool {name}")
        text = json.dumps(result, ensure_ascii=False, separators=(",", ":"))
        return {"content": [{"type": "text", "text": text}], "structuredContent": result}


def _resource(fn):
    @functools.wraps(fn)
    def read(*a, **kw):
        try:
            return fn(*a, **kw)
        except GitdropError as e:
            raise ResourceError(mcp_tools.render_error(e)) from None
    return read


LINE_LIMIT = 1 << 24      # bytes of one stdio line
MAX_SUBSCRIPTIONS = 64   # resources one session may subscribe to (each kept in memory)
_FOLLOWED = "gitdrop_followed"   # in a session's connection state: Push.follow has it


class Push:
    """Sessions to tell when something lands for their agent, and the telling."""

    def __init__(self, box: ToolBox, bus: AgentBus):
        self.box = box
        self.bus = bus
        self.loop: asyncio.AbstractEventLoop | None = None
        self.loop_thread = 0
        self.notifier = None
        self.watched: dict[str, object] = {}   # agent → unsubscribe
        self.legacy: dict[str, tuple[str, object]] = {}  # session key → (agent, session)
        self.subs: dict[str, set[str]] = {}    # session key → subscribed URIs (legacy)
        self.wire = None   # stdio: writes a line to the client (set by _run_stdio)
        self.ended: list = []   # called with a session's key when it ends (the HTTP door's)
        self._tasks: set = set()

    def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.loop_thread = threading.get_ident()
        try:
            from ..notifier import Notifier
            self.notifier = Notifier(self.box.hub_spec).start(self.loop)
        except Exception as e:  # serve without push rather than not at all
            sys.stderr.write(f"gitdrop: push notifications off ({type(e).__name__}: {e})\n")
        if self.box.bound:
            self.watch(self.box.bound)

    def stop(self) -> None:
        if self.notifier is not None:
            self.notifier.stop()

    def watch(self, agent: str) -> None:
        if self.notifier is None or "/" not in agent or agent in self.watched:
            return
        self.watched[agent] = self.notifier.subscribe(
            self.box.room_name, agent, functools.partial(self._landed, agent))

    def _landed(self, agent: str, events: list) -> None:
        """The notifier's callback: on the loop for a local hub (its events are read
        there), on a thread for a remote one."""
        if self.loop is None or self.loop.is_closed():
            return
        if threading.get_ident() == self.loop_thread:
            self.deliver(agent, events)
        else:
            self.loop.call_soon_threadsafe(self.deliver, agent, events)

    def deliver(self, agent: str, events: list) -> None:  # on the loop
        uris = {inbox_uri(agent)}
        tasks = {f"gitdrop://tasks/{ev['task']}" for ev in events if ev.get("task")}
        if tasks:
            uris |= tasks | {"gitdrop://tasks"}
        for uri in sorted(uris):
            self.bus.publish_to(agent, ResourceUpdated(uri=uri))
        self.bus.publish_to(agent, ToolsListChanged())
        for key, (owner, session) in list(self.legacy.items()):
            if owner != agent:
                continue
            subscribed = sorted(uris & self.subs.get(key, set()))
            if key == "stdio" and self.wire is not None:
                # The two notifications as the SDK writes them, written here: its
                # session path (a task, pydantic) cost the receiving server 0.2 ms
                # just as its agent's next call arrived.
                for uri in subscribed:
                    self.wire(b'{"jsonrpc":"2.0","method":"notifications/resources/updated",'
                              b'"params":{"uri":%s}}\n' % json.dumps(uri).encode())
                self.wire(b'{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}\n')
                continue
            task = asyncio.ensure_future(self._tell(key, session, subscribed))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _tell(self, key: str, session, uris: list) -> None:
        try:
            for uri in uris:
                await session.send_resource_updated(uri)
            await session.send_tool_list_changed()
        except Exception:  # the session is gone
            self.legacy.pop(key, None)
            self.subs.pop(key, None)

    # --- legacy sessions ------------------------------------------------------
    def track(self, key: str, agent: str, session) -> None:
        self.legacy[key] = (agent, session)

    def follow(self, ctx) -> None:
        """Have the session's entries let go when it ends (DELETE, expiry, the end of
        stdio): each keeps its session, about 17 KB, and a client opening and closing
        sessions in a loop grew the server without bound. Once per session."""
        connection = getattr(ctx.session, "_connection", None)
        if connection is None or connection.state.get(_FOLLOWED) or \
                connection.protocol_version in MODERN_PROTOCOL_VERSIONS:   # one request's
            return
        connection.state[_FOLLOWED] = True
        connection.exit_stack.callback(self.end, _session_key(ctx))

    def end(self, key: str) -> None:
        self.legacy.pop(key, None)
        self.subs.pop(key, None)
        for ended in self.ended:
            ended(key)

    async def on_subscribe(self, ctx, params: SubscribeRequestParams) -> EmptyResult:
        uri = str(params.uri)
        agent = CALLER.get().agent
        if self.box.transport == "http" and not agent:
            raise MCPError(INVALID_REQUEST, "resources/subscribe needs your bearer token "
                           "(Authorization: Bearer <token>; register gives it)")
        if uri.startswith("gitdrop://inbox/") and uri != inbox_uri(agent):
            raise MCPError(INVALID_PARAMS, "you may subscribe to your own inbox only: "
                           f"{inbox_uri(agent or '<team>/<name>')}")
        tid = uri.removeprefix("gitdrop://tasks/")
        if not (uri in ("gitdrop://tasks", "gitdrop://room") or uri == inbox_uri(agent)
                or (tid != uri and model.KEY_RE.match(tid))):
            raise MCPError(INVALID_PARAMS, f"no resource {uri[:80]!r} to subscribe to: "
                           "resources/list names them")
        subs = self.subs.setdefault(_session_key(ctx), set())
        if uri not in subs and len(subs) >= MAX_SUBSCRIPTIONS:
            raise MCPError(INVALID_PARAMS, f"a session holds at most {MAX_SUBSCRIPTIONS} "
                           "subscriptions: unsubscribe from some first")
        subs.add(uri)
        return EmptyResult()

    async def on_unsubscribe(self, ctx, params: UnsubscribeRequestParams) -> EmptyResult:
        self.subs.get(_session_key(ctx), set()).discard(str(params.uri))
        return EmptyResult()


def _headers(ctx):
    return getattr(ctx.request, "headers", None)


def _peer(ctx) -> str:
    client = getattr(ctx.request, "client", None)
    return getattr(client, "host", "") or ""


def _session_key(ctx) -> str:
    """The HTTP session's id (known from its initialize on), or "stdio"."""
    connection = getattr(ctx.session, "_connection", None)   # no public seam here
    return getattr(connection, "session_id", None) or "stdio"


def _plain_call(params) -> bool:
    """tools/call params that are a tool name and an arguments object, nothing the
    SDK must interpret (a task request, say); `_meta` is the envelope."""
    return (isinstance(params, dict) and isinstance(params.get("name"), str)
            and isinstance(params.get("arguments", {}), dict)
            and params.keys() <= {"name", "arguments", "_meta"})


def _answerable(ctx) -> bool:
    """A tools/call that ToolCalls can answer by itself: the session is past its
    handshake (the SDK's gate, which stays in charge otherwise) and the call is
    plain."""
    connection = getattr(ctx.session, "_connection", None)
    return (ctx.method == "tools/call" and _plain_call(ctx.params)
            and getattr(connection, "initialize_accepted", False) is True)


async def durable_call(fn, *args):
    """fn(*args), a tool call, answered once its writes are durable. Their syncs are
    awaited on a thread, not on the event loop: the loop serves other calls
    meanwhile, and one fdatasync covers the writes of all of them (group commit)."""
    with SyncLater() as writers:
        result = fn(*args)
    if writers:
        await anyio.to_thread.run_sync(sync_all, writers)
    return result


def answer(calls: ToolCalls, params: dict, version: str, stamp) -> dict:
    """The wire result of a plain tools/call, as the SDK's pipeline shapes it
    (tests/test_mcp_units.py checks it against the SDK's own result surface)."""
    result = calls.call(params["name"], params.get("arguments") or {})
    if version in MODERN_PROTOCOL_VERSIONS:
        result["resultType"] = "complete"
        result["_meta"] = {SERVER_INFO_META_KEY: stamp()}
    return result


def _identify(box: ToolBox, push: Push, calls: ToolCalls, stamp):
    """Middleware: who is calling (the bound agent, or the bearer token's), for the
    whole request; legacy sessions are remembered for push.

    A plain tools/call is answered here, without call_next: the SDK lets a
    middleware return its own well-formed result, and its request and result
    validation (pydantic, both ways) cost more than some tool bodies. ToolCalls
    checks the arguments; the result is the same wire dict the SDK would make
    (tests/test_mcp_units.py compares the two)."""
    async def middleware(ctx, call_next):
        push.follow(ctx)
        caller = box.identify(_headers(ctx), _peer(ctx))
        token = CALLER.set(caller)
        listener = None
        try:
            if caller.agent:
                push.watch(caller.agent)
                if ctx.request_id is not None and ctx.method != "initialize" and \
                        ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
                    push.track(_session_key(ctx), caller.agent, ctx.session)
            if ctx.method == "subscriptions/listen":
                if box.transport == "http" and not caller.agent:
                    raise MCPError(INVALID_REQUEST, "subscriptions/listen needs your bearer "
                                   "token (Authorization: Bearer <token>; register gives it)")
                listener = _LISTENER.set(caller.agent)
            if _answerable(ctx):
                return await durable_call(answer, calls, ctx.params, ctx.protocol_version,
                                          stamp)
            return await call_next(ctx)
        finally:
            if listener is not None:
                _LISTENER.reset(listener)
            CALLER.reset(token)
    return middleware


def _instructions(box: ToolBox) -> str:
    who = f"You are {box.bound}. " if box.bound else ""
    return (f"gitdrop room {box.room_name!r}: a git-backed coordination room for agents. "
            f"{who}Start with register, then check_inbox; check_inbox again whenever "
            "notified (gitdrop://inbox/<team>/<name> is updated when something lands). "
            "Every action is a commit checked by the room's rules; a refusal names the "
            "rule and the next call to make.")


def build(hub_path: str, room: str, agent: str | None = None, transport: str = "stdio",
          tools: str = "agent", registration: str = "open") -> tuple[GitdropServer, ToolBox, Push]:
    """The server for one room of a hub, with the tools of one profile."""
    box = ToolBox(hub_path, room, agent, transport, registration)
    bus = AgentBus(per_agent=box.transport == "http")
    push = Push(box, bus)
    names = mcp_tools.tools_for(tools)
    calls = ToolCalls(box, names, tools)
    stamp = lambda: server._lowlevel_server.server_info_stamp  # noqa: E731
    server = GitdropServer("gitdrop", instructions=_instructions(box),
                           version=_version(), subscriptions=bus, log_level="WARNING",
                           middleware=[_identify(box, push, calls, stamp)])
    server.push = push
    server.params = {}
    if box.transport == "http" or box.fixed:  # the session says who calls
        server.hidden = mcp_tools.IDENTITY
    for name in names:
        fn = getattr(box, name)
        description, server.params[name] = mcp_tools.describe(fn)
        server.add_tool(_schema_only(fn), name=name, description=description,
                        annotations=ToolAnnotations(read_only_hint=True)
                        if name in mcp_tools.READ_ONLY else None)

    @server.resource("gitdrop://inbox/{team}/{name}", name="inbox", mime_type="application/json",
                     description="Your unread messages and notices (reading it marks nothing "
                     "read). Updated when something lands for you.")
    @_resource
    def inbox(team: str, name: str) -> str:
        return box.inbox_resource(team, name)

    @server.resource("gitdrop://tasks", name="board", mime_type="application/json",
                     description="The room's open tasks by priority, 50 of them "
                                 "(more: how many follow; list_tasks pages on).")
    @_resource
    def board() -> str:
        return box.board_resource()

    @server.resource("gitdrop://tasks/{task_id}", name="task", mime_type="application/json",
                     description="One task with its description.")
    @_resource
    def task(task_id: str) -> str:
        return box.task_resource(task_id)

    @server.resource("gitdrop://room", name="room", mime_type="application/json",
                     description="The room: teams, leads, agents and their health.")
    @_resource
    def room_() -> str:
        return box.room_resource()

    # Legacy (2025-11-25) clients subscribe per resource; modern ones listen.
    low = server._lowlevel_server  # the SDK offers no public seam for these three
    low.add_request_handler("tools/call", CallToolRequestParams, calls)
    low.add_request_handler("resources/subscribe", SubscribeRequestParams, push.on_subscribe)
    low.add_request_handler("resources/unsubscribe", UnsubscribeRequestParams,
                            push.on_unsubscribe)
    init_options = low.create_initialization_options
    low.create_initialization_options = lambda options=None, *a, **kw: init_options(
        options or NotificationOptions(tools_changed=True), *a, **kw)
    return server, box, push


class _WireIn:
    """The SDK's read stream (mcp.shared._stream_protocols.ReadStream) over the
    stdin pipe: each line parsed as the SDK's stdio transport parses it, in the
    reader's own task. The SDK's transport hands every line through a reader task
    and a rendezvous stream: two task switches per message, which on a process
    woken for each call cost more than the parsing."""

    def __init__(self, reader: asyncio.StreamReader, out: "_WireOut | None" = None):
        self.reader, self.out = reader, out

    async def receive(self):
        while True:
            try:
                line = await self.reader.readline()
            except ValueError:   # past the reader's limit: dropped (its tail reads as a line)
                if self.out is not None:
                    self.out.line(_too_long())
                continue
            if not line:
                raise anyio.EndOfStream
            try:
                return SessionMessage(jsonrpc_message_adapter.validate_json(line, by_name=False))
            except Exception as exc:
                answer = unreadable(line, exc)
                if answer is None or self.out is None:
                    return exc   # handed on, as the SDK's transport does: it logs it
                self.out.line(answer)

    def __aiter__(self):
        return self

    async def __anext__(self):
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        pass

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()


def _too_long() -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": None, "error": {
        "code": -32700, "message": f"a line past {LINE_LIMIT >> 20} MiB was dropped\nNext: "
        "send shorter requests (long text goes in a task's body or a file)"}}).encode() + b"\n"


def unreadable(line: bytes, exc: Exception) -> bytes | None:
    """The JSON-RPC error answering a line the SDK cannot read, or None (a
    notification, which gets no answer). The SDK only logs such a line, so its
    sender waited for ever: a string holding a lone surrogate (valid JSON, not
    Unicode) was enough."""
    why = str(exc).splitlines()[1].strip() if len(str(exc).splitlines()) > 1 else str(exc)
    try:
        msg = json.loads(line)
    except ValueError:
        msg = None
    if not isinstance(msg, dict):
        ident, code = None, -32700   # parse error: the id cannot be known
    elif "method" in msg and "id" not in msg:
        return None
    else:
        ident, code = msg.get("id"), INVALID_REQUEST
        if not isinstance(ident, (str, int)) or isinstance(ident, bool):
            ident = None
    text = (f"Invalid request: {why[:200]}\nNext: send the request as JSON in UTF-8 "
            "(every string valid Unicode: no lone surrogate such as \\udcff)")
    return json.dumps({"jsonrpc": "2.0", "id": ident, "error": {"code": code, "message": text}},
                      separators=(",", ":")).encode() + b"\n"


class _WireOut:
    """The SDK's write stream over the stdout pipe: a message is one line written
    whole by the event loop (no writer task); back-pressure only past the
    transport's high-water mark."""

    def __init__(self, writer: asyncio.StreamWriter):
        self.writer = writer

    def line(self, data: bytes) -> None:
        """Write one whole line the caller serialized."""
        self.writer.write(data)

    async def send(self, item) -> None:
        self.writer.write(item.message.model_dump_json(by_alias=True, exclude_unset=True)
                          .encode("utf-8") + b"\n")
        if self.writer.transport.get_write_buffer_size():
            await self.writer.drain()

    async def aclose(self) -> None:
        try:
            await self.writer.drain()
        except (ConnectionError, RuntimeError):  # the client is gone
            pass

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()


async def wire(fd_in: int, fd_out: int):
    """The SDK's read and write streams over two pipe (or socket) fds, served by
    the event loop; the fds are theirs to close."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=LINE_LIMIT, loop=loop)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader, loop=loop),
                                 os.fdopen(fd_in, "rb", buffering=0))
    transport, protocol = await loop.connect_write_pipe(
        lambda: asyncio.streams.FlowControlMixin(loop=loop), os.fdopen(fd_out, "wb", buffering=0))
    writer = asyncio.StreamWriter(transport, protocol, None, loop)
    out = _WireOut(writer)
    return _WireIn(reader, out), out


async def _pipes():
    """The wire on private copies of fds 0 and 1; fd 0 then reads /dev/null and
    fd 1 writes to stderr, so nothing stray reaches the wire. None where
    stdin/stdout are not pipes or sockets (a file, say)."""
    wire_in, wire_out = os.dup(0), os.dup(1)
    try:
        streams = await wire(wire_in, wire_out)
    except (OSError, ValueError):
        return None
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    return streams


async def _run_stdio(server: GitdropServer) -> None:
    low = server._lowlevel_server
    streams = await _pipes()
    if streams is not None:
        server.push.wire = streams[1].line
        await low.run(*streams, low.create_initialization_options())
        return
    from mcp.server.stdio import stdio_server
    async with stdio_server() as (read, write):
        await low.run(read, write, low.create_initialization_options())


async def _run_http(server: GitdropServer, host: str, port: int, what: str, tools: str):
    """The SDK's run_streamable_http_async, on a socket bound first: the address
    printed is the one served (--port 0 printed port 0), and one in use is a usage
    error rather than uvicorn's log."""
    import uvicorn
    from ..transports.httpd import listen, url_host
    sock = listen(host, port)
    port = sock.getsockname()[1]
    sys.stderr.write(f"gitdrop: serving {what} at http://{url_host(host)}:{port}/mcp "
                     f"(tools: {tools})\n")
    # The SDK's log handler imports this on an error; with no file descriptor left
    # (an accept that failed for want of one), the import failed and ended the server.
    importlib.import_module("rich.traceback")
    from ..transports.conns import BACKLOG, http_protocol
    app = http_app(server, host)
    config = uvicorn.Config(app, host=host, port=port, http=http_protocol(), backlog=BACKLOG,
                            log_level=server.settings.log_level.lower())
    await uvicorn.Server(config).serve(sockets=[sock])


def http_app(server: GitdropServer, host: str, **options):
    """The ASGI app served over HTTP: the SDK's, behind the door (doors.py), which
    forgets a session's binding when Push sees the session end. `options`: the
    SDK's streamable_http_app's (a short session_idle_timeout, in tests)."""
    from .doors import SessionGuard
    guard = SessionGuard(server.streamable_http_app(host=host, transport_security=_guard(host),
                                                    **options), server.push.box)
    server.push.ended.append(guard.forget)
    return guard


def _guard(host: str):
    """Bound to this machine, the server answers only requests addressed to it by
    name (DNS rebinding: a web page whose name resolves to 127.0.0.1 would call the
    tools through the browser). The SDK does so for 127.0.0.1, localhost and ::1
    alone; 127.0.0.2 or a name of this machine went unguarded. None: the SDK's way."""
    from mcp.server.transport_security import TransportSecuritySettings
    from ..transports.httpd import LOOPBACK, is_local, url_host
    if not is_local(host):
        return None
    names = [url_host(h) for h in dict.fromkeys(LOOPBACK + (host.strip("[]"),))]
    return TransportSecuritySettings(enable_dns_rebinding_protection=True,
                                     allowed_hosts=[f"{n}:*" for n in names],
                                     allowed_origins=[f"http://{n}:*" for n in names])


def _version() -> str:
    from .. import __version__
    return __version__


def default_registration(host: str) -> str:
    """Open on this machine; closed where others reach the server (anyone there
    could register agents, and teams, without a token)."""
    from ..transports.httpd import is_local
    return "open" if is_local(host) else "closed"


def serve(hub_path: str, room: str, agent: str | None, transport: str = "stdio",
          host: str = "127.0.0.1", port: int = 9400, tools: str = "agent",
          registration: str | None = None) -> None:
    """Serve one room of a hub over stdio (one agent) or streamable HTTP (/mcp).
    `registration` (HTTP): "open" or "closed"; by default open on this machine,
    closed where other machines reach it."""
    server, box, push = build(hub_path, room, agent, transport, tools,
                              registration or default_registration(host))
    from .. import pauses
    pauses.keep_short()

    # The server reaps while it runs (a remote hub is reaped on its own machine).
    every = box.hub.config("gitdrop.reapIntervalSeconds", 3600) if hasattr(box.hub, "config") else 0
    reaper = box.hub.reap_every(every) if every > 0 and not getattr(box.hub, "url", "") else None

    async def main():
        push.start()
        try:
            if box.transport == "stdio":
                await _run_stdio(server)
            else:
                await _run_http(server, host, port, f"room {room} of {box.hub.path}",
                                f"{tools}; registration: {box.registration}")
        finally:
            push.stop()
            if reaper is not None:
                reaper.set()
    anyio.run(main, backend="asyncio")


def main(argv=None) -> int:
    """`python -m gitdrop.mcp.server HUB ROOM [--as NAME] [--transport stdio|http] ...`"""
    p = argparse.ArgumentParser(prog="python -m gitdrop.mcp.server")
    p.add_argument("hub", nargs="?", default=os.environ.get("GITDROP_HUB", ""))
    p.add_argument("room", nargs="?", default=os.environ.get("GITDROP_ROOM", "lobby"))
    p.add_argument("--as", dest="agent", default=os.environ.get("GITDROP_AGENT") or None)
    p.add_argument("--transport", default="stdio", choices=["stdio", "http", "streamable-http"])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9400)
    p.add_argument("--tools", default="agent", choices=list(mcp_tools.PROFILES))
    p.add_argument("--registration", default=None, choices=["open", "closed"])
    a = p.parse_args(argv)
    from ..core import default_hub
    try:
        serve(a.hub or default_hub(), a.room, a.agent, a.transport, a.host, a.port, a.tools,
              a.registration)
    except GitdropError as e:
        sys.stderr.write(e.render() + "\n")
        return e.exit_code
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
