"""The hub's git hooks: written by `gitdrop init` with this interpreter and this
gitdrop baked in, and put back by a later gitdrop where another install's can no
longer serve (its gitdrop gone, or older than the layout a room was moved to)."""

import os
import sys

from . import files
from .errors import NotFound

HOOKS = ("pre-receive",)


def hooks_source() -> str:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    candidates = [os.path.join(here, "hooks"), os.path.join(os.path.dirname(__file__), "_hooks")]
    for c in candidates:
        if os.path.exists(os.path.join(c, "pre-receive")):
            return c
    raise NotFound("gitdrop's hook files are missing from this install", "reinstall gitdrop")


def _hook_text(name: str) -> str:
    """Hook `name` as this install writes it: this interpreter and this gitdrop."""
    with open(os.path.join(hooks_source(), name)) as f:
        text = f.read()
    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return text.replace("@PYTHON@", sys.executable).replace("@GITDROP_PATH@", pkg_parent)


def install_hooks(git_dir: str) -> None:
    """Write the hooks with this interpreter and this gitdrop baked in."""
    os.makedirs(os.path.join(git_dir, "hooks"), exist_ok=True)
    for name in HOOKS:
        files.write_whole(os.path.join(git_dir, "hooks", name), _hook_text(name).encode(),
                          0o755, exact=True)


HOOK_MARK = "installed by `gitdrop init`"   # a hook of gitdrop's, not a host's own


def hooks_elsewhere(git_dir: str) -> dict[str, str]:
    """The hub's gitdrop hooks that another install wrote, {name: why}: "gone" if what
    it runs is no longer there (every push is refused), else "other" (it runs that
    install's rules: after an upgrade into a new place, the old ones, which may not
    read what this one writes). A hook that is not gitdrop's is not ours to judge."""
    out = {}
    for name in HOOKS:
        try:
            with open(os.path.join(git_dir, "hooks", name)) as f:
                have = f.read(65536)
        except OSError:
            continue
        if HOOK_MARK not in have or have == _hook_text(name):
            continue
        lines = have.splitlines()
        python = lines[0][2:].split()[0] if lines and lines[0].startswith("#!") else ""
        where = next((ln.split('"')[1] for ln in lines if ln.startswith("sys.path.insert(0, \"")),
                     "")
        out[name] = "gone" if not (os.path.exists(python) and os.path.isdir(where)) else "other"
    return out


def refresh_hooks(git_dir: str, also_other: bool = False) -> list[str]:
    """Put this install's hooks in place of another's that can no longer run (or of any
    other's, `also_other`); the names replaced. Nothing where the hub is not ours to
    write (a reader)."""
    found = [n for n, why in hooks_elsewhere(git_dir).items() if also_other or why == "gone"]
    if found:
        try:
            install_hooks(git_dir)
        except OSError:
            return []
    return found
