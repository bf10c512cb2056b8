"""The lease guard: git hooks in the work repository (the project the agents edit)
that refuse a commit, or a push, touching a path another agent holds exclusively.

`gitdrop guard install` writes pre-commit and pre-push hooks that run
`python -m gitdrop.guard pre-commit|pre-push`. The guard reads the room's leases
from the hub: it fetches the room's branch into this repository's
refs/gitdrop/rooms/<room> and reads leases/*.toml there, so with the hub out of
reach it judges by the last fetched state. Who "I" am: GITDROP_AGENT, else the
agent written at install (git config gitdrop.agent); my own leases never block me.
Expiry is judged by this machine's clock (the hub judges leases by its own).

People bypass it with GITDROP_GUARD=off (or git commit --no-verify / git push
--no-verify).
"""

import os
import shlex
import subprocess
import sys
import time

from . import fmt, model
from .errors import UsageError

MARK = "# gitdrop guard hook"
HOOKS = ("pre-commit", "pre-push")
CACHE_PREFIX = "refs/gitdrop/rooms/"
BYPASS = "GITDROP_GUARD=off git commit ... (or git commit --no-verify)"


def _git(*args, cwd=None, check=True, timeout=None, stdin=None) -> str:
    env = dict(os.environ, GIT_TERMINAL_PROMPT="0")
    try:
        p = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, env=env,
                           timeout=timeout, input=stdin)
    except OSError as e:   # a --repo that is not there is a cwd git cannot enter
        if cwd is None or os.path.isdir(cwd):
            raise
        raise UsageError(f"no work repository at {cwd}: {e.strerror}",
                         "give --repo a git work tree (or run this inside one)") from None
    if check and p.returncode != 0:
        raise UsageError(f"git {' '.join(args[:3])} failed: {p.stderr.strip()[:300]}",
                         "run this inside a git work tree")
    return p.stdout


# --- globs --------------------------------------------------------------------

_TOKENS: dict = {}
_DIRS, _ANY, _STAR, _ONE = "**/", "**", "*", "?"


def _tokens(glob: str) -> list:
    got = _TOKENS.get(glob)
    if got is None:
        got, i = [], 0
        while i < len(glob):
            for wild in (_DIRS, _ANY, _STAR, _ONE):
                if glob.startswith(wild, i):
                    got.append(wild)
                    i += len(wild)
                    break
            else:
                got.append(glob[i])   # a literal character
                i += 1
        if len(_TOKENS) > 10000:
            _TOKENS.clear()
        _TOKENS[glob] = got
    return got


def matches(glob: str, path: str) -> bool:
    """Does a lease's glob cover `path`? '**' spans directories, '*' and '?' stay
    within one name, anything else is literal; a glob covers what it names and
    everything under it (so 'src/api' covers src/api/x.py).

    The glob is run as a set of positions over the path, one character at a time
    (time: path length × glob length). A backtracking regex took seconds on a
    lease like '**a**a**a**a**a**a**a**a**a**a**b', and every teammate's commit
    check (the guard) hung on it. Compared as a checkout on macOS or Windows would
    see them (model.path_fold): a lease on src/api covers src/API."""
    glob, path = model.path_fold(glob), model.path_fold(path)
    toks = _tokens(glob)
    end = len(toks)

    def close(states):   # every position reachable without reading a character
        out, todo = set(), list(states)
        while todo:
            i = todo.pop()
            if i in out:
                continue
            out.add(i)
            if isinstance(i, int) and i < end and toks[i] in (_DIRS, _ANY, _STAR):
                todo.append(i + 1)   # each may match nothing
        return out
    states = close({0})
    for ch in path:
        nxt = set()
        for i in states:
            if i == "under":   # past the glob's end and a '/': anything below it
                nxt.add("under")
            elif isinstance(i, tuple):   # inside a '**/': any characters up to a '/'
                nxt.add(i)
                if ch == "/":
                    nxt.add(i[1] + 1)
            elif i == end:
                if ch == "/":
                    nxt.add("under")
            else:
                t = toks[i]
                if t == _ANY:
                    nxt.add(i)
                elif t == _DIRS:
                    nxt.add(("dirs", i))
                    if ch == "/":
                        nxt.add(i + 1)
                elif t == _STAR:
                    if ch != "/":
                        nxt.add(i)
                elif t == _ONE:
                    if ch != "/":
                        nxt.add(i + 1)
                elif t == ch:
                    nxt.add(i + 1)
        if not nxt:
            return False
        states = close(nxt)
    return end in states or "under" in states


# --- the leases ---------------------------------------------------------------

# What install records in the work repository's git config (GITDROP_* override them).
CONFIG_KEYS = {"hub": "gitdrop.hub", "room": "gitdrop.room", "agent": "gitdrop.agent"}


