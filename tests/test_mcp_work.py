"""Work over MCP, with the real SDK client over streamable HTTP and stdio: tasks that
wait on others and require capabilities, the ready queue and claim_task without an
id, a cross-team task signed by both leads, path leases, who with each agent's
capabilities and tasks, and refusals that name the next tool call (never a CLI
command)."""

import contextlib

import pytest
from mcp_helpers import http_agent, http_server, stdio_agent, together

from gitdrop import tokens
from gitdrop.mcp import tools as mcp_tools

pytestmark = pytest.mark.anyio

AGENTS = {"core/juno": "lead", "core/spartan": "coder", "web/lin": "lead", "web/kai": "coder"}


@pytest.fixture
def anyio_backend():
    return "asyncio"


def setup_room(hub):
    """Two teams, each with its lead, and a coder in each; spartan can do python."""
    lobby = hub.room("lobby")
    for agent, role in AGENTS.items():
        lobby.register(agent, [role], caps=["python"] if agent == "core/spartan" else None)
    hub.register_team("core", "core/juno")
    hub.register_team("web", "web/lin")
    return lobby


def no_cli(text: str) -> str:
    assert "gitdrop " not in text, text  # the next step is a tool call, not a command
    return text


async def scenario(juno, spartan, lin, kai):
    # --- capabilities and who ---------------------------------------------------------
    reg = await kai.ok("register", caps="css, js")
    assert reg["agent"] == "web/kai" and reg["updated"] is True
    who = {a["agent"]: a for a in (await kai.ok("who"))["agents"]}
    assert who["web/kai"]["caps"] == ["css", "js"] and who["core/spartan"]["caps"] == ["python"]
    assert who["web/kai"]["tasks"] == [] and who["web/kai"]["last_claimed"] == ""

    # --- tasks with dependencies and required capabilities -----------------------------
    schema = await juno.ok("create_task", title="Schema", requires="python", priority=3)
    api = await juno.ok("create_task", title="API", after=schema["id"], requires="python",
                        priority=2)
    styles = await juno.ok("create_task", title="Styles", requires="css", tags="ui", brief=True,
                           description="## Objective\n\nStyle it.\n\n## Acceptance criteria"
                                       "\n\n- [ ] it looks right\n")
    text = await juno.refused("create_task", "task-dependency", title="Orphan", after="99")
    assert "list_tasks shows each task's after" in no_cli(text)
    text = await juno.refused("create_task", "task-capability", title="Rust port",
                              requires="rust", assigned_to="web/kai")
    assert "register(caps=...)" in no_cli(text) and "who" in text

    board = {t["id"]: t for t in (await kai.ok("list_tasks"))["tasks"]}
    assert board[api["id"]]["after"] == [schema["id"]]
    assert board[api["id"]]["waiting_on"] == [schema["id"]]
    assert board[api["id"]]["requires"] == ["python"] and board[api["id"]]["blocked_by"] == ""
    assert board[schema["id"]]["waiting_on"] == [] and board[styles["id"]]["tags"] == ["ui"]
    assert [t["id"] for t in (await kai.ok("list_tasks", tag="ui"))["tasks"]] == [styles["id"]]

    # --- the ready queue ---------------------------------------------------------------
    # kai lacks python (schema, api) and api waits on schema: only styles is ready for kai
    assert [t["id"] for t in (await kai.ok("list_tasks", ready=True))["tasks"]] == \
        [styles["id"]]
    assert [t["id"] for t in (await spartan.ok("list_tasks", ready="true"))["tasks"]] == \
        [schema["id"]]
    text = await kai.refused("claim_task", "task-capability", task_id=schema["id"])
    assert "web/kai lacks python" in text and "register(caps=...)" in no_cli(text)
    text = await spartan.refused("claim_task", "task-dependency", task_id=api["id"])
    assert f"waits on task {schema['id']}" in text
    assert "claim_task without task_id" in no_cli(text)

    got = await kai.ok("claim_task")
    assert (got["id"], got["title"], got["state"], got["assignee"]) == \
        (styles["id"], "Styles", "assigned", "web/kai") and got["commit"]
    assert got["description"].startswith("## Objective") and "- [ ] it looks right" in \
        got["description"]   # the brief comes with the claim
    again = await kai.ok("claim_task")  # its own task is still the best: nothing new taken
    assert again["id"] == styles["id"] and again["commit"] == ""
    none = await kai.ok("claim_task", tag="backend")
    assert none == {"id": "", "state": "", "assignee": "", "commit": "", "title": ""}

    # --- a cross-team task: both leads sign before it starts ----------------------------
    text = await kai.refused("update_task", "dual-sign", task_id=styles["id"],
                             status="in_progress")
    assert f"update_task(task_id={styles['id']}, status='sign')" in no_cli(text)
    assert "core/juno" in text and "web/lin" in text
    text = await kai.refused("update_task", "task-state-machine", task_id=styles["id"],
                             status="sign")
    assert "may not sign" in text and "needs lead" in text
    signed = await juno.ok("update_task", task_id=styles["id"], status="sign")
    assert signed["state"] == "assigned" and signed["commit"]
    text = await juno.refused("update_task", "dual-sign", task_id=styles["id"], status="sign")
    await kai.refused("update_task", "dual-sign", task_id=styles["id"], status="in_progress")
    await lin.ok("update_task", task_id=int(styles["id"]), status="sign")
    started = await kai.ok("update_task", task_id=styles["id"], status="in_progress")
    assert started["state"] == "in_progress"
    assert (await kai.ok("update_task", task_id=styles["id"], status="renew"))["state"] == \
        "in_progress"

    # --- a dependency completed: the task that waited on it is ready --------------------
    mine = await spartan.ok("claim_task")
    assert mine["id"] == schema["id"] and mine["assignee"] == "core/spartan"
    await spartan.ok("update_task", task_id=schema["id"], status="in_progress")
    await spartan.ok("submit_for_review", task_id=schema["id"], summary="tables")
    await juno.ok("approve_task", task_id=schema["id"])
    board = {t["id"]: t for t in (await spartan.ok("list_tasks", ready=True))["tasks"]}
    assert list(board) == [api["id"]] and board[api["id"]]["waiting_on"] == []
    assert (await spartan.ok("claim_task", task_id=api["id"]))["assignee"] == "core/spartan"
    who = {a["agent"]: a for a in (await juno.ok("who"))["agents"]}
    assert who["core/spartan"]["tasks"] == [api["id"]]
    assert who["core/spartan"]["last_claimed"] == api["id"]
    assert who["core/spartan"]["last_completed"] == schema["id"]
    assert who["web/kai"]["tasks"] == [styles["id"]]

    # --- path leases ---------------------------------------------------------------------
    assert (await kai.ok("path_lease"))["leases"] == []
    took = await spartan.ok("path_lease", action="take", glob="src/api/**", ttl_seconds=600)
    lease = took["leases"][0]
    assert (lease["holder"], lease["glob"], lease["mode"]) == \
        ("core/spartan", "src/api/**", "exclusive") and took["commit"]
    assert 0 < lease["left"] <= 600 and lease["until"] > 0
    text = await kai.refused("path_lease", "lease-conflict", action="take", glob="src/**")
    assert "held (exclusive) by core/spartan" in no_cli(text) and lease["id"] in text
    await kai.refused("path_lease", "lease-conflict", action="take", glob="src/api/x.py",
                      shared=True)
    shared = (await kai.ok("path_lease", action="take", glob="docs/**", shared="true"))
    assert shared["leases"][0]["mode"] == "shared"
    await spartan.ok("path_lease", action="take", glob="docs/*.md", shared=True)
    listed = (await juno.ok("path_lease", action="list"))["leases"]
    assert [(x["glob"], x["holder"]) for x in listed] == \
        [("docs/**", "web/kai"), ("docs/*.md", "core/spartan"), ("src/api/**", "core/spartan")]
    text = await kai.refused("path_lease", "not-found", action="release", glob="src/api/**")
    assert "path_lease list" in no_cli(text)
    gone = await spartan.ok("path_lease", action="release", glob="src/api/**")
    assert gone["leases"][0]["id"] == lease["id"] and gone["commit"]
    await kai.ok("path_lease", action="release", glob=shared["leases"][0]["id"])
    assert [x["glob"] for x in (await kai.ok("path_lease"))["leases"]] == ["docs/*.md"]
    r = await kai.call("path_lease", action="steal", glob="x")
    assert r.is_error and "use take, release or list" in r.content[0].text

    # --- the caller's name: not listed for a bound session, still taken ----------------------
    listed = {t.name: t.input_schema["properties"] for t in
              (await kai.client.list_tools()).tools}
    assert "agent_name" not in listed["check_inbox"] and "from_agent" not in listed["send"]
    assert "creator" not in listed["create_task"] and "agent_name" in listed["register"]
    assert (await kai.ok("ping", agent_name="kai"))["agent"] == "web/kai"
    await kai.ok("check_inbox", agent_name="web/kai")
    await kai.refused("set_status", "identity", status="x", agent_name="core/spartan")


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_work_over_http(hub, mode):
    setup_room(hub)
    minted = {agent: tokens.mint(hub.path, agent) for agent in AGENTS}
    with http_server(hub.path) as url:
        async with contextlib.AsyncExitStack() as stack:
            agents = [await stack.enter_async_context(http_agent(url, agent, mode, token))
                      for agent, token in minted.items()]
            await scenario(*agents)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_work_over_stdio(hub, mode):
    setup_room(hub)
    async with together(*(stdio_agent(hub.path, agent, mode) for agent in AGENTS)) as agents:
        await scenario(*agents)


