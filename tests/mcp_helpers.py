"""Helpers for the MCP tests: real servers (subprocesses) and real SDK clients."""

import contextlib
import functools
import json
import os
import socket
import subprocess
import sys
import time
import typing

import anyio
import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from pydantic import TypeAdapter

from gitdrop.mcp.tools import ToolBox

from conftest import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def server_args(hub_path, *extra, room="lobby"):
    return ["-m", "gitdrop.mcp.server", hub_path, room, *extra]


@contextlib.contextmanager
def http_server(hub_path, tools="all", *extra, room="lobby"):
    """`python -m gitdrop.mcp.server HUB ROOM --transport http` on a free port."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, *server_args(hub_path, "--transport", "http",
                                                         "--port", str(port), "--tools", tools,
                                                         *extra, room=room)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError("the MCP server did not start: "
                                         + proc.stderr.read().decode()[-2000:])
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


class Refused(AssertionError):
    pass


@functools.cache
def result_type(tool: str) -> TypeAdapter:
    return TypeAdapter(typing.get_type_hints(getattr(ToolBox, tool))["return"])


def check_result(tool: str, structured: dict, text: str) -> None:
    """A result is its tool's TypedDict to the last field (strictly: no "1" for 1;
    the server sends it unchecked, the client checks the outline in outputSchema),
    and its text copy is the same JSON."""
    result_type(tool).validate_python(structured, strict=True)
    assert json.loads(text) == structured, f"{tool}: the text and structured results differ"


class Agent:
    """One agent's MCP session: calls that must succeed, calls that must be refused."""

    def __init__(self, client: Client, name: str, http: httpx2.AsyncClient | None = None):
        self.client, self.name, self.http = client, name, http
        self.called: set[str] = set()

    def authenticate(self, token: str) -> None:
        if self.http is not None:
            self.http.headers["Authorization"] = f"Bearer {token}"

    async def call(self, tool: str, **args):
        self.called.add(tool)
        return await self.client.call_tool(tool, args)

    async def ok(self, tool: str, **args) -> dict:
        r = await self.call(tool, **args)
        if r.is_error:
            raise AssertionError(f"{self.name}: {tool}({args}) failed: {r.content[0].text}")
        assert r.structured_content is not None, f"{tool} returned no structured content"
        check_result(tool, r.structured_content, r.content[0].text)
        return r.structured_content

    async def refused(self, tool: str, rule: str, **args) -> str:
        r = await self.call(tool, **args)
        text = r.content[0].text if r.content else ""
        assert r.is_error, f"{self.name}: {tool}({args}) was accepted: {r.structured_content}"
        assert f"rule {rule}:" in text, f"{tool}: expected rule {rule}, got: {text}"
        assert "Next:" in text, f"{tool}: the refusal names no next step: {text}"
        return text


def http_client(token: str = "") -> httpx2.AsyncClient:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=300), headers=headers)


@contextlib.asynccontextmanager
async def http_agent(url: str, name: str, mode: str, token: str = "", message_handler=None):
    async with http_client(token) as http:
        async with Client(streamable_http_client(url, http_client=http), mode=mode,
                          message_handler=message_handler) as c:
            yield Agent(c, name, http)


def stdio_params(hub_path: str, agent: str, tools: str = "all") -> StdioServerParameters:
    # the SDK hands the server a few variables only: the test's mirror cache too
    env = {k: os.environ[k] for k in ("GITDROP_CACHE",) if k in os.environ}
    return StdioServerParameters(command=sys.executable, cwd=ROOT, env=env or None,
                                 args=server_args(hub_path, "--as", agent, "--tools", tools))


@contextlib.asynccontextmanager
async def stdio_agent(hub_path: str, name: str, mode: str, tools: str = "all",
                      message_handler=None):
    async with Client(stdio_params(hub_path, name, tools), mode=mode,
                      message_handler=message_handler) as c:
        yield Agent(c, name)


@contextlib.asynccontextmanager
async def together(*openers):
    """Enter several agents' sessions at once (server start-ups overlap); each
    stays owned by its own task, as anyio wants."""
    agents = [None] * len(openers)
    ready = [anyio.Event() for _ in openers]
    done = anyio.Event()

    async def hold(i, opener):
        async with opener as a:
            agents[i] = a
            ready[i].set()
            await done.wait()

    async with anyio.create_task_group() as tg:
        for i, opener in enumerate(openers):
            tg.start_soon(hold, i, opener)
        for e in ready:
            await e.wait()
        try:
            yield agents
        finally:
            done.set()
