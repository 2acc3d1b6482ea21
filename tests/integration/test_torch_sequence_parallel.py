#!/usr/bin/python3
"""Sequence and loss parallelism take effect (docs/torch.md): the mesh's flags reach Resolve's rules
and requires and the constructed members, and the example job trains to the same losses.

One daemon (deploy/registry, --host-devices 4). The example (client/python/examples/
train_moe.py) runs three times as a job of 4 workers under torchrun (gloo, float32, dp=2,tp=2,
expert view edp_shard=2,ep=2): plain, with --sequence-parallel (the mesh says
sequence_parallel: activations split over the sequence across tp outside attention, the
registry's sequence-parallel norms) and with --loss-parallel (the mesh says loss_parallel: the
loss from the vocabulary-split logits, vocab_parallel_cross_entropy). Each job's dp-mean losses
and gradient norms of 3 steps equal the plain job's (1e-5 relative at step 0, 1e-4 after: float32
sums in another order). Resolve through the daemon: the norm family's rule picks its
sequence-parallel member on a mesh that says so, the mesh's word wins over the request's both
ways, and the answer carries the flags; activation layouts on the example's model
(torch_activation_worker.py: recorded by the build, validated clean, a changed one refused,
disagreeing neighbours reported); with a registry of this test's own, a variant that
requires sequence_parallel (or excludes loss_parallel) is refused with the exact text, reason
and field.
"""

import json
import os
import shutil
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import familyd_harness as H  # noqa: E402
import torch_job_common as C  # noqa: E402

D = None
RESULTS = {}
WORKER = os.path.join(HERE, "torch_sp_worker.py")
ACTIVATION_WORKER = os.path.join(HERE, "torch_activation_worker.py")
JOBS = {"plain": [], "sequence_parallel": ["--sequence-parallel"],
        "loss_parallel": ["--loss-parallel"]}

# A registry of this test's own: a variant that demands sequence parallelism, one that excludes
# loss parallelism, chosen by selectors so that a job without the flag can reach them.
FLAGS_YAML = """\
name: flagged
baseline: tests.flagged.Flagged
default_variant: plain
selectors:
  want_sp: {type: bool, default: false}
  fused: {type: bool, default: false}
variants:
  plain: {constructor: tests.flagged.Plain, accepts: [config]}
  sp:
    constructor: tests.flagged.SP
    accepts: [config]
    requires: {sequence_parallel: true}
  fused:
    constructor: tests.flagged.Fused
    accepts: [config]
    requires: {loss_parallel: false}
rules:
  - when: {want_sp: true}
    variant: sp
  - when: {fused: true}
    variant: fused
"""


def run_job(name, extra):
    outdir = os.path.join(D.tmpdir, name)
    os.mkdir(outdir)
    path = os.path.join(outdir, "example.json")
    rc, out = C.run(C.launcher(4, C.free_port(), [C.EXAMPLE] + C.example_args(
        D.socket, path, *extra)))
    result = None
    if os.path.exists(path):
        with open(path) as f:
            result = json.load(f)
    return rc, out, result


def setUpModule():
    global D
    D = H.Daemon(registry=C.REGISTRY, host_devices=4, node_name="itest-sp")
    D.start()
    for name, extra in JOBS.items():
        RESULTS[name] = run_job(name, extra)
        result = RESULTS[name][2]
        if result is not None:      # for the log: what the comparisons below compare
            sys.stderr.write("%s: losses %s grad_norms %s\n" % (
                name, ["%.8f" % x for x in result["losses"]],
                ["%.8f" % x for x in result["grad_norms"]]))


def tearDownModule():
    if D is not None:
        D.stop_checked()


def create_mesh(client, sequence_parallel=False, loss_parallel=False):
    res = client.call("familyd.v1.MeshService/CreateMesh", {"mesh": {
        "deviceMesh": [{"name": "dp", "size": 2}, {"name": "tp", "size": 2}],
        "sequenceParallel": sequence_parallel, "lossParallel": loss_parallel}})
    assert res.ok, res
    return res.reply.mesh_id


def resolve(client, family, mesh_id=None, arguments=None, **context):
    request = {"family": family, "context": dict(context)}
    if mesh_id:
        request["context"]["meshId"] = mesh_id
    if arguments:
        request["arguments"] = {k: {"boolValue": v} for k, v in arguments.items()}
    return client.call("familyd.v1.FamilyService/Resolve", request)


