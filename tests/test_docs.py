"""Every command README.md and docs/*.md show, run as shown.

Each ```sh block runs in bash in a directory of its own, with its own HOME and a fresh
hub there (GITDROP_HUB=~/.gitdrop/hub.git, made by `gitdrop init`), the venv's bin first
on PATH, and the little context its page assumes (PREAMBLES below: a registered lead, a
registered agent). As in tests/test_readme.py, `# exit N` after a command is the exit code
it must have (0 otherwise) and `# prints X` what it must print. README's tour is one story
from the first block to the last, so tests/test_readme.py runs it, whole and in order.

A block that cannot run here (it starts a server, needs another machine, installs
gitdrop) has `<!-- not run: why -->` on the line before it; each `gitdrop ...` (or
`python -m gitdrop...`) line in it runs with `--help` appended instead, which fails for a
command or an option that does not exist.

Beyond the blocks, every `gitdrop ...` the pages show, in a code span of the text, in a
table or in a synopsis (`gitdrop wait [--timeout S]`), must name commands that exist and
options those commands take (but for a command shown with `# exit 2`, a usage error on
purpose); and every file of the repository, Python name and git setting
(`gitdrop.idleArchiveDays`) the pages name must be there."""

import concurrent.futures
import glob
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from test_readme import TOUR_FROM, TOUR_TO, checked, statements

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ["README.md"] + sorted(os.path.relpath(p, ROOT)
                               for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
BIN = os.path.dirname(sys.executable)

# The context a page's blocks assume, run before each of its blocks (after `gitdrop init`).
PREAMBLES = {
    # the loop guard's settings are changed by a lead of the room: a closed one's (an
    # open room's, such as the lobby, are the operator's)
    "docs/HUB.md": """
        gitdrop register core/juno --role lead
        gitdrop room create proj --team core >/dev/null
        export GITDROP_AGENT=core/juno GITDROP_ROOM=proj
    """,
    # the hand-written task is committed as a registered agent
    "docs/PROTOCOL.md": "gitdrop register core/spartan --role coder",
}
MAX_NOT_RUN = 10   # blocks marked not run, all pages together: keep it small

FENCE = re.compile(r"^( *)```(\w*)\n(.*?)^\1```[ \t]*$", re.M | re.S)
NOT_RUN = re.compile(r"<!--\s*not run:\s*(.+?)\s*-->")


def read(page: str) -> str:
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        return f.read()


def fenced(page: str):
    """(line, language, body, not-run reason or None) of each fenced block."""
    text = read(page)
    out = []
    for m in FENCE.finditer(text):
        indent = len(m.group(1))
        body = "\n".join(ln[indent:] for ln in m.group(3).splitlines()) + "\n"
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        reason = NOT_RUN.search(before)
        out.append((text.count("\n", 0, m.start()) + 1, m.group(2), body,
                    reason.group(1) if reason else None))
    return out


def in_tour(page: str, line: int) -> bool:
    if page != "README.md":
        return False
    text = read(page)
    start = text.count("\n", 0, text.index(TOUR_FROM)) + 1
    end = text.count("\n", 0, text.index(TOUR_TO)) + 1
    return start < line < end


def sh_blocks():
    return [(page, line, body, reason) for page in PAGES
            for line, lang, body, reason in fenced(page) if lang == "sh"]


def runnable():
    return [pytest.param(page, line, body, id=f"{page}:{line}")
            for page, line, body, reason in sh_blocks()
            if reason is None and not in_tour(page, line)]


def environment(home: str) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("GITDROP_") and k not in ("NO_COLOR", "FORCE_COLOR")}
    env.update(HOME=home, GITDROP_HUB=os.path.join(home, ".gitdrop", "hub.git"),
               GIT_TERMINAL_PROMPT="0", GIT_CONFIG_NOSYSTEM="1", NO_COLOR="1",
               COLUMNS="200", PATH=BIN + os.pathsep + env.get("PATH", ""))
    return env


def block_script(page: str, line: int, body: str) -> str:
    where = f"{page}:{line}"
    out = ["gitdrop init >/dev/null || { echo 'gitdrop init failed' >&2; exit 97; }"]
    for pre in PREAMBLES.get(page, "").strip().splitlines():
        pre = pre.strip()
        out.append(f"{pre} >/dev/null || {{ echo {shlex.quote('preamble failed: ' + pre)} "
                   f">&2; exit 97; }}")
    for n, s in enumerate(statements(body)):
        out.append(checked(s, f"{where} command {n + 1}"))
    return "\n".join(out) + "\necho DOCS-BLOCK-DONE\n"