def config(repo: str) -> dict:
    def get(key):
        return _git("config", "--get", CONFIG_KEYS[key], cwd=repo, check=False).strip()
    return {"hub": os.environ.get("GITDROP_HUB") or get("hub"),
            "room": os.environ.get("GITDROP_ROOM") or get("room") or "lobby",
            "agent": os.environ.get("GITDROP_AGENT") or get("agent")}


def refresh(repo: str, hub: str, room: str) -> bool:
    """Fetch the room's branch from the hub into the cache ref; False if unreachable."""
    if not hub:
        return False
    try:
        p = subprocess.run(["git", "fetch", "--quiet", "--no-tags", hub,
                            f"+{model.ROOM_PREFIX}{room}:{CACHE_PREFIX}{room}"],
                           cwd=repo, capture_output=True, text=True, timeout=20,
                           env=dict(os.environ, GIT_TERMINAL_PROMPT="0"))
    except (OSError, subprocess.TimeoutExpired):
        return False
    return p.returncode == 0


def cached_leases(repo: str, room: str) -> list[dict] | None:
    """The leases of the last fetched state of the room, or None if never fetched."""
    ref = CACHE_PREFIX + room
    if _git("rev-parse", "--verify", "--quiet", ref, cwd=repo, check=False).strip() == "":
        return None
    out = []
    listing = _git("ls-tree", "-z", f"{ref}:leases", cwd=repo, check=False)
    for entry in listing.split("\0"):
        if not entry or "\t" not in entry:
            continue
        name = entry.split("\t", 1)[1]
        if not name.endswith(".toml"):
            continue
        text = _git("cat-file", "blob", f"{ref}:leases/{name}", cwd=repo, check=False)
        try:
            lease = model.with_defaults("lease", fmt.loads_toml(text))
        except fmt.FormatError:
            continue
        if model.glob_problem(lease.get("glob")) == "" and isinstance(lease.get("until"), int):
            out.append(lease)
    return out


def blocking(paths, me: str, leases, now: int, links=frozenset()) -> list[tuple[str, dict]]:
    """(path, lease) for each path covered by a live exclusive lease not mine. A
    path in `links` is a submodule: moving it changes every file under it, so a
    lease on anything there covers it."""
    live = [x for x in leases if x["mode"] == "exclusive" and x["until"] > now
            and x["holder"] != me]
    out = []
    for p in paths:
        for lease in live:
            if matches(lease["glob"], p) or (p in links and model.globs_overlap(lease["glob"], p)):
                out.append((p, lease))
                break
    return out


def judge(repo: str, paths, what: str, links=frozenset()) -> int:
    """Print the refusal and return 1 if a path is held by someone else; else 0."""
    if os.environ.get("GITDROP_GUARD", "").lower() in ("off", "0", "no", "false"):
        return 0
    cfg = config(repo)
    fresh = refresh(repo, cfg["hub"], cfg["room"])
    leases = cached_leases(repo, cfg["room"])
    if leases is None:
        print(f"gitdrop guard: cannot read room {cfg['room']!r} from hub {cfg['hub']!r} and "
              "no copy was fetched before; not checking leases", file=sys.stderr)
        return 0
    hit = blocking(sorted(set(paths)), cfg["agent"], leases, int(time.time()), links)
    if not hit:
        if not fresh:   # said even when nothing is held: a lease taken since is not seen
            print(f"gitdrop guard: hub {cfg['hub']!r} is out of reach; judged by the room "
                  "as last fetched", file=sys.stderr)
        return 0
    print(f"gitdrop guard: this {what} touches paths another agent holds"
          + ("" if fresh else " (judged by the last fetched state of the room; the hub "
             "is out of reach)") + ":", file=sys.stderr)
    for p, x in hit[:20]:
        print(f"  {p}: lease {x['id']} on {x['glob']} held exclusively by {x['holder']} "
              f"until {fmt.stamp(x['until'])}", file=sys.stderr)
    if len(hit) > 20:
        print(f"  ... and {len(hit) - 20} more", file=sys.stderr)
    if not cfg["agent"]:
        print("  (I am nobody: set GITDROP_AGENT=team/name or gitdrop guard install --as)",
              file=sys.stderr)
    print("fix: leave those paths out, or ask the holder to release the lease "
          f"(gitdrop lease release ID); to bypass: {BYPASS}", file=sys.stderr)
    return 1


def staged_paths(repo: str) -> tuple[list[str], set[str]]:
    """The paths a commit would change, and which of them are submodules."""
    return _raw_paths(_git("diff", "--cached", "--raw", "--no-renames", "-z", cwd=repo))