class SequenceAndLossParallelJobs(unittest.TestCase):
    def job(self, name):
        rc, out, result = RESULTS[name]
        self.assertEqual(rc, 0, "the %s job failed:\n%s" % (name, out[-6000:]))
        self.assertIsNotNone(result, out[-6000:])
        return result, out

    def test_members_follow_the_flags(self):
        # The norms are the registry's sequence-parallel member only where the mesh says so.
        for name in JOBS:
            variants = self.job(name)[0]["variants"]
            norms = {fqn: v for fqn, v in variants.items() if fqn.endswith("norm")}
            self.assertEqual(len(norms), 5, variants)
            want = "sequence_parallel" if name == "sequence_parallel" else "plain"
            self.assertEqual(set(norms.values()), {want}, name)
            self.assertEqual(variants["embed"], "vocab_parallel", name)

    def test_plain_job_trains(self):
        plain, out = self.job("plain")
        self.assertNotEqual(plain["losses"][0], plain["losses"][-1])
        self.assertIn("validate: ok\n", out)

    def test_sequence_parallel_job_equals_the_plain_job(self):
        plain, _ = self.job("plain")
        sp, out = self.job("sequence_parallel")
        C.assert_steps(self, sp, plain)
        self.assertIn("validate: ok\n", out)

    def test_loss_parallel_job_equals_the_plain_job(self):
        plain, _ = self.job("plain")
        lp, out = self.job("loss_parallel")
        C.assert_steps(self, lp, plain)
        self.assertIn("validate: ok\n", out)

    def test_each_job_on_a_mesh_with_its_flags(self):
        ids = {name: self.job(name)[0]["mesh_id"] for name in JOBS}
        self.assertEqual(len(set(ids.values())), 3, ids)      # the flags are in the mesh id
        for name, mesh_id in ids.items():
            res = D.client.call("familyd.v1.MeshService/GetMesh", {"meshId": mesh_id})
            self.assertTrue(res.ok, res)
            self.assertEqual((res.reply.sequence_parallel, res.reply.loss_parallel),
                             (name == "sequence_parallel", name == "loss_parallel"), name)

    def test_a_job_whose_sequence_does_not_split_is_refused(self):
        rc, out = C.run(C.launcher(4, C.free_port(), [C.EXAMPLE, "--socket", D.socket,
                                                      "--sequence-parallel", "--seq", "7"],
                                   monitor_interval=10))
        self.assertEqual(rc, 1, out)
        self.assertEqual(out.count("train_moe: --seq 7 does not split over tp=2"), 4, out)


class Members(unittest.TestCase):
    """torch_sp_worker.py on 2 workers (no daemon): the collectives, the sequence-parallel
    members and vocab_parallel_cross_entropy against the whole computation."""

    def test_members_and_cross_entropy(self):
        outdir = os.path.join(D.tmpdir, "members")
        os.mkdir(outdir)
        rc, out = C.run(C.launcher(2, C.free_port(), [WORKER, outdir]))
        self.assertEqual(rc, 0, out[-6000:])
        names = ["ce_mean", "ce_sum", "ce_none", "ce_batched", "ce_bfloat16_grad",
                 "ce_bad_reduction", "ce_bad_shape", "sp_mlp", "sp_fused_mlp", "sp_attention",
                 "sp_norm", "sp_embedding", "sp_norm_refuses", "sp_uneven"]
        for rank in range(2):
            with open(os.path.join(outdir, "%d.json" % rank)) as f:
                got = json.load(f)
            self.assertEqual(sorted(got), sorted(names), "rank %d: %s" % (rank, got))
            for name in names:
                self.assertTrue(got[name][0], "rank %d, %s: %s" % (rank, name, got[name][1]))


class ActivationLayouts(unittest.TestCase):
    """torch_activation_worker.py on 4 workers against this daemon (deploy/registry): the
    example's model built on the job's mesh, with and without sequence parallelism, carries
    its Build's activation layouts and validates clean; a recorded layout changed after the
    build is refused with the exact text (and its neighbour reported); two vocab-parallel
    embeddings next to each other on the sequence-parallel mesh are reported."""

    def test_example_model_layouts(self):
        outdir = os.path.join(D.tmpdir, "activations")
        os.mkdir(outdir)
        rc, out, results = C.worker_job(ACTIVATION_WORKER, 4, D.socket, outdir)
        self.assertEqual(rc, 0, out[-6000:])
        names = ["plain_recorded", "plain_clean", "plain_changed", "sp_recorded", "sp_clean",
                 "sp_changed", "sp_neighbours"]
        self.assertEqual(sorted(results), [0, 1, 2, 3], out[-6000:])
        for rank, got in results.items():
            self.assertEqual(sorted(got), sorted(names), "rank %d: %s" % (rank, got))
            for name in names:
                self.assertTrue(got[name][0], "rank %d, %s: %s" % (rank, name, got[name][1]))