@pytest.mark.parametrize("page,line,body", runnable())
def test_block_runs_as_shown(page, line, body, tmp_path):
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    p = subprocess.run(["bash", "-c", block_script(page, line, body)], cwd=work,
                       env=environment(str(home)), capture_output=True, text=True,
                       timeout=120, stdin=subprocess.DEVNULL)
    assert p.returncode == 0 and "DOCS-BLOCK-DONE" in p.stdout, \
        f"{page}:{line}\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"


def test_few_blocks_are_not_run_and_each_says_why():
    skipped = [(page, line, reason) for page, line, _, reason in sh_blocks() if reason]
    assert len(skipped) <= MAX_NOT_RUN, skipped
    assert all(len(reason) > 5 for _, _, reason in skipped)
    # a marker is for the block right below it: none stray, none before another kind
    marked = {(page, line) for page, line, _ in skipped}
    for page in PAGES:
        text = read(page)
        for m in NOT_RUN.finditer(text):
            after = text.count("\n", 0, m.end()) + 2
            assert (page, after) in marked, f"{page}: a not-run mark not right above a sh block"
    # and most blocks do run
    assert len(runnable()) >= 5


# --- every gitdrop command line the pages show --------------------------------

CMD_WORD = re.compile(r"^(?:\S*/)?gitdrop$")
PYTHON = re.compile(r"^(?:\S*/)?python3?$")


def invocations(text: str) -> list[list[str]]:
    """The gitdrop commands in a line of shell or a code span, each as its words
    (`gitdrop` or `python -m gitdrop.x` first), up to the end of the command."""
    if "\\|" in text or "(--" in text:   # a synopsis: (--text TEXT \\| --file F)
        text = text.replace("\\|", " ").replace("(", " ").replace(")", " ")
    if re.search(r"\[|…|\.\.\.", text):   # optional parts and repeats of a synopsis
        text = re.sub(r"[\[\]]|…|\.\.\.", " ", text)
    lex = shlex.shlex(text, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    try:
        words = list(lex)
    except ValueError:
        words = text.split()
    punct = re.compile(r"^[;&|()<>]+$")
    found, i, start = [], 0, True
    while i < len(words):
        w = words[i]
        if punct.match(w):
            start = True
        elif start and w == "sudo":
            i += 1
            while i < len(words) and words[i].startswith("-"):
                i += 2 if words[i] == "-u" else 1
            continue
        elif start and (re.match(r"^\w+=", w) or w in ("exec", "time", "env")):
            pass   # an assignment or a wrapper: the command is still to come
        elif start and CMD_WORD.match(w):
            end = next((j for j in range(i + 1, len(words)) if punct.match(words[j])),
                       len(words))
            found.append(["gitdrop"] + words[i + 1:end])
            i, start = end, True
            continue
        elif start and PYTHON.match(w) and words[i + 1:i + 2] == ["-m"] \
                and i + 2 < len(words) and re.match(r"^gitdrop(\.|$)", words[i + 2]):
            end = next((j for j in range(i + 3, len(words)) if punct.match(words[j])),
                       len(words))
            mod = words[i + 2]
            head = ["gitdrop"] if mod == "gitdrop" else ["python", "-m", mod]
            found.append(head + words[i + 3:end])
            i, start = end, True
            continue
        else:
            start = False
        i += 1
    return [f for f in found if len(f) > (1 if f[0] == "gitdrop" else 2)]


def shown_commands() -> list[tuple[str, list[str]]]:
    """(where, words) of every command the pages show: lines of fenced blocks of any
    kind (shell, synopses) and code spans of the text and tables."""
    out = []
    for page in PAGES:
        text = read(page)
        for line, lang, body, _ in fenced(page):
            if lang in ("toml", "json", "markdown", "python"):
                continue
            for n, ln in enumerate(body.splitlines()):
                if lang == "sh" and re.search(r"#\s*exit 2\b", ln):
                    continue   # a usage error on purpose, run as such where it runs
                for words in invocations(ln):
                    out.append((f"{page}:{line + 1 + n}", words))
        prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
        for m in re.finditer(r"(?<!`)`([^`\n]+)`(?!`)", prose):
            for words in invocations(m.group(1)):
                out.append((f"{page}:{prose.count(chr(10), 0, m.start()) + 1}", words))
    return out


def run_help(words: tuple, env: dict) -> tuple[int, str]:
    argv = list(words) + ["--help"]
    argv[0] = sys.executable if argv[0] == "python" else os.path.join(BIN, "gitdrop")
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL)
    return p.returncode, p.stdout + p.stderr


