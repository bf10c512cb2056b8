"""A client that is not Python: the official TypeScript SDK (@modelcontextprotocol/sdk)
lists the tools and calls register, send and check_inbox over stdio and streamable
HTTP. Runs where Node is installed (.ci/setup.d/20-node.sh installs the package)."""

import json
import os
import shutil
import subprocess
import sys

import pytest
from mcp_helpers import ROOT, http_server

from gitdrop.mcp import tools as mcp_tools

NODE_DIR = os.path.join(ROOT, "tests", "node")
SDK = os.path.join(NODE_DIR, "node_modules", "@modelcontextprotocol", "sdk")
INSTALL = "cd tests/node && npm ci (what .ci/setup.d/20-node.sh runs)"
pytestmark = pytest.mark.skipif(
    shutil.which("node") is None or not os.path.isdir(SDK),
    reason=f"Node.js is not installed (no node on PATH); then install the SDK: {INSTALL}"
    if shutil.which("node") is None else
    f"the TypeScript SDK is not in tests/node/node_modules; install it: {INSTALL}")


def run_node(*args) -> dict:
    p = subprocess.run(["node", os.path.join(NODE_DIR, "client.mjs"), *args], cwd=ROOT,
                       capture_output=True, text=True, timeout=90)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def check(out: dict) -> None:
    assert out["tools"] == mcp_tools.tools_for("agent")
    assert [r["agent"] for r in out["register"]] == ["node/ada", "node/bob"]
    assert out["send"]["to"] == ["node/bob"]
    msgs = out["inbox"]["messages"]
    assert [(m["from"], m["text"]) for m in msgs] == [("node/ada", "hello from node")]
    assert out["inbox"]["remaining"] == 0


def test_typescript_sdk_over_stdio(hub):
    check(run_node("stdio", sys.executable, hub.path))


def test_typescript_sdk_over_http(hub):
    with http_server(hub.path, tools="agent") as url:
        out = run_node("http", url)
    check(out)
    assert out["refused_without_token"] is True
    assert all(r["token"].startswith("gd_") for r in out["register"])
