"""Per-agent bearer tokens for the MCP server over HTTP.

A token binds an HTTP caller to one agent (team/name) of a hub. Only its
sha256 is kept, in <hub>/gitdrop/tokens.json (mode 0600): inside the hub's git
directory but outside refs and objects, so no token is ever in history, in a
clone or in a push. Light to import: no pygit2, no mcp.
"""

import errno
import fcntl
import hashlib
import json
import os
import secrets
import time

from .errors import Damaged
from .files import NOFOLLOW, write_whole
from .model import check_agent_id

PREFIX = "gd_"


def _dir(hub_path: str) -> str:
    return os.path.join(os.path.abspath(os.path.expanduser(hub_path)), "gitdrop")


def path(hub_path: str) -> str:
    return os.path.join(_dir(hub_path), "tokens.json")


def digest(token: str) -> str:
    # Whatever bytes a login form sent: a token that is not UTF-8 is just not one.
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()


def _load(p: str) -> dict:
    try:
        fd = os.open(p, os.O_RDONLY | NOFOLLOW)
    except FileNotFoundError:
        return {}
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise
        raise Damaged(f"{p} is a symbolic link, which gitdrop does not follow",
                      f"remove it (rm {p}), then mint the agents' tokens again "
                      "(gitdrop token AGENT)") from None
    with os.fdopen(fd, encoding="utf-8", errors="replace") as f:
        try:
            data = json.load(f)
        except ValueError:
            raise Damaged(f"{p} is not the token file gitdrop writes",
                          f"move it aside (mv {p} {p}.bad), then mint the agents' tokens "
                          "again (gitdrop token AGENT)") from None
    return data.get("agents", {}) if isinstance(data, dict) else {}


class _Locked:
    """An exclusive lock on the token file's directory, for read-modify-write."""

    def __init__(self, hub_path: str):
        os.makedirs(_dir(hub_path), mode=0o700, exist_ok=True)
        self.fd = os.open(os.path.join(_dir(hub_path), "tokens.lock"),
                          os.O_CREAT | os.O_RDWR | NOFOLLOW, 0o600)

    def __enter__(self):
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def _save(hub_path: str, agents: dict) -> None:
    write_whole(path(hub_path), json.dumps({"version": 1, "agents": agents}, indent=1,
                                           sort_keys=True).encode(), 0o600, exact=True, sync=True)


def mint(hub_path: str, agent_id: str) -> str:
    """A new token for `agent_id`; it replaces any earlier one (rotation)."""
    check_agent_id(agent_id)   # `gitdrop token list` minted one for an agent named "list"
    token = PREFIX + secrets.token_urlsafe(32)
    with _Locked(hub_path):
        agents = _load(path(hub_path))
        agents[agent_id] = {"sha256": digest(token), "created": int(time.time())}
        _save(hub_path, agents)
    return token


def revoke(hub_path: str, agent_id: str) -> bool:
    with _Locked(hub_path):
        agents = _load(path(hub_path))
        if agents.pop(agent_id, None) is None:
            return False
        _save(hub_path, agents)
    return True


def has(hub_path: str, agent_id: str) -> bool:
    return agent_id in _load(path(hub_path))


class Verifier:
    """Token → agent, re-reading the file only when it changed (a stat per call)."""

    def __init__(self, hub_path: str):
        self.path = path(hub_path)
        self._stamp = None
        self._by_hash: dict[str, str] = {}
        self._agents: dict[str, dict] = {}

    def _refresh(self) -> None:
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        except FileNotFoundError:
            stamp = None
        if stamp != self._stamp:
            self._agents = _load(self.path) if stamp else {}
            self._by_hash = {v.get("sha256", ""): k for k, v in self._agents.items()}
            self._stamp = stamp

    def agent(self, token: str) -> str:
        """The agent a token belongs to, or "" if it is no valid token."""
        if not token:
            return ""
        return self.holder(digest(token))

    def holder(self, sha: str) -> str:
        """The agent whose current token has this digest, or "" (rotated, revoked):
        what a session bound to a token checks without keeping the token."""
        self._refresh()
        return self._by_hash.get(sha, "") if sha else ""

    def has(self, agent_id: str) -> bool:
        self._refresh()
        return agent_id in self._agents