GROUP = r"Usage: .*\bCOMMAND\b"       # a group's help: it lists commands
LISTED = r"^│ ([a-z][\w-]*) "          # a command in that list

# Every command's --help, in one process: the `gitdrop` console script's own entry point
# called as `gitdrop PATH --help` for the whole tree of commands.
TREE = r"""
import contextlib, io, json, re, sys
from importlib.metadata import entry_points
main = next(iter(entry_points(group="console_scripts", name="gitdrop"))).load()
group, listed = re.compile(sys.argv[1], re.M), re.compile(sys.argv[2], re.M)
tree, todo = {}, [[]]
while todo:
    path = todo.pop(0)
    out, code = io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            main(path + ["--help"])
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else int(e.code is not None)
    tree[" ".join(path)] = [code, out.getvalue()]
    if code == 0 and group.search(out.getvalue()):
        todo += [path + [name] for name in listed.findall(out.getvalue())]
json.dump(tree, sys.stdout)
"""


class Helps:
    """The --help of every gitdrop command, and of each `python -m gitdrop.x` shown."""

    def __init__(self, env, modules=()):
        self.env = env
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            tree = pool.submit(subprocess.run, [sys.executable, "-c", TREE, GROUP, LISTED],
                               env=env, capture_output=True, text=True, timeout=120)
            mods = {m: pool.submit(run_help, m, env) for m in set(modules)}
            p = tree.result()
            assert p.returncode == 0, p.stderr[-3000:]
            self.cache = {tuple(["gitdrop"] + k.split()): tuple(v)
                          for k, v in json.loads(p.stdout).items()}
            self.cache.update((m, f.result()) for m, f in mods.items())
        assert len(self.cache) > 40, sorted(self.cache)   # the tree was walked

    def get(self, path: tuple) -> tuple[int, str]:
        if path not in self.cache:
            self.cache[path] = run_help(path, self.env)
        return self.cache[path]


def subcommands(help_text: str) -> set[str] | None:
    """The commands a group's help lists, or None when it is not a group."""
    if not re.search(GROUP, help_text, re.M):
        return None
    return set(re.findall(LISTED, help_text, re.M))


def options(help_text: str) -> set[str]:
    found = set()
    for opt in re.findall(r"(?<![\w/.-])(--?[a-zA-Z][\w-]*(?:/--?[a-zA-Z][\w-]*)?)",
                          help_text):
        found.update(opt.split("/"))
    return found


def is_option(word: str) -> bool:
    return len(word) > 1 and word.startswith("-") and not re.match(r"^-\d", word)


def check(words: list[str], helps: Helps) -> str | None:
    """Why a shown command is wrong, or None."""
    if words[0] == "python":
        rc, text = helps.get(tuple(words[:3]))
        if rc != 0:
            return f"`{' '.join(words[:3])} --help` exited {rc}: {text.strip()[-300:]}"
        bad = [w.split("=")[0] for w in words[3:]
               if is_option(w) and w.split("=")[0] not in options(text)]
        return f"no option {', '.join(bad)}" if bad else None
    path, rest, i, got_command = ["gitdrop"], words[1:], 0, False
    rc, text = helps.get(("gitdrop",))
    assert rc == 0, text
    pending = []
    while i < len(rest):
        w = rest[i]
        if w == "--":   # what follows is another program's command line
            break
        subs = subcommands(text)
        if is_option(w):
            pending.append(w.split("=")[0])
        elif subs is not None:
            if w in subs:
                bad = [o for o in pending if o not in options(text)]
                if bad:
                    return f"`{' '.join(path)}` has no option {', '.join(bad)}"
                pending, path = [], path + [w]
                got_command = True
                rc, text = helps.get(tuple(path))
                if rc != 0:
                    return f"`{' '.join(path)} --help` exited {rc}: {text.strip()[-300:]}"
            elif not (i > 0 and is_option(rest[i - 1])):   # else: that option's value
                return f"`{' '.join(path)}` has no command {w!r}"
        i += 1
    if subcommands(text) is not None and got_command:
        return f"`{' '.join(path)}` needs a command"
    bad = [o for o in pending if o not in options(text)]
    if bad:
        return f"`{' '.join(path)}` has no option {', '.join(bad)}"
    return None


@pytest.fixture(scope="module")
def helps(tmp_path_factory):
    return Helps(environment(str(tmp_path_factory.mktemp("home"))),
                 [tuple(words[:3]) for _, words in shown_commands() if words[0] == "python"])


