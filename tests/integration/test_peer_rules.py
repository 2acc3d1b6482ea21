#!/usr/bin/python3
"""The peer protocol's rules (docs/security.md) that need no rogue: a refused node keeps asking with backoff and joins
once the other side's configuration changes; --max-nodes refuses the node that would pass it;
the traffic counters count only what was sent.

Real daemons on loopback (cluster_harness.Cluster), judged through gRPC and their logs.
"""

import os
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402
from cluster_harness import REGISTRY, Cluster, free_port  # noqa: E402


def wait_for(predicate, timeout, step=0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


class TestRefusedNodeRetries(unittest.TestCase):
    def test_rank_conflict_fixed_on_the_other_side(self):
        # node0 holds node rank 1; B with --node-rank 1 is refused. node0 restarts without the
        # rank (its configuration changed): B, still asking with backoff, joins.
        with Cluster(1, host_devices=1, extra_args=["--node-rank", "1"]) as c:
            c.wait_agreement(world_size=1, timeout=20)
            b = c.make(0, name="b", port=free_port(), extra_args=["--node-rank", "1"])
            self.addCleanup(b.cleanup)
            b.start()
            self.assertTrue(wait_for(lambda: "node rank 1 is already taken by node 'node0'"
                                     in b.stderr(), 15), b.stderr())
            self.assertIn("Asking again in 1 s", b.stderr())
            self.assertEqual(c.topology(0).world_size, 1)

            c.daemons[0].stop()
            c.extra_args = []
            c.restart(0)
            c.daemons.append(b)
            _, view = c.wait_agreement(world_size=2, timeout=40)
            self.assertEqual([n[0] for n in view[2]], ["b", "node0"])
            self.assertIn("accepted this node after refusing it", b.stderr())

    def test_backoff_grows(self):
        with Cluster(1, host_devices=1, extra_args=["--node-rank", "0"]) as c:
            c.wait_agreement(world_size=1, timeout=20)
            b = c.make(0, name="b", port=free_port(), extra_args=["--node-rank", "0"])
            self.addCleanup(b.cleanup)
            b.start()
            self.assertTrue(wait_for(lambda: "Asking again in 4 s" in b.stderr(), 20),
                            b.stderr())
            for s in ("in 1 s", "in 2 s"):
                self.assertIn(s, b.stderr())
            # Every refusal was answered on B's own link only: node0 is alone and unharmed.
            self.assertEqual(c.topology(0).world_size, 1)
            b.stop()


class TestTrafficCounters(unittest.TestCase):
    def test_messages_never_sent_are_not_counted(self):
        # A seed where nothing listens: every dial fails in its handshake, so the hellos and
        # heartbeats queued for it never leave. The counters count what UCX sent: nothing.
        nobody = free_port()
        with Cluster(1, host_devices=1, seeds="all") as c:
            c.daemons[0].stop()
            c.daemons[0] = c.make(0, peers="127.0.0.1:%d" % nobody)
            c.daemons[0].start()
            time.sleep(3)
            st = c.status(0)
            self.assertEqual((st.peer_messages_sent, st.peer_bytes_sent), (0, 0))
            self.assertIn("Cannot reach peer 127.0.0.1:%d" % nobody, c.daemons[0].stderr())

    def test_messages_sent_are_counted(self):
        with Cluster(2, host_devices=1) as c:
            c.wait_agreement(world_size=2, timeout=20)
            time.sleep(1)
            st = c.status(0)
            self.assertGreater(st.peer_messages_sent, 5)
            self.assertGreater(st.peer_bytes_sent, 100 * st.peer_messages_sent // 2)


class TestMaxNodes(unittest.TestCase):
    def test_node_past_max_nodes_is_refused(self):
        with Cluster(2, host_devices=1, extra_args=["--max-nodes", "2"]) as c:
            c.wait_agreement(world_size=2, timeout=20)
            third = c.make(0, name="third", port=free_port())
            self.addCleanup(third.cleanup)
            third.start()
            self.assertTrue(wait_for(lambda: "the cluster already has 2 members, the limit "
                                     "(--max-nodes)" in third.stderr(), 15), third.stderr())
            self.assertEqual(c.wait_agreement(timeout=10)[1][1], 2)
            third.stop()

    def test_limit_above_4096_up_to_the_ceiling(self):
        # --max-nodes goes past the default 4096, up to MEMBERSHIP_MAX_NODES_CEILING (65536).
        with tempfile.NamedTemporaryFile(suffix=".conf") as conf:
            def check(n):
                return subprocess.run([H.familyd_bin(), "--check-config=" + conf.name,
                                       "--registry", REGISTRY, "--max-nodes", str(n)],
                                      capture_output=True, text=True, timeout=30)
            self.assertEqual(check(65536).returncode, 0, check(65536).stderr)
            past = check(65537)
            self.assertEqual(past.returncode, 2)
            self.assertIn("--max-nodes: '65537' is not an integer in [2, 65536]", past.stderr)
        with Cluster(2, host_devices=1, extra_args=["--max-nodes", "10000"]) as c:
            self.assertEqual(c.wait_agreement(world_size=2, timeout=20)[1][1], 2)


if __name__ == "__main__":
    unittest.main()
