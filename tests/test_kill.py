"""kill -9 at random moments, over a hundred times, while writers through the core,
the command line, the MCP server (stdio) and the MCP tools' bodies write into one
room; after each kill the next write must go through without a person, and in the
end no acknowledged write is missing, `git fsck --full` is clean and no lock is
left. The loop is bench/bench_kill.py's (which runs more of it, with gitdrop's
own grace period); here stale locks are taken for dead after 0.3 s
(gitdrop.staleLockSeconds) so that the round fits in CI: the default period is
tested in test_faults.py."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import bench_kill  # noqa: E402


def test_kill_nine_at_random_moments(tmp_path):
    hub = str(tmp_path / "hub.git")
    bench_kill.make_hub(hub, grace=0.3)
    # Writers pause up to 30 ms between writes: back to back, the optimistic write
    # loop can lose 20 races in a row with or without a kill (bench_kill.py's note).
    s = bench_kill.Run(hub, seed=7, pause=0.03, inflight=1).go(core=65, cli=30, mcp=8,
                                                               tools=25)
    report = bench_kill.summary(s)
    print(report)
    assert sum(s["kills"].values()) >= 100, report
    assert sum(s["left"].values()) > 0, report      # some kills did leave the lock
    assert not s["failures"], s["failures"][:5]     # every next write went through
    assert not s["starved"], s["starved"][:5]
    assert not s["survived"], report                # no lock outlived its owner's death
    assert not s["missing"], s["missing"][:5]       # no acknowledged write lost
    assert s["fsck"] == 0, s["fsck_out"]
    assert not s["locks_left"], s["locks_left"]
    assert s["repair"] == 0, s["repair_out"]
    assert s["acked"] > 200