def test_every_shown_command_exists_with_its_options(helps):
    shown = shown_commands()
    assert len(shown) > 100   # the pages do show that many
    wrong = [f"{where}: {' '.join(words)}\n    {why}" for where, words in shown
             if (why := check(words, helps))]
    assert not wrong, "commands the docs show that do not exist:\n" + "\n".join(wrong)


def test_not_run_blocks_parse_with_help(tmp_path):
    """What a block that cannot run would run, with --help: the commands and options
    exist (a renamed option fails here, even where the block cannot run)."""
    env = environment(str(tmp_path))
    lines = []
    for page, line, body, reason in sh_blocks():
        if reason is None:
            continue
        for n, ln in enumerate(body.splitlines()):
            for words in invocations(ln):
                lines.append((f"{page}:{line + 1 + n}", tuple(words)))
    assert lines
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda lw: run_help(lw[1], env), lines))
    wrong = [f"{where}: {' '.join(words)} --help exited {rc}: {out.strip()[-300:]}"
             for (where, words), (rc, out) in zip(lines, results) if rc != 0]
    assert not wrong, "\n".join(wrong)


def test_the_checker_catches_what_it_is_for(helps):
    assert check(["gitdrop", "task", "create", "X", "--assign", "a"], helps) is None
    assert check(["gitdrop", "--as", "spartan", "task", "start", "2"], helps) is None
    assert check(["gitdrop", "task", "create", "X", "--assignee", "a"], helps)
    assert check(["gitdrop", "task", "creat", "X"], helps)
    assert check(["gitdrop", "--as", "juno", "tasks", "list"], helps)
    assert invocations("id=$(gitdrop task create \"Write the docs\")   # the new id") == \
        [["gitdrop", "task", "create", "Write the docs"]]
    assert invocations("sudo -u gitdrop gitdrop init /srv/hub.git") == \
        [["gitdrop", "init", "/srv/hub.git"]]
    assert invocations("gitdrop handshake start (--plan TEXT \\| --plan-file F) [--to A]...") \
        == [["gitdrop", "handshake", "start", "--plan", "TEXT", "--plan-file", "F",
             "--to", "A"]]
    assert invocations("the gitdrop command, gitdrop-shell, gitdrop: refused") == []


# --- every file, module and setting the pages name --------------------------------

def code_spans(page: str) -> list[tuple[int, str]]:
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), read(page))
    return [(text.count("\n", 0, m.start()) + 1, m.group(1))
            for m in re.finditer(r"(?<!`)`([^`\n]+)`(?!`)", text)]


def source_text() -> str:
    out = []
    for path in glob.glob(os.path.join(ROOT, "gitdrop", "**", "*.py"), recursive=True):
        with open(path, encoding="utf-8") as f:
            out.append(f.read())
    return "\n".join(out).lower()


def resolves(name: str) -> bool:
    """`gitdrop.x.y` is a module, or an attribute of one."""
    import importlib
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:n]))
        except ImportError:
            continue
        for attr in parts[n:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_files_modules_and_settings_the_pages_name_exist():
    """A path of this repository (`gitdrop/core.py`, `templates/claude-code/`), a file
    name (`rules.py`), a Python name (`gitdrop.opener.open_hub`) or a git setting
    (`gitdrop.idleArchiveDays`) in a page's text must be there; links must resolve."""
    source = source_text()
    files = set()
    for top, dirs, names in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d != "node_modules"]
        files.update(n for n in names if n.endswith(".py"))
    wrong = []
    for page in PAGES:
        for line, span in code_spans(page):
            where = f"{page}:{line}: `{span}`"
            span = re.sub(r"\(.*\)$", "", span.split("::")[0])
            if re.match(r"^(gitdrop|tests|bench|templates|docs|\.ci)/[\w./-]*$", span):
                if not os.path.exists(os.path.join(ROOT, span)):
                    wrong.append(f"{where}: no such file")
            elif re.match(r"^[\w-]+\.py$", span):
                if span not in files:
                    wrong.append(f"{where}: no such file")
            elif re.match(r"^gitdrop(\.\w+)+$", span):
                key = span.split(".")
                setting = f'"{span.lower()}"' in source or (
                    len(key) == 2 and key[1] != key[1].lower()
                    and f'"{key[1].lower()}"' in source)   # read as [gitdrop] key
                if not setting and not resolves(span):
                    wrong.append(f"{where}: neither a Python name nor a setting gitdrop reads")
        for link in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", read(page)):
            if not re.match(r"^[a-z]+:", link):
                if not os.path.exists(os.path.join(ROOT, os.path.dirname(page), link)):
                    wrong.append(f"{page}: a link to {link}, which is not there")
    assert not wrong, "\n".join(wrong)
