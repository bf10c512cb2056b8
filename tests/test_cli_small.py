"""The small things a newcomer trips over in the first hour, through the real `gitdrop`:
help that reads as help, a typo that is answered, NO_COLOR, refusals that come
before questions, a wait that says it timed out, progress on long work."""

import re

import pytest

from cli_helpers import Gitdrop
from gitdrop.cli.main import COMMANDS

GROUPS = {"task": ("create", "list", "show", "assign", "start", "sign"),
          "room": ("create", "list", "settings", "destroy", "join"),
          "team": ("create", "list"), "handshake": ("start", "ack", "status"),
          "contract": ("declare", "list", "show"), "context": ("set", "get")}


@pytest.fixture
def gd(hub, tmp_path):
    return Gitdrop(hub.path, str(tmp_path / "home"), agent="core/juno")


# --- help ----------------------------------------------------------------------------

def test_help_shows_metavars_not_python_types(gd):
    pages = [("--help",)] + [(c, "--help") for c in COMMANDS] + \
        [(g, s, "--help") for g, subs in GROUPS.items() for s in subs]
    for args in pages:
        out = gd.ok(*args, env={"COLUMNS": "200"}).out
        assert not re.search(r"<(bool|str|int|float|list)", out), (args, out)
        usage = next(x for x in out.splitlines() if "Usage:" in x)
        assert "{" not in usage, (args, usage)
    create = gd.ok("task", "create", "--help", env={"COLUMNS": "200"}).out
    assert "Usage: gitdrop task create [OPTIONS] TITLE" in create
    assert re.search(r"--priority\s+-p\s+N\s", create)
    assert re.search(r"--assign\s+-a\s+TEXT\s", create)
    inbox = gd.ok("inbox", "--help", env={"COLUMNS": "200"}).out
    assert re.search(r"--peek\s+Show", inbox)          # a flag: nothing between
    assert re.search(r"--json\s+Print", inbox)
    assert "gitdrop send [OPTIONS] TO..." in gd.ok("send", "--help").out
    assert "gitdrop init [OPTIONS] [PATH]" in gd.ok("init", "--help").out
    assert "[stdio|http]" in gd.ok("serve", "--help", env={"COLUMNS": "200"}).out


def test_a_mistyped_command_is_answered_with_the_closest(gd):
    r = gd("inbx")
    assert r.rc == 2 and "No such command 'inbx'. Did you mean 'inbox'?" in r.err, r
    assert "'history'" in gd("histroy").err
    r = gd("regster")
    assert "'register'" in r.err and r.rc == 2
    doc = gd("tsak", "--json").json
    assert doc["exit_code"] == 2 and "Did you mean 'task'?" in doc["reason"]
    r = gd("zzzzzz")
    assert r.rc == 2 and "No such command 'zzzzzz'." in r.err and "Did you mean" not in r.err
    assert "Did you mean 'list'?" in gd("task", "lst").err   # a group's own, as before