class ResolveWithFlags(unittest.TestCase):
    def test_norm_rule_picks_the_sequence_parallel_member(self):
        sp_mesh = create_mesh(D.client, sequence_parallel=True)
        res = resolve(D.client, "norm", sp_mesh)
        self.assertTrue(res.ok, res)
        r = res.reply.resolved
        self.assertEqual((r.variant, r.constructor),
                         ("sequence_parallel", "familyd.torch.modules.SequenceParallelRMSNorm"))
        self.assertEqual((r.sequence_parallel, r.loss_parallel), (True, False))

    def test_the_mesh_wins_over_the_request(self):
        plain_mesh = create_mesh(D.client)
        sp_mesh = create_mesh(D.client, sequence_parallel=True, loss_parallel=True)
        res = resolve(D.client, "norm", plain_mesh, sequenceParallel=True, lossParallel=True)
        self.assertTrue(res.ok, res)
        self.assertEqual(res.reply.resolved.variant, "plain")
        self.assertEqual((res.reply.resolved.sequence_parallel,
                          res.reply.resolved.loss_parallel), (False, False))
        res = resolve(D.client, "norm", sp_mesh)
        self.assertTrue(res.ok, res)
        self.assertEqual(res.reply.resolved.variant, "sequence_parallel")
        self.assertEqual((res.reply.resolved.sequence_parallel,
                          res.reply.resolved.loss_parallel), (True, True))

    def test_without_a_mesh_the_context_says(self):
        res = resolve(D.client, "norm", tpSize=2, sequenceParallel=True)
        self.assertTrue(res.ok, res)
        self.assertEqual(res.reply.resolved.variant, "sequence_parallel")
        res = resolve(D.client, "norm", tpSize=2)
        self.assertTrue(res.ok, res)
        self.assertEqual(res.reply.resolved.variant, "plain")

    def test_requirements_refuse_with_their_text(self):
        registry = os.path.join(D.tmpdir, "flags-registry")
        os.mkdir(registry)
        with open(os.path.join(registry, "flagged.yaml"), "w") as f:
            f.write(FLAGS_YAML)
        with H.Daemon(registry=registry, host_devices=4, node_name="itest-sp-flags") as d:
            plain_mesh, lp_mesh = create_mesh(d.client), create_mesh(d.client, loss_parallel=True)
            sp_mesh = create_mesh(d.client, sequence_parallel=True)
            cases = [
                (dict(mesh_id=plain_mesh, arguments={"want_sp": True}),
                 "variant 'sp' requires sequence_parallel=True; job has sequence_parallel=False",
                 "sequence_parallel"),
                # the request says sequence_parallel, the mesh does not: the mesh wins
                (dict(mesh_id=plain_mesh, arguments={"want_sp": True}, sequenceParallel=True),
                 "variant 'sp' requires sequence_parallel=True; job has sequence_parallel=False",
                 "sequence_parallel"),
                (dict(mesh_id=lp_mesh, arguments={"fused": True}),
                 "variant 'fused' requires loss_parallel=False; job has loss_parallel=True",
                 "loss_parallel"),
                (dict(arguments={"fused": True}, lossParallel=True),
                 "variant 'fused' requires loss_parallel=False; job has loss_parallel=True",
                 "loss_parallel"),
            ]
            for kwargs, message, field in cases:
                res = resolve(d.client, "flagged", **kwargs)
                self.assertEqual((res.code, res.message), ("FAILED_PRECONDITION", message),
                                 kwargs)
                _, infos = d.client.error_details(res)
                self.assertEqual([i.reason for i in infos], ["REQUIREMENT"], kwargs)
                self.assertEqual(infos[0].metadata.get("field"), field, kwargs)
            for kwargs, variant in ((dict(mesh_id=sp_mesh, arguments={"want_sp": True}), "sp"),
                                    (dict(arguments={"want_sp": True}, sequenceParallel=True),
                                     "sp"),
                                    (dict(mesh_id=sp_mesh, arguments={"fused": True}), "fused")):
                res = resolve(d.client, "flagged", **kwargs)
                self.assertTrue(res.ok, (kwargs, res))
                self.assertEqual(res.reply.resolved.variant, variant, kwargs)
            # GetFamily shows the flag requirements as one-bool lists.
            res = d.client.call("familyd.v1.FamilyService/GetFamily", {"family": "flagged"})
            self.assertTrue(res.ok, res)
            requires = {v.name: {k: [x.bool_value for x in l.values]
                                 for k, l in v.requires.items()}
                        for v in res.reply.variants}
            self.assertEqual(requires, {"plain": {}, "sp": {"sequence_parallel": [True]},
                                        "fused": {"loss_parallel": [False]}})
            # familyctl shows them as the registry wrote them.
            ctl = H.familyctl_bin()
            self.assertIsNotNone(ctl, "familyctl not built")
            out = subprocess.run([ctl, "--socket", d.socket, "family", "flagged"],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 timeout=30)
            self.assertEqual(out.returncode, 0, out.stdout)
            rows = {line.split()[0]: line.split()[-1] for line in out.stdout.splitlines()
                    if line.split() and line.split()[0] in ("plain", "sp", "fused")}
            self.assertEqual(rows, {"plain": "-", "sp": "sequence_parallel=true",
                                    "fused": "loss_parallel=false"}, out.stdout)
        shutil.rmtree(registry)


if __name__ == "__main__":
    C.require_torch()
    unittest.main()
