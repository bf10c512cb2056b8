"""Opening a hub: one function picks the backend for a path or a git URL, so every
face opens hubs the same way (and the core never imports a transport)."""

import os

from .core import default_hub
from .hub import Hub, init, no_hub
from .leanstore import is_hub

BUILTIN_HUB = "~/.gitdrop/hub.git"


def open_hub(path: str = "", create: bool = True) -> Hub:
    """The hub at a path, or behind a git URL (a RemoteHub: same interface). Only
    the built-in default (~/.gitdrop/hub.git) is created on first use; any other
    path must be a hub already (gitdrop init PATH makes one), so that a typo or a
    wrong folder is an error, and nothing is written there."""
    path = path or default_hub()
    from .transports.remote import RemoteHub, is_url   # only a git URL needs it
    if is_url(path):
        return RemoteHub(path)
    path = os.path.abspath(os.path.expanduser(path))
    if is_hub(path):
        return Hub(path)
    if create and path == os.path.abspath(os.path.expanduser(BUILTIN_HUB)) and not (
            os.path.exists(path) and os.listdir(path)):
        hub = init(path)
        import sys
        sys.stderr.write(f"gitdrop: made the default hub at {path} (its first use), with "
                         "room lobby; --hub or GITDROP_HUB names another\n")
        return hub
    raise no_hub(path)
