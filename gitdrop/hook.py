"""The pre-receive hook: every pushed commit goes through the same rules as a
write from the CLI or MCP server. Refusing here leaves no trace (quarantine)."""

import os
import sys
import time

from . import model, wal
from .catfile import CatFile
from .layout import old_rooms, upgrade_on_push
from .errors import GitdropError, Refusal
from .verify import check_commits


# Where a server puts the user it authenticated, most trusted first. gitdrop's own
# servers (gitdrop-shell, gitdrop http) drop all of them from what they pass on and set
# their own, so a client cannot bring one along.
IDENTITY_VARS = ("GL_USER", "GITDROP_PUSHER", "REMOTE_USER")


def agent_for_login(login: str) -> str:
    """gitolite user names cannot hold a "/": `team+name` is agent team/name ("+" is in
    no gitdrop name, so the map is one-to-one). A plain agent id passes as it is."""
    return login.replace("+", "/", 1) if login.count("+") == 1 else login


def pusher() -> str:
    """The identity the transport authenticated: gitolite (GL_USER), gitdrop-shell
    (SSH) or HTTP auth. gitolite sets GL_USER itself from its key file, so nothing a
    client sends (an accepted SSH variable, a push option) can stand in for it."""
    if "GL_USER" in os.environ:
        login = os.environ["GL_USER"]
        agent = agent_for_login(login)
        if not model.is_agent_id(agent):
            raise Refusal("authenticated-pusher", f"the gitolite user {login!r} is not an "
                          "agent: only keys named team+name.pub push to a gitdrop hub",
                          "ask the gitolite admin for a key named after your agent, e.g. "
                          "keydir/core+juno.pub for core/juno (see docs/HOSTING.md)")
        return agent
    who = os.environ.get("GITDROP_PUSHER") or os.environ.get("REMOTE_USER", "")
    if not who and os.environ.get("GATEWAY_INTERFACE"):
        # A web server ran git http-backend for a push nobody logged in for: without
        # a pusher the hook checks no identity (as for a local push), so anyone who
        # reached the URL would write as anyone, the hub's operator included.
        raise Refusal("authenticated-pusher", "this push came over HTTP without a login "
                      "(the web server set no REMOTE_USER)",
                      "push with your agent's user name and password; the server must ask "
                      "for a login on every push (Require valid-user, see docs/HOSTING.md)")
    return who


MAX_PUSH_COMMITS = 10000


def max_push_commits(git_dir: str) -> int:
    """How many commits one push may bring, all refs together (git config
    gitdrop.maxPushCommits; 0 or a value that is no number: the default)."""
    value = wal.read_config(git_dir).get("gitdrop.maxpushcommits", "")
    try:
        return int(value) if int(value) > 0 else MAX_PUSH_COMMITS
    except ValueError:
        return MAX_PUSH_COMMITS


def main() -> int:
    updates = [line.split() for line in sys.stdin.read().splitlines() if line.strip()]
    reader = CatFile()
    now = int(time.time())
    git_dir = os.environ.get("GIT_DIR", ".")
    try:
        wal.ensure(git_dir)   # after a crash: the log first
        who = pusher()        # a login that is no agent is refused before anything moves
        old_layout = old_rooms(reader, updates)
        if old_layout:   # moved first; the push is then refused (fetch and push again)
            from .leanstore import LeanStore
            upgrade_on_push(LeanStore(git_dir), old_layout)
        # Each commit costs the hook a few milliseconds: one push of a hundred
        # thousand would hold the server for minutes.
        most = max_push_commits(git_dir)
        for old, new, ref in updates:
            most -= len(check_commits(reader, ref, old, new, now, who, most=most))
        for _old, _new, ref in updates:
            # git locks the refs once this hook has said yes; a lock a killed
            # process left would make it refuse: cleared if its owner is dead.
            if os.path.exists(os.path.join(git_dir, ref + ".lock")):
                wal.clear_lock(git_dir, ref)
    except GitdropError as e:   # a refusal, or a damaged hub file (what to do)
        sys.stderr.write(e.render() + "\n")
        return 1
    except Exception as e:  # a bug must not let a push through unchecked
        sys.stderr.write(f"gitdrop: the hook failed ({type(e).__name__}: {e}); push refused\n")
        return 1
    finally:
        reader.close()
    return 0
