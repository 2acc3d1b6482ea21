#!/usr/bin/python3
"""The example job (client/python/examples/train_moe.py) trains on one node through familyd.

One daemon (deploy/registry, --host-devices 4, --build-grace-ms 2000). The example runs --unsharded
in one plain process, then as a job of 4 workers started by torchrun (gloo, float32, dp=2,tp=2
with the expert view edp_shard=2,ep=2), each worker being torch_job_worker.py: the example's own
steps plus what this test reads. Checked: torchrun started the workers (its variables, 4 pids);
the dp-mean losses of 3 steps equal the unsharded run's (1e-5 relative at step 0, 1e-4 after),
and so do the gradient norms; the daemon held a training handout per module and worker (private,
writable, of that worker's rank, held by it alone, its tokens shown to it alone), of the member
the mesh calls for, each filled once (fills_started moved by their number); Validate on the live model passes; a module built on
another mesh, grouped experts built for ep 1, and a parameter tied between two builds of different
shapes each give their reasons; after the job and the grace period the daemon's builds and shm in
use are back where they were.
"""

import json
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import familyd_harness as H  # noqa: E402
import torch_job_common as C  # noqa: E402

D = None
RESULTS = {}


def setUpModule():
    global D
    D = H.Daemon(registry=C.REGISTRY, host_devices=4, node_name="itest-train",
                 extra_args=["--build-grace-ms", str(C.GRACE_MS)])
    D.start()
    RESULTS["before"] = C.status(D.client)
    RESULTS["unsharded"], RESULTS["unsharded_out"] = C.run_unsharded(D.socket, D.tmpdir)
    RESULTS["between"] = C.wait_idle(D.client, RESULTS["before"].builds)
    outdir = os.path.join(D.tmpdir, "job")
    os.mkdir(outdir)
    rc, out = C.run(C.launcher(4, C.free_port(), [C.WORKER, outdir] + C.example_args(
        D.socket, os.path.join(outdir, "example.json"))))
    RESULTS["job"] = (rc, out)
    RESULTS["ranks"] = {}
    for rank in range(4):
        path = os.path.join(outdir, "%d.json" % rank)
        if os.path.exists(path):
            with open(path) as f:
                RESULTS["ranks"][rank] = json.load(f)
    RESULTS["after"] = C.wait_idle(D.client, RESULTS["before"].builds)


def tearDownModule():
    if D is not None:
        D.stop_checked()


