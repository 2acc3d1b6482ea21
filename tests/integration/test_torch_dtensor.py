#!/usr/bin/python3
"""build_module's parameters are DTensors: placements, full_tensor() and Validate, under torchrun.

One daemon (the example registry, --host-devices 4). Two torchrun jobs of this file's worker:
2 processes on the meshes tp=2 and ep=2, 4 processes on dp=2 x tp=2 with the expert view
edp_shard=2 x ep=2. Every worker builds every family of the example registry on each mesh
(build_module through job_mesh) and, for every parameter: it is a DTensor on the JobMesh's
DeviceMesh of its view (the expert view's for the experts), its placements are the layout's
(Shard(d) where the layout shards over the dimension, Replicate() elsewhere), its local tensor
is this rank's shard, and full_tensor() equals the same module built whole in one process
(mesh=None, the same fqn and seed: familyd's fill does not depend on the layout). Then one
parameter is redistributed to Replicate() after the build: validate_model reports
LAYOUT_CONFLICT for that module and nothing for the others. The parameters are leaf
nn.Parameters that require gradients (training handouts), and building them does not import
torch._dynamo (DTensor.from_local and nn.Parameter of a DTensor do: about 0.7 s of CPU in every
process, docs/benchmarks.md "PyTorch job start").
"""

import json
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import familyd_harness as H  # noqa: E402
import torch_job_common as C  # noqa: E402

REGISTRY = os.path.join(H.SOURCE_ROOT, "deploy", "registry")
TIMEOUT = 300
CONFIG = {"vocab_size": 64, "hidden_size": 32, "num_attention_heads": 4,
          "num_key_value_heads": 2, "head_dim": 8, "num_experts": 4, "moe_intermediate_size": 16,
          "intermediate_size": 48, "initializer_range": 0.02, "rms_norm_eps": 1e-6}
FAMILIES = ("grouped_experts", "mlp", "attention", "embedding", "norm")
# world size -> the meshes its job builds on: (name, device view, expert view)
MESHES = {2: [("tp=2", {"tp": 2}, None), ("ep=2", {"ep": 2}, None)],
          4: [("dp=2,tp=2", {"dp": 2, "tp": 2}, {"edp_shard": 2, "ep": 2})]}


def placement_name(placement):
    if placement.is_shard():
        return "Shard(%d)" % placement.dim
    return type(placement).__name__ + "()"


def worker(outdir, socket_path):
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor, Replicate
    import familyd
    import familyd.torch as FT

    client = familyd.Client(socket_path)
    job = FT.init(client)
    out = {"dynamo_before": "torch._dynamo" in sys.modules}
    for name, device, expert in MESHES[job.world_size]:
        jm = FT.job_mesh(client, job, device, expert)
        seen = {}
        model = torch.nn.Module()
        for family in FAMILIES:
            fqn = "layers.0." + family
            module = FT.build_module(client, family, CONFIG, mesh=jm, fqn=fqn, seed=7)
            out.setdefault("dynamo_after_build", "torch._dynamo" in sys.modules)
            whole = FT.build_module(client, family, CONFIG, fqn=fqn, seed=7)
            info = FT.build_info(module)
            layouts = {p.name: p for p in info.layout.parameters}
            for pname, p in module.named_parameters():
                layout = layouts[pname]
                want_mesh = jm.expert_mesh if layout.mesh_view == "expert" else jm.device_mesh
                full = p.full_tensor() if isinstance(p, DTensor) else None
                seen["%s.%s" % (family, pname)] = {
                    "variant": info.member.variant,
                    "dtensor": isinstance(p, DTensor),
                    "trainable_leaf": isinstance(p, torch.nn.Parameter) and p.requires_grad and
                    p.is_leaf and p.grad_fn is None,
                    "mesh": isinstance(p, DTensor) and p.device_mesh is want_mesh,
                    "dims": list(p.device_mesh.mesh_dim_names) if isinstance(p, DTensor) else [],
                    "placements": [placement_name(x) for x in p.placements]
                    if isinstance(p, DTensor) else [],
                    "layout": [[x.axis, x.kind, int(x.dim)] for x in layout.placements],
                    "shape": list(p.shape), "logical": [int(d) for d in layout.shape],
                    "local": list(p.to_local().shape) if isinstance(p, DTensor) else [],
                    "shard": list(info.local_shapes[pname]),
                    "full_equal": full is not None and
                    torch.equal(full, dict(whole.named_parameters())[pname].detach()),
                }
            setattr(model, family, module)
        violations = FT.validate_model(client, model, context=jm)
        # The MLP's first parameter gathered whole after the build: a layout the build does not
        # have where the mesh splits it (tp=2; on ep=2 the plain MLP's tp axis has size 1).
        mlp = model.mlp
        w = mlp.gate_proj
        mlp.gate_proj = torch.nn.Parameter(
            w.redistribute(w.device_mesh, [Replicate()] * w.device_mesh.ndim))
        changed = FT.validate_model(client, model, context=jm)
        out[name] = {"params": seen, "violations": [v.reason for v in violations],
                     "changed": [[v.reason, list(v.fqns)] for v in changed],
                     "mlp_sharded": any(x.kind == "shard" and
                                        x.axis in w.device_mesh.mesh_dim_names
                                        for x in FT.build_info(mlp).layout.parameters[0].placements)}
        FT.release(model)
    with open(os.path.join(outdir, "%d.json" % job.rank), "w") as f:
        json.dump(out, f)
    dist.barrier()
    dist.destroy_process_group()