async def test_the_agent_profile_does_the_work(hub):
    """A coder with the default profile: claim_task without an id, sign is refused to a
    non-lead, path_lease is there."""
    lobby = setup_room(hub)
    lobby.create_task("core/juno", "Ready one", requires=["python"])
    async with stdio_agent(hub.path, "core/spartan", "auto", tools="agent") as spartan:
        names = {t.name for t in (await spartan.client.list_tools()).tools}
        assert {"path_lease", "claim_task", "list_tasks", "update_task"} <= names
        assert names == set(mcp_tools.tools_for("agent"))
        got = await spartan.ok("claim_task")
        assert got["title"] == "Ready one" and got["assignee"] == "core/spartan"
        await spartan.refused("update_task", "task-state-machine", task_id=got["id"],
                              status="sign")


def test_refusal_hints_name_the_tools():
    from gitdrop.errors import Refusal
    for fix, want in (
            ("ask core/juno, web/lin to sign it (gitdrop task sign 12)",
             "update_task(task_id=12, status='sign')"),
            ("take a ready task instead (gitdrop ready)", "claim_task without task_id"),
            ("try again (gitdrop ready --claim)", "try again (claim_task without task_id)"),
            ("set lease_until at most 60s ahead (gitdrop task renew ID --for SECONDS)",
             "update_task(status='renew')"),
            ("take it for at most 60s (gitdrop lease take GLOB --ttl ...) and renew it",
             "path_lease(action='take', ttl_seconds=...)"),
            ("release one by its id (gitdrop lease list)", "path_lease(action='list')"),
            ("list only existing tasks in after, with no cycle (gitdrop task graph shows "
             "the graph)", "list_tasks shows each task's after"),
            ("wait, or take a narrower glob (or --shared)", "(or shared=true)"),
            ("submit it for review (gitdrop task submit 7)",
             "submit_for_review(task_id=7, summary=...)"),
            ("fail it instead (gitdrop task fail 7 --reason ...)",
             "update_task(task_id=7, status='failed', result=...)")):
        text = mcp_tools.render_error(Refusal("some-rule", "why", fix))
        assert want in text and "gitdrop " not in text, text
