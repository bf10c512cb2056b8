"""One core write (a send) and one read (an inbox peek that fetches) through the
remote hub client over each transport, beside the same calls on the hub itself.

    python bench/bench_transports.py              # 20 of each per transport
    python bench/bench_transports.py --ops 50 --no-ssh

Servers are the ones the tests start on 127.0.0.1 (tests/test_transports.py):
git daemon, python -m gitdrop.transports.httpd, and sshd with gitdrop-shell keys (one
multiplexed connection per agent). Each remote op is timed as a command runs
it: one `git fetch` into the mirror, then the verb; a send adds the local rules,
a CAS on the mirror and one `git push` that runs the hub's hook.
"""

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
import common  # noqa: E402
from common import Timer, ms, ratio  # noqa: E402

import test_transports as served  # noqa: E402  (the servers the tests use)
from gitdrop.transports.remote import RemoteHub  # noqa: E402

SENDER, READER = "core/juno", "core/spartan"


def run(t: Timer, label: str, hub, room: str, ops: int, warmup: int = 2) -> None:
    """Each op as one command would do it: one fetch (remote), then the verb."""
    r = hub.room(room)
    fetch = getattr(hub, "refresh", lambda: None)

    def send(i):
        fetch()
        r.send(SENDER, READER, f"message {i}")

    def peek():
        fetch()
        r.inbox(READER, 5, True)
    for i in range(warmup + ops):
        if i >= warmup:
            t.time(f"{label} send", send, i)
            t.time(f"{label} inbox --peek", peek)
            if label != "local":
                t.time(f"{label} fetch alone", fetch)
        else:
            send(i)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", type=int, default=20)
    ap.add_argument("--no-ssh", action="store_true")
    a = ap.parse_args(argv)
    work = common.workdir("transports-")
    common.header("gitdrop remote hubs: a send and an inbox read per transport", work)
    kinds = [served.Daemon, served.Http] + ([] if a.no_ssh else [served.Ssh])
    t = Timer()
    started = []
    try:
        for n, cls in enumerate(kinds):
            s = cls(os.path.join(work, cls.__name__.lower()))
            try:
                started.append(s.start())
            except BaseException as e:   # pytest.skip when sshd is missing
                print(f"{cls.__name__}: not measured ({e})")
                s.close()
                continue
            room = f"bench{n}"
            s.hub.create_room("hub/admin", room, open_=True, settings={"loop_cap": 0})
            for agent in (SENDER, READER):
                s.hub.room(room).register(agent)
            if n == 0:   # the baselines, on the first hub: in process, and file://
                run(t, "local", s.hub, room, a.ops)
                run(t, "file://", RemoteHub("file://" + s.hub.path,
                                            cache=os.path.join(work, "cache-file")),
                    room, a.ops)
            client = RemoteHub(s.url(SENDER), cache=os.path.join(work, f"cache-{s.kind}"))
            run(t, s.kind, client, room, a.ops)
    finally:
        for s in started:
            s.close()
        common.leave(work)
    base = {"send": t.med("local send"), "inbox --peek": t.med("local inbox --peek")}
    print(f"\n{'operation':34} {'median ms':>9} {'p99 ms':>9} {'vs local':>8}")
    for label in t.samples:
        what = "send" if label.endswith(" send") else "inbox --peek"
        vs = "       -" if label.endswith("alone") else ratio(t.med(label), base[what])
        print(f"{label:34} {ms(t.med(label))} {ms(t.p99(label))} {vs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