def pushed_paths(repo: str, lines: str) -> tuple[list[str], set[str]]:
    """Paths changed by the commits a push sends (pre-push's standard input), and
    which of them are submodules. A merge counts the paths it changes itself (that
    differ from every parent: a conflict resolved, or an edit made in the merge);
    what it takes from a parent was judged with the commit that made it."""
    paths, links = [], set()
    for line in lines.splitlines():
        parts = line.split()
        if len(parts) != 4 or set(parts[1]) == {"0"}:
            continue   # malformed, or a deletion
        local, remote = parts[1], parts[3]
        known = set(remote) != {"0"} and subprocess.run(
            ["git", "cat-file", "-e", remote + "^{commit}"], cwd=repo,
            capture_output=True).returncode == 0
        rng = [f"{remote}..{local}"] if known else [local, "--not", "--remotes"]
        out = _git("log", "--format=", "--raw", "--no-renames", "-c", "-z", *rng, cwd=repo)
        mine, theirs = _raw_paths(out)
        paths += mine
        links |= theirs
    return paths, links


def _raw_paths(out: str) -> tuple[list[str], set[str]]:
    """The paths of `git log --raw -z` (or `git diff --raw -z`) output, and those that
    are a submodule on either side of a change (mode 160000: its removal or its
    replacement by a file too, which the pushed tip no longer shows). Read in order,
    a status then its path: a path that starts with ":" is not taken for a status."""
    paths, links, fields, i = [], set(), out.split("\0"), 0
    while i < len(fields) - 1:
        meta = fields[i].lstrip("\n")   # git log puts a newline between commits
        if not meta.startswith(":"):
            i += 1
            continue
        path, i = fields[i + 1], i + 2
        paths.append(path)
        colons = len(meta) - len(meta.lstrip(":"))
        if "160000" in meta.lstrip(":").split()[:colons + 1]:
            links.add(path)
    return paths, links


# --- install --------------------------------------------------------------------

def hook_text(kind: str) -> str:
    # -P: git runs the hook in the work tree, and `python -m` looks there first: a
    # gitdrop/guard.py (or a subprocess.py) committed to the project ran in its place.
    return (f"#!/bin/sh\n{MARK} ({kind}): refuses work on paths another agent leases\n"
            "# exclusively (gitdrop lease). Bypass: GITDROP_GUARD=off, or --no-verify.\n"
            'case "$GITDROP_GUARD" in off|OFF|0|no|false) exit 0;; esac\n'
            f"exec {shlex.quote(sys.executable)} -P -m gitdrop.guard {kind} \"$@\"\n")


def install(repo: str, hub: str = "", room: str = "", agent: str = "",
            force: bool = False) -> dict:
    """Write the hooks into the work repository at `repo` and record hub, room and
    agent in its git config; fetch the room once (the first cached copy)."""
    top = _git("rev-parse", "--show-toplevel", cwd=repo).strip()
    hooks = _git("rev-parse", "--git-path", "hooks", cwd=top).strip()
    hooks = os.path.join(top, hooks)
    os.makedirs(hooks, exist_ok=True)
    for kind in HOOKS:
        path = os.path.join(hooks, kind)
        if os.path.exists(path) and not force:
            with open(path, encoding="utf-8", errors="replace") as f:
                if MARK not in f.read():
                    raise UsageError(f"{path} exists and is not gitdrop's",
                                     "merge it by hand, or pass --force to replace it")
    for kind in HOOKS:
        path = os.path.join(hooks, kind)
        with open(path, "w", encoding="utf-8") as f:
            f.write(hook_text(kind))
        os.chmod(path, 0o755)
    if hub and "://" not in hub and ":" not in hub.split("/")[0]:
        hub = os.path.abspath(os.path.expanduser(hub))
    for key, value in (("hub", hub), ("room", room), ("agent", agent)):
        if value:
            _git("config", CONFIG_KEYS[key], value, cwd=top)
    cfg = config(top)
    fetched = refresh(top, cfg["hub"], cfg["room"])
    return {"repo": top, "hooks": [os.path.join(hooks, k) for k in HOOKS], "hub": cfg["hub"],
            "room": cfg["room"], "agent": cfg["agent"], "fetched": fetched}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    kind = argv[0] if argv else ""
    repo = os.getcwd()
    try:
        if kind == "pre-commit":
            paths, links = staged_paths(repo)
            return judge(repo, paths, "commit", links)
        if kind == "pre-push":
            paths, links = pushed_paths(repo, sys.stdin.read())
            return judge(repo, paths, "push", links)
    except UsageError as e:
        print(f"gitdrop guard: {e}", file=sys.stderr)
        return 1
    print("usage: python -m gitdrop.guard pre-commit|pre-push", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
