"""A serving process keeps full garbage collections short (gitdrop.pauses): what
survived one is out of the next one's walk, and once an interval everything is
walked again, so garbage cycles among the survivors are still freed. Run in a
fresh interpreter: the collector's state is per process."""

import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = textwrap.dedent("""
    import gc, weakref
    from gitdrop import pauses

    now = [0.0]
    pauses.keep_short(interval=100, clock=lambda: now[0])
    cache = [{"commit": str(i), "to": [i]} for i in range(50000)]   # what a server keeps
    gc.collect()
    walked = len(gc.get_objects(generation=2))
    print("walked", walked, "frozen", gc.get_freeze_count())

    class Node:
        pass
    a, b = Node(), Node()
    a.other, b.other = b, a          # a cycle, alive for now
    gone = weakref.ref(a)
    gc.collect()                     # survives: out of the collector's sight
    del a, b
    gc.collect()
    print("cycle freed before the interval", gone() is None)
    now[0] = 101                     # the interval is over
    gc.collect()                     # gives everything back to the collector
    gc.collect()
    print("cycle freed after it", gone() is None)
    print("cache", len(cache))
""")


def test_survivors_leave_the_full_collections_walk_and_cycles_are_still_freed():
    p = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    lines = dict(line.split(" ", 1) for line in p.stdout.splitlines())
    walked, frozen = (int(x) for x in lines["walked"].replace("frozen ", "").split())
    assert frozen > 100000, lines       # the cache's 150,000 objects: frozen
    assert walked < 1000, lines         # and not walked by the next full collection
    assert "cycle freed before the interval False" in p.stdout   # frozen with the rest
    assert "cycle freed after it True" in p.stdout               # walked again, freed
