#!/usr/bin/python3
"""validate_model's job-mesh check, under torchrun (docs/torch.md, "validate_model").

One daemon (the example registry, --host-devices 2), one torchrun job of 2 processes of this
file's worker. Each builds the MLP (tensor-parallel on tp=2) and the grouped experts on the
JobMesh tp=2, then asks validate_model about the model as built (no violation, with the JobMesh
as the context and without one) and after three changes that put a module on another job mesh
than its build's, each of which validate_model reports as LAYOUT_MESH_MISMATCH
"constructed families cannot be applied with a different job mesh" for that module only:
- a parameter moved onto a DeviceMesh that lays the ranks in the other order (tp = [1, 0]),
  with the JobMesh as the context and without a context (the build's mesh from GetMesh);
- a JobMesh whose process group for tp is not the mesh's (each rank alone), for every module
  built on that mesh;
- raise_errors=True raises ModelValidationError naming the violation.
A redistribute on the build's own DeviceMesh stays a layout matter (LAYOUT_CONFLICT, not a
different mesh), and a sub-mesh of the build's DeviceMesh (the tp dimension alone) is the
build's mesh.
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
TEXT = "constructed families cannot be applied with a different job mesh"


def worker(outdir, socket_path):
    import dataclasses
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Replicate
    import familyd
    import familyd.torch as FT

    def reasons(violations):
        return [[v.reason, list(v.fqns), v.message] for v in violations]

    client = familyd.Client(socket_path)
    job = FT.init(client)
    jm = FT.job_mesh(client, job, {"tp": 2})
    model = torch.nn.Module()
    model.mlp = FT.build_module(client, "mlp", CONFIG, mesh=jm, fqn="mlp", seed=3)
    model.experts = FT.build_module(client, "grouped_experts", CONFIG, mesh=jm, fqn="experts",
                                    seed=3)
    out = {"variant": FT.build_info(model.mlp).member.variant,
           "as_built": reasons(FT.validate_model(client, model, context=jm)),
           "as_built_no_context": reasons(FT.validate_model(client, model))}

    # A parameter on a DeviceMesh that lays the two ranks the other way round.
    reversed_mesh = DeviceMesh("cpu", torch.tensor([1, 0]), mesh_dim_names=("tp",))
    w = model.mlp.gate_proj
    model.mlp.gate_proj = torch.nn.Parameter(DTensor.from_local(
        w.to_local(), reversed_mesh, w.placements, run_check=False, shape=w.shape,
        stride=w.stride()))
    out["reversed"] = reasons(FT.validate_model(client, model, context=jm))
    out["reversed_no_context"] = reasons(FT.validate_model(client, model))
    try:
        FT.validate_model(client, model, context=jm, raise_errors=True)
        out["raised"] = None
    except FT.ModelValidationError as e:
        out["raised"] = str(e)
    model.mlp.gate_proj = w

    # The tp dimension of the build's own DeviceMesh, as a sub-mesh: the build's mesh.
    sub = jm.device_mesh["tp"]
    model.mlp.gate_proj = torch.nn.Parameter(DTensor.from_local(
        w.to_local(), sub, w.placements, run_check=False, shape=w.shape, stride=w.stride()))
    out["sub_mesh"] = reasons(FT.validate_model(client, model, context=jm))
    # Redistributed on its own mesh: a layout conflict, not another mesh.
    model.mlp.gate_proj = torch.nn.Parameter(w.redistribute(w.device_mesh, [Replicate()]))
    out["redistributed"] = [v[:2] for v in reasons(FT.validate_model(client, model,
                                                                     context=jm))]
    model.mlp.gate_proj = w

    # A JobMesh whose tp process group is not the mesh's: each rank alone.
    alone = [dist.new_group([r]) for r in range(job.world_size)]
    lonely = dataclasses.replace(jm, groups=dict(jm.groups, tp=alone[job.rank]))
    out["lonely_groups"] = reasons(FT.validate_model(client, model, context=lonely))
    out["after"] = reasons(FT.validate_model(client, model, context=jm))
    FT.release(model)
    with open(os.path.join(outdir, "%d.json" % job.rank), "w") as f:
        json.dump(out, f)
    dist.barrier()
    dist.destroy_process_group()


class TorchValidateMesh(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        C.require_torch()
        cls.daemon = H.Daemon(registry=REGISTRY, host_devices=2, node_name="itest-vmesh")
        cls.daemon.start()
        outdir = tempfile.mkdtemp(prefix="fd-vmesh-", dir=cls.daemon.tmpdir)
        cls.rc, cls.out, cls.results = C.worker_job(os.path.abspath(__file__), 2,
                                                    cls.daemon.socket, outdir, timeout=TIMEOUT)

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()
        cls.daemon.cleanup()

    def ranks(self):
        self.assertEqual(self.rc, 0, self.out[-6000:])
        self.assertEqual(sorted(self.results), [0, 1], self.out[-6000:])
        return self.results.items()

    def test_the_model_as_built_fits(self):
        for rank, r in self.ranks():
            self.assertEqual(r["variant"], "tensor_parallel", rank)
            self.assertEqual(r["as_built"], [], rank)
            self.assertEqual(r["as_built_no_context"], [], rank)
            self.assertEqual(r["sub_mesh"], [], rank)
            self.assertEqual(r["after"], [], rank)

    def test_a_parameter_on_another_device_mesh(self):
        for rank, r in self.ranks():
            self.assertEqual(r["reversed"], [["LAYOUT_MESH_MISMATCH", ["mlp"], TEXT]], rank)
            self.assertEqual(r["reversed_no_context"], [["LAYOUT_MESH_MISMATCH", ["mlp"], TEXT]],
                             rank)
            self.assertIn("LAYOUT_MESH_MISMATCH ['mlp']: " + TEXT, r["raised"] or "", rank)

    def test_job_process_groups_that_are_not_the_mesh(self):
        for rank, r in self.ranks():
            self.assertEqual(r["lonely_groups"], [["LAYOUT_MESH_MISMATCH", ["mlp"], TEXT],
                                                  ["LAYOUT_MESH_MISMATCH", ["experts"], TEXT]],
                             rank)

    def test_redistributed_on_its_own_mesh_is_a_layout_conflict(self):
        for rank, r in self.ranks():
            self.assertEqual(r["redistributed"], [["LAYOUT_CONFLICT", ["mlp"]]], rank)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3])
        sys.exit(0)
    unittest.main(verbosity=2)
