"""The README's commands, run as written (bash, a temp hub through GITDROP_HUB).

In the tour, `# exit N` after a command is the exit code it must have (0 otherwise) and
`# prints X` what it must print on stdout."""

import os
import re
import shlex
import subprocess
import sys

from gitdrop import hub as hubmod
from gitdrop import model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
TOUR_FROM, TOUR_TO = "## Five-minute tour", "## Exit codes"


def readme() -> str:
    with open(README, encoding="utf-8") as f:
        return f.read()


def blocks(text: str) -> list[str]:
    return re.findall(r"```sh\n(.*?)```", text, re.S)


def statements(block: str) -> list[str]:
    """Shell statements: a line, a heredoc with its body, or `\\`-continued lines."""
    out, lines, i = [], block.splitlines(), 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = re.search(r"<<'?(\w+)'?", line)
        if m:
            body = [line]
            while lines[i] != m.group(1):
                body.append(lines[i])
                i += 1
            body.append(lines[i])
            i += 1
            out.append("\n".join(body))
            continue
        while line.endswith("\\"):
            line = line[:-1] + lines[i]
            i += 1
        out.append(line)
    return out


def expectation(stmt: str) -> tuple[int, str | None]:
    first = stmt.splitlines()[0]
    m = re.search(r"#\s*exit (\d+)", first)
    p = re.search(r"#\s*prints (\S+)", first)
    return (int(m.group(1)) if m else 0), (p.group(1) if p else None)


def checked(stmt: str, where: str) -> str:
    """`stmt` in bash, followed by the check of its exit code (and of what it
    prints, where the block says so); `where` names it in the failure."""
    rc, prints = expectation(stmt)
    first = shlex.quote(stmt.splitlines()[0])
    if prints is None:
        out = [f"{stmt}\nrc=$?"]
    else:
        out = [f"got=$(\n{stmt}\n)\nrc=$?\n"
               f"[ \"$got\" = {shlex.quote(prints)} ] || {{ echo \"{where} printed $got, "
               f"not {prints}: \"{first} >&2; exit 98; }}"]
    out.append(f"[ $rc -eq {rc} ] || {{ echo \"{where} exited $rc, not {rc}: \"{first} >&2; "
               "exit 99; }")
    return "\n".join(out)


def script(stmts: list[str]) -> str:
    """One bash session; each statement is checked right after it runs."""
    return "\n".join(checked(s, f"README step {n}") for n, s in enumerate(stmts)) + \
        "\necho README-TOUR-DONE\n"


def test_readme_opens_with_the_two_setup_commands():
    text = readme()
    intro, _ = text.split(TOUR_FROM, 1)
    demo, tests = blocks(intro)[:2]
    assert demo.strip().endswith("gitdrop demo") and "pip install -e ." in demo
    assert "'.[dev]'" in tests and tests.strip().endswith("-m pytest")
    assert len(demo.strip().splitlines()) == 1 and len(tests.strip().splitlines()) == 1
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        ci = f.read()
    assert "-m pytest" in ci and ".[dev]" in ci  # CI runs the README's test command


def test_readme_links_resolve():
    for link in re.findall(r"\]\(([^)#]+)\)", readme()):
        if not link.startswith("http"):
            assert os.path.exists(os.path.join(ROOT, link)), link


def test_readme_tour_runs_as_written(tmp_path):
    text = readme()
    tour = text.split(TOUR_FROM, 1)[1].split(TOUR_TO, 1)[0]
    stmts = [s for b in blocks(tour) for s in statements(b)]
    assert len(stmts) > 30
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    hub_path = str(tmp_path / "hub.git")
    env = {k: v for k, v in os.environ.items()
           if k not in ("GITDROP_AGENT", "GITDROP_ROOM", "NO_COLOR", "FORCE_COLOR")}
    env.update(HOME=str(home), GITDROP_HUB=hub_path, GIT_TERMINAL_PROMPT="0",
               PATH=os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""))
    p = subprocess.run(["bash", "-c", script(stmts)], cwd=work, env=env, capture_output=True,
                       text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert p.returncode == 0 and "README-TOUR-DONE" in p.stdout, p.stderr[-3000:]
    # and the hub holds what the tour says
    room = hubmod.Hub(hub_path).room("lobby")
    states = {t["id"]: t["state"] for t in room.list_tasks(include_done=True)}
    assert states == {"1": "completed", "2": "in_progress", "3": "assigned", "4": "pending",
                      "5": "completed", "6": "completed", "7": "pending", "8": "pending"}
    assert room.task("6")["note"] == "Users want search, export, dark mode"
    assert room.task("6")["assignee"] == "core/scribe"
    assert room.task("3")["assignee"] == "core/lee" and room.task("4")["after"] == ["3"]
    assert room.handshake(1)["status"] == "go"
    assert room.contract("api.users")["version"] == 2
    assert room.task("8")["creator"] == "core/juno"
    assert "refused by rule unread-before-send" in p.stderr
    assert "handshake-go" in p.stderr and "task-state-machine" in p.stderr
    assert "task-dependency" in p.stderr
    assert (work / "lobby" / model.task_path(8)).exists()
