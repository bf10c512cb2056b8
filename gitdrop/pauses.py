"""Short garbage-collector pauses for processes that serve for hours (`gitdrop serve`,
`gitdrop web`).

Such a process keeps caches of what it read (commits, parsed files, walk results):
10^5 objects and more. Python's full collection walks every one of them each time
(80-250 ms measured here), while the event loop answers nobody: under 30 agents it
was most of the slowest calls. Survivors of a full collection are moved out of the
collector's sight (gc.freeze), so the next one walks only what came since. Once an
interval they are given back (gc.unfreeze), so a cycle of garbage among them is
still collected, at the cost of one long pause an interval.
"""

import gc
import time

_STATE = {"on": False, "interval": 3600.0, "last": 0.0}


def keep_short(interval: float = 3600.0, clock=time.monotonic) -> None:
    """From now on in this process (idempotent)."""
    _STATE.update(interval=interval, last=clock(), clock=clock)
    if _STATE["on"]:
        return
    _STATE["on"] = True
    gc.collect()
    gc.freeze()   # what start-up made (modules, the app) is never garbage
    gc.callbacks.append(_after)


def _after(phase: str, info: dict) -> None:
    if phase != "stop" or info.get("generation") != 2:
        return
    now = _STATE["clock"]()
    if now - _STATE["last"] >= _STATE["interval"]:
        _STATE["last"] = now
        gc.unfreeze()   # the next full collection walks everything once
    else:
        gc.freeze()