class TorchDTensor(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = H.Daemon(registry=REGISTRY, host_devices=4, node_name="itest-dtensor")
        cls.daemon.start()

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()
        cls.daemon.cleanup()

    def run_job(self, world):
        outdir = tempfile.mkdtemp(prefix="fd-dtensor-", dir=self.daemon.tmpdir)
        rc, out, results = C.worker_job(os.path.abspath(__file__), world, self.daemon.socket,
                                        outdir, timeout=TIMEOUT)
        self.assertEqual(rc, 0, out[-6000:])
        self.assertEqual(sorted(results), list(range(world)), out[-6000:])
        return results

    def check(self, results, mesh, device, expert):
        for rank, r in results.items():
            self.assertEqual((r["dynamo_before"], r["dynamo_after_build"]), (False, False),
                             "rank %d: torch._dynamo imported (before, after a build)" % rank)
            got = r[mesh]
            self.assertEqual(got["violations"], [], "rank %d on %s" % (rank, mesh))
            split = 0
            for key, p in got["params"].items():
                where = "rank %d, %s, %s" % (rank, mesh, key)
                self.assertTrue(p["dtensor"], where)
                self.assertTrue(p["trainable_leaf"], where)
                self.assertTrue(p["mesh"], where)
                view = device
                if expert and set(p["dims"]) == set(expert):
                    view = expert
                self.assertEqual(p["dims"], list(view), where)
                shards = {axis: dim for axis, kind, dim in p["layout"] if kind == "shard"}
                want = ["Shard(%d)" % shards[d] if d in shards else "Replicate()"
                        for d in view]
                self.assertEqual(p["placements"], want, where)
                split += bool(shards)
                self.assertEqual(p["shape"], p["logical"], where)      # DTensor: global shape
                self.assertEqual(p["local"], p["shard"], where)        # local: familyd's shard
                self.assertTrue(p["full_equal"], where)
            self.assertGreater(split, 0, "%s splits no parameter" % mesh)
            if got["mlp_sharded"]:
                self.assertEqual(got["changed"], [["LAYOUT_CONFLICT", ["mlp"]]], mesh)
            else:
                self.assertEqual(got["changed"], [], mesh)

    def test_two_ranks_tp_and_ep(self):
        results = self.run_job(2)
        self.check(results, "tp=2", {"tp": 2}, None)
        self.check(results, "ep=2", {"ep": 2}, None)
        for rank, r in results.items():
            self.assertEqual(r["tp=2"]["params"]["mlp.gate_proj"]["variant"], "tensor_parallel")
            self.assertEqual(r["ep=2"]["params"]["grouped_experts.gate_up_proj"]["variant"],
                             "grouped_ep")
            self.assertTrue(r["tp=2"]["mlp_sharded"])

    def test_four_ranks_dp_tp_with_expert_view(self):
        results = self.run_job(4)
        self.check(results, "dp=2,tp=2", {"dp": 2, "tp": 2}, {"edp_shard": 2, "ep": 2})
        for rank, r in results.items():
            experts = r["dp=2,tp=2"]["params"]["grouped_experts.gate_up_proj"]
            self.assertEqual(experts["dims"], ["edp_shard", "ep"])
            self.assertEqual(experts["placements"], ["Replicate()", "Shard(0)"])


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3])
        sys.exit(0)
    unittest.main(verbosity=2)