class TrainOneNode(unittest.TestCase):
    def ranks(self):
        rc, out = RESULTS["job"]
        self.assertEqual(rc, 0, "the job failed:\n" + out[-6000:])
        self.assertEqual(sorted(RESULTS["ranks"]), [0, 1, 2, 3], out[-6000:])
        return RESULTS["ranks"]

    def test_workers_started_by_torchrun(self):
        pids = set()
        for rank, r in self.ranks().items():
            self.assertTrue(set(C.INIT_ENV) <= set(r["torchrun_env"]), "rank %d" % rank)
            self.assertIn("TORCHELASTIC_RUN_ID", r["torchrun_env"])     # torchrun's own agent
            pids.add(r["pid"])
        self.assertEqual(len(pids), 4)

    def test_losses_equal_the_unsharded_run(self):
        want = RESULTS["unsharded"]
        for rank, r in self.ranks().items():
            C.assert_steps(self, r, want)
        rc, out = RESULTS["job"]
        r = RESULTS["ranks"][0]
        for step, (loss, norm) in enumerate(zip(r["losses"], r["grad_norms"])):
            self.assertIn("step %d loss %.6f grad_norm %.6f\n" % (step, loss, norm), out)
        self.assertIn("step 0 loss ", RESULTS["unsharded_out"])

    def test_one_training_handout_per_module_and_process(self):
        # The example trains every module: each process has its own writable build of its own
        # rank per module (build_module's default, trainable=True), which only it can map.
        ranks = self.ranks()
        snap = ranks[0]["daemon"]
        with open(os.path.join(D.tmpdir, "job", "example.json")) as f:
            ids = json.load(f)["builds"]
        self.assertEqual(sorted(ids), sorted(C.MODULES))
        for fqn, per_rank in ids.items():
            self.assertEqual(len(set(per_rank)), 4, "%s: %s" % (fqn, per_rank))
        builds = {b["build_id"]: b for b in snap["builds"]}
        pid_of = {rank: r["pid"] for rank, r in ranks.items()}
        for fqn, member in C.MODULES.items():
            for rank, build_id in enumerate(ids[fqn]):
                b = builds[build_id]
                where = "%s, rank %d" % (fqn, rank)
                self.assertEqual(b["variant"], member, where)
                self.assertEqual(b["mesh_id"], ranks[0]["mesh_id"], where)
                self.assertEqual(b["pids"], [pid_of[rank]], where)
                self.assertEqual(b["ranks"], [rank], where)
                self.assertEqual((b["writable"], b["private"]), (True, True), where)
                # rank 0's snapshot: the tokens of its own handouts only
                self.assertEqual(b["tokens"], [0] if rank == 0 else [], where)
        self.assertEqual(len(builds), 4 * len(C.MODULES))
        self.assertEqual(snap["fills_started"] - RESULTS["between"].fills_started,
                         4 * len(C.MODULES))

    def test_validate_on_the_live_model(self):
        for rank, r in self.ranks().items():
            self.assertEqual(r["violations"], [], "rank %d" % rank)
        self.assertIn("validate: ok\n", RESULTS["job"][1])
        self.assertIn("validate: ok\n", RESULTS["unsharded_out"])

    def test_module_built_on_another_mesh(self):
        for rank, r in self.ranks().items():
            self.assertEqual(r["misfits"]["other_mesh"], [
                ["MESH_MISMATCH", ["misfit"], "context and mesh belong to different jobs"],
                ["AXIS_SIZE_MISMATCH", ["misfit"],
                 "family at ('misfit',) was constructed with ep=1, job requires 2; build it "
                 "again on the job's mesh (familyd.torch.build_module with mesh=)"]])

    def test_experts_built_for_another_ep_size(self):
        for rank, r in self.ranks().items():
            self.assertEqual(r["misfits"]["ep_1"], [
                ["AXIS_SIZE_MISMATCH", ["misfit"],
                 "family at ('misfit',) was constructed with ep=1, job requires 2; build it "
                 "again on the job's mesh (familyd.torch.build_module with mesh=)"]])

    def test_parameter_tied_between_builds_of_different_shapes(self):
        for rank, r in self.ranks().items():
            got = r["misfits"]["tied_shapes"]
            self.assertEqual([v[0] for v in got], ["SHARED_PARAMETER_CONFLICT"], got)
            self.assertTrue(got[0][2].startswith("shared parameter 'misfit.weight' has shape "),
                            got)
            self.assertIn("'norm.weight'", got[0][2])

    def test_shm_returns_after_the_job(self):
        self.ranks()
        before, after = RESULTS["before"], RESULTS["after"]
        self.assertEqual((after.builds, after.builds_in_grace), (before.builds, 0))
        self.assertEqual(after.shm_bytes_in_use, before.shm_bytes_in_use)
        self.assertGreater(RESULTS["ranks"][0]["daemon"]["shm_bytes_in_use"],
                           before.shm_bytes_in_use)


    def test_a_job_that_does_not_split_fails_on_every_rank(self):
        before = C.status(D.client)
        rc, out = C.run(C.launcher(4, C.free_port(), [C.EXAMPLE, "--socket", D.socket, "--tp",
                                                      "3"], monitor_interval=10))
        self.assertEqual(rc, 1, out)
        self.assertEqual(out.count("train_moe: 4 ranks do not split into tp=3 and ep=2"), 4,
                         out)
        self.assertEqual(C.status(D.client).fills_started, before.fills_started)   # no build


if __name__ == "__main__":
    C.require_torch()
    unittest.main()
