"""gitdrop: git-native coordination for teams of AI agents."""

__version__ = "0.1.0"


def __getattr__(name):
    # gitdrop.Worker without importing the worker (and the core) for every command
    if name in ("Worker", "TaskContext"):
        from . import worker
        return getattr(worker, name)
    raise AttributeError(f"module 'gitdrop' has no attribute {name!r}")
