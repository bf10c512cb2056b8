"""Many agents on several machines writing to one room at once through real git
servers: gitolite over sshd and Apache running git http-backend.

    python bench/bench_githosts.py                      # 3 machines x 10 agents, 3 sends each
    python bench/bench_githosts.py --sends 10 --servers apache

The servers and the load run are the ones tests/test_githosts.py uses
(tests/servers.py): each agent has its own login (a gitolite key, an htpasswd
user) and its own mirror on its machine (a cache directory); all of them start
together, send N messages to a desk agent, then claim one of a few tasks that three
agents want. Reported per server: writes landed and refused (by rule); commands
that gave up six times in a row (the room kept moving past the client's time
budget, nothing written); writes lost (any other error: must be 0); latency of
one write from the command's start to its answer (p50, p99, max; races redone
inside); writes landed per second of wall time; pushes redone after a lost race;
and commands run again after the client gave up (as its message says to).
"""

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
import common  # noqa: E402

import servers  # noqa: E402  (the servers the tests use)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--machines", type=int, default=3)
    ap.add_argument("--agents", type=int, default=10, help="agents per machine")
    ap.add_argument("--sends", type=int, default=3, help="messages each agent sends")
    ap.add_argument("--servers", default="gitolite,apache")
    a = ap.parse_args(argv)
    work = common.workdir("githosts-")
    common.header("gitdrop on real git servers: machines x agents writing at once", work)
    agents = servers.AGENTS + tuple(servers.load_agents(a.machines, a.agents))
    lines = []
    for kind in a.servers.split(","):
        s = servers.SERVERS[kind](os.path.join(work, kind), agents)
        try:
            s.start()
        except BaseException as e:   # pytest.skip when a package is missing
            print(f"{kind}: not measured ({e})")
            s.close()
            continue
        try:
            r = servers.load_run(s, os.path.join(work, f"{kind}-clients"), a.machines,
                                 a.agents, sends=a.sends)
        finally:
            s.close()
        lines.append(servers.summary(r))
        print(lines[-1], flush=True)
        for x in (r["lost"] + r["gave_up"])[:5]:
            print(f"  {x[3]}: {x[0]} {x[1]}: {x[4]}")
    common.leave(work)
    print("\n" + "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
