#!/usr/bin/python3
"""The example job (client/python/examples/train_moe.py) trains across two nodes.

Two daemons on loopback joined over UCX (cluster_harness: node0 ranks 0-1, node1 ranks 2-3,
--host-devices 2 each, deploy/registry). The example runs unchanged as a job of 2 workers per node,
each node's started by its own torchrun (`--nnodes 2 --node-rank K`, rendezvous on 127.0.0.1),
each worker talking to its node's daemon:
dp=2,tp=2 with the expert view edp_shard=2,ep=2, gloo, float32, 3 steps. Its dp-mean losses equal
the same example run --unsharded in one plain process (1e-5 relative at step 0, 1e-4 after), and so
do its gradient norms. Each node built every module as a training handout of each of its two
workers: one build id per module and process (the example's --json lists every rank's), each
daemon's fills_started moved by exactly its ranks' builds, and right after the job each daemon still lists those builds,
released into their grace period, of the member the mesh calls for; after the grace both daemons
are back to the builds and shm they had.
"""

import json
import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import cluster_harness  # noqa: E402
import torch_job_common as C  # noqa: E402

GRACE_MS = 30000        # long enough to list the released builds after the job, under load
                        # (12 s was not, in a Debian 13 root on a loaded machine)


class TrainTwoNodes(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = cluster_harness.Cluster(
            2, host_devices=2, registry=C.REGISTRY,
            extra_args=["--build-grace-ms", str(GRACE_MS)])
        cls.cluster.__enter__()
        cls.cluster.wait_agreement(world_size=4, states=["up", "up"], timeout=30)

    @classmethod
    def tearDownClass(cls):
        cls.cluster.__exit__(None, None, None)

    def client(self, node):
        return self.cluster.client(node)

    def launch_job(self, outdir):
        """Both nodes' launchers at once; the example's JSON (written by torch rank 0)."""
        port = cluster_harness.free_port()        # below UCX's ephemeral ports
        path = os.path.join(outdir, "job.json")
        procs = []
        for node in range(2):
            argv = C.launcher(2, port, [C.EXAMPLE] + C.example_args(
                self.cluster.daemons[node].socket, path), nnodes=2, node_rank=node)
            procs.append(subprocess.Popen(argv, env=C.job_env(), stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT))
        outs = []
        try:
            for p in procs:
                outs.append(p.communicate(timeout=C.JOB_TIMEOUT)[0].decode(errors="replace"))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        for node, p in enumerate(procs):
            self.assertEqual(p.returncode, 0, "node %d:\n%s" % (node, outs[node][-6000:]))
        with open(path) as f:
            return json.load(f), outs

    def test_two_nodes_train_to_the_unsharded_losses(self):
        outdir = self.cluster.daemons[0].tmpdir
        before = [C.status(self.client(n)) for n in range(2)]
        job, outs = self.launch_job(outdir)
        listed = [{b.build_id: b for b in C.list_builds(self.client(n))} for n in range(2)]
        filled = [C.status(self.client(n)).fills_started - before[n].fills_started
                  for n in range(2)]
        unsharded, _ = C.run_unsharded(self.cluster.daemons[0].socket, outdir)

        C.assert_steps(self, job, unsharded)
        self.assertIn("step 2 loss %.6f grad_norm " % job["losses"][2], outs[0])
        self.assertIn("validate: ok\n", outs[0])
        self.assertEqual(job["violations"], [])

        ids = job["builds"]
        self.assertEqual(sorted(ids), sorted(C.MODULES))
        for node, ranks in ((0, (0, 1)), (1, (2, 3))):
            segments = 0
            for fqn, member in C.MODULES.items():
                per_rank = ids[fqn]
                self.assertEqual(len(set(per_rank)), 4, (fqn, per_rank))   # one per process
                for r in ranks:
                    b = listed[node].get(per_rank[r])
                    self.assertIsNotNone(b, "node %d lists no build for %s of rank %d"
                                         % (node, fqn, r))
                    self.assertEqual(b.info.resolved.variant, member, fqn)
                    self.assertEqual(b.info.layout.mesh_id, job["mesh_id"], fqn)
                    self.assertEqual((b.writable, b.private_build), (True, True), fqn)
                    self.assertEqual([int(s.rank) for s in b.shards if s.allocation_bytes], [r])
                    self.assertEqual(list(b.references), [], fqn)       # released: in grace
                    self.assertGreater(b.grace_deadline_unix_ms, 0, fqn)
                    segments += 1
            # Per node: every module a training handout of each of its two processes.
            self.assertEqual(segments, 2 * len(C.MODULES))
            self.assertEqual(filled[node], segments, "node %d" % node)

        for n in range(2):
            after = C.wait_idle(self.client(n), before[n].builds, GRACE_MS / 1000.0 + 15)
            self.assertEqual((after.builds, after.builds_in_grace), (before[n].builds, 0))
            self.assertEqual(after.shm_bytes_in_use, before[n].shm_bytes_in_use)


if __name__ == "__main__":
    C.require_torch()
    unittest.main()
