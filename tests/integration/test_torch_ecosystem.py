#!/usr/bin/python3
"""The torch 2 ecosystem on familyd-built models: clip_grad_norm_, FSDP2, DCP, torch.compile.

One daemon (the example registry, --host-devices 4) and two torchrun jobs of this file's worker
(gloo on CPU), run once for the class; each test checks what the jobs wrote:

- 2 processes, mesh tp=2: a small model (embedding, RMSNorm, attention, RMSNorm, MLP) built
  with seed SAVED is saved with torch.distributed.checkpoint (DCP) into a temporary directory;
  the MLP's, the attention's and the norm's forward are compiled with torch.compile (inductor)
  and must give eager's output; torch._dynamo.explain counts their graphs and graph breaks.
- 4 processes, mesh dp=2 x tp=2 with the expert view edp_shard=2 x ep=2:
  clip:  torch.nn.utils.clip_grad_norm_ on the model (device view only) after a backward on
         each dp rank's half of a global batch and the dp gradients averaged through the local
         shards: the total norm and the clipped gradients equal those of the same model built
         whole in one process (mesh=None, same seed and fqns) on the whole batch. With grouped
         experts added (parameters on the expert view's DeviceMesh) torch's fails (DTensor
         cannot stack across meshes) and familyd.torch.clip_grad_norm_ gives the whole model's.
  fsdp:  familyd.torch.fully_shard of every module over dp (then the root) trains 3 steps of
         AdamW to the losses of the same model with its gradients all-reduced over dp by hand;
         validate_model finds nothing after it; fully_shard refuses the experts over dp and the
         MLP over tp (sharded there), and shards the experts over edp_shard.
  dcp:   the model built on tp=4 with another seed, dcp.load of the tp=2 checkpoint and
         load_state_dict: every parameter's full_tensor() equals the whole model of seed
         SAVED (and did not before the load).
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import familyd_harness as H  # noqa: E402
from torch_job_common import PACKAGE, REGISTRY, job_env  # noqa: E402

JOB_TIMEOUT = 240
CONFIG = {"vocab_size": 64, "hidden_size": 32, "num_attention_heads": 8,
          "num_key_value_heads": 4, "head_dim": 4, "num_experts": 4, "moe_intermediate_size": 16,
          "intermediate_size": 48, "initializer_range": 0.02, "rms_norm_eps": 1e-6}
SAVED, OTHER = 5, 11
STEPS = 3
MODULES = (("embed", "embedding"), ("n1", "norm"), ("attn", "attention"), ("n2", "norm"),
           ("mlp", "mlp"))
COMPILED = ("mlp", "attn", "n1")


def worker(outdir, socket_path, ckpt):
    import pickle
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.tensor import DTensor
    import familyd
    import familyd.torch as FT

    client = familyd.Client(socket_path)
    job = FT.init(client)
    out = {}

    def local_grad(p):
        return p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad

    class Net(torch.nn.Module):
        """embedding -> x + attn(norm(x)) -> x + mlp(norm(x)): the device view's families."""

        def __init__(self, mesh, seed):
            super().__init__()
            for fqn, family in MODULES:
                setattr(self, fqn, FT.build_module(client, family, CONFIG, mesh=mesh, fqn=fqn,
                                                   seed=seed))

        def forward(self, ids):
            x = self.embed(ids)
            x = x + self.attn(self.n1(x))
            x = x + self.mlp(self.n2(x))
            return x.pow(2).mean() * 100

    g = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, CONFIG["vocab_size"], (4, 8), generator=g) for _ in range(STEPS)]
    hidden = torch.randn(16, CONFIG["hidden_size"], generator=g)
    chosen = torch.randint(0, CONFIG["num_experts"], (16, 2), generator=g)
    weights = torch.rand(16, 2, generator=g)

    if job.world_size == 2:
        jm = FT.job_mesh(client, job, {"tp": 2})
        model = Net(jm, SAVED)
        dcp.save(model.state_dict(), checkpoint_id=ckpt)
        x = torch.randn(2, 8, CONFIG["hidden_size"], generator=torch.Generator().manual_seed(2))
        for name in COMPILED:
            module = getattr(model, name)
            import torch._dynamo
            torch._dynamo.reset()
            with torch.no_grad():
                eager = module(x)
                start = time.monotonic()
                compiled = torch.compile(module)(x)
                seconds = time.monotonic() - start
                again = torch.compile(module)(x)
                explained = torch._dynamo.explain(module)(x)
            out["compile." + name] = {
                "seconds": seconds, "equal": bool(torch.allclose(compiled, eager, rtol=1e-5,
                                                                  atol=1e-6)),
                "again": bool(torch.allclose(again, eager, rtol=1e-5, atol=1e-6)),
                "graphs": explained.graph_count, "breaks": explained.graph_break_count,
                "reasons": [str(b.reason).splitlines()[0] for b in explained.break_reasons]}
        FT.release(model)
    else:
        jm = FT.job_mesh(client, job, {"dp": 2, "tp": 2}, {"edp_shard": 2, "ep": 2})
        dp = jm.groups["dp"]
        half = dist.get_rank(dp)
        tp_rank = dist.get_rank(jm.groups["tp"])

        def average(model):
            for p in model.parameters():
                expert = isinstance(p, DTensor) and p.device_mesh is jm.expert_mesh
                group = jm.groups["edp_shard" if expert else "dp"]
                grad = local_grad(p)
                dist.all_reduce(grad, group=group)
                grad /= dist.get_world_size(group)

        def full_grads(model):
            return {n: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad)
                    for n, p in model.named_parameters()}

        def close(a, b):
            return all(torch.allclose(a[n], b[n], rtol=1e-5, atol=1e-9) for n in b)

        # --- clip: the device view's families ----------------------------------------------
        sharded, whole = Net(jm, SAVED), Net(None, SAVED)
        sharded(batches[0][2 * half:2 * half + 2]).backward()
        average(sharded)
        norm = torch.nn.utils.clip_grad_norm_(sharded.parameters(), 0.01)
        norm = norm.full_tensor() if isinstance(norm, DTensor) else norm
        whole(batches[0]).backward()
        want = torch.nn.utils.clip_grad_norm_(whole.parameters(), 0.01)
        clip = {"norm": float(norm), "whole": float(want),
                "grads": close(full_grads(sharded), full_grads(whole))}

        # --- clip with experts: a second DeviceMesh ------------------------------------------
        def with_experts(model, experts, mesh):
            model.zero_grad()
            experts.zero_grad()
            if mesh is None:
                rows, ids = slice(0, 16), batches[1]
                scale = 16
            else:
                rows = slice(8 * half + 4 * tp_rank, 8 * half + 4 * tp_rank + 4)
                ids, scale = batches[1][2 * half:2 * half + 2], 8
            y = experts(hidden[rows], chosen[rows], weights[rows])
            (model(ids) + y.pow(2).sum() / scale).backward()

        experts = FT.build_module(client, "grouped_experts", CONFIG, mesh=jm, fqn="experts",
                                  seed=SAVED)
        experts_whole = FT.build_module(client, "grouped_experts", CONFIG, fqn="experts",
                                        seed=SAVED)
        with_experts(sharded, experts, jm)
        average(sharded)
        average(experts)
        params = list(sharded.parameters()) + list(experts.parameters())
        try:
            torch.nn.utils.clip_grad_norm_(params, 0.01)
            clip["torch_experts"] = "no error"
        except Exception as e:  # noqa: BLE001 - the error is what the test reads
            clip["torch_experts"] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0])
        norm = FT.clip_grad_norm_(params, 0.01)
        with_experts(whole, experts_whole, None)
        want = torch.nn.utils.clip_grad_norm_(
            list(whole.parameters()) + list(experts_whole.parameters()), 0.01)
        got_grads = dict(full_grads(sharded), **{"experts." + n: g
                                                 for n, g in full_grads(experts).items()})
        want_grads = dict(full_grads(whole), **{"experts." + n: g
                                                for n, g in full_grads(experts_whole).items()})
        clip.update(experts_norm=float(norm), experts_whole=float(want),
                    experts_grads=close(got_grads, want_grads),
                    experts_unclipped=float(norm) > 0.01)
        out["clip"] = clip

        # --- FSDP2 over dp against data parallelism by hand ----------------------------------
        def train(model, by_hand):
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
            losses = []
            for ids in batches:
                loss = model(ids[2 * half:2 * half + 2])
                optimizer.zero_grad()
                loss.backward()
                if by_hand:
                    average(model)
                optimizer.step()
                mean = loss.detach().clone()
                dist.all_reduce(mean, group=dp)
                losses.append(float(mean) / dist.get_world_size(dp))
            return losses

        reference = train(Net(jm, SAVED), True)
        fsdp_model = Net(jm, SAVED)
        for name, _ in MODULES:
            FT.fully_shard(getattr(fsdp_model, name), jm, "dp")
        FT.fully_shard(fsdp_model, jm, "dp")
        fsdp = {"reference": reference, "losses": train(fsdp_model, False),
                "violations": [v.reason for v in FT.validate_model(client, fsdp_model,
                                                                   context=jm)],
                "placements": {n: [repr(x) for x in p.placements]
                               for n, p in fsdp_model.named_parameters()}}
        refusals = {}
        for name, module, axis in (("experts", experts, "dp"), ("mlp", sharded.mlp, "tp"),
                                   ("experts", experts, "nope")):
            try:
                FT.fully_shard(module, jm, axis)
                refusals["%s/%s" % (name, axis)] = "accepted"
            except FT.FullyShardError as e:
                refusals["%s/%s" % (name, axis)] = str(e)
        with torch.no_grad():
            rows = slice(8 * half + 4 * tp_rank, 8 * half + 4 * tp_rank + 4)
            before = experts(hidden[rows], chosen[rows], weights[rows])
            FT.fully_shard(experts, jm, "edp_shard")
            sharded_placements = [repr(x) for x in experts.gate_up_proj.placements]
            after = experts(hidden[rows], chosen[rows], weights[rows])
        fsdp.update(refusals=refusals, experts_equal=bool(torch.equal(before, after)),
                    experts_placements=sharded_placements,
                    experts_unsharded=[repr(x) for x in experts.gate_up_proj.placements],
                    experts_violations=[v.reason for v in FT.validate_model(client, experts,
                                                                            context=jm)])
        out["fsdp"] = fsdp

        # --- DCP: the tp=2 checkpoint into tp=4, another seed ---------------------------------
        jm4 = FT.job_mesh(client, job, {"tp": 4})
        model = Net(jm4, OTHER)
        want = dict(Net(None, SAVED).named_parameters())
        before = {n: bool(torch.equal(p.full_tensor(), want[n])) for n, p in
                  model.named_parameters()}
        pointers = {n: p.to_local().data_ptr() for n, p in model.named_parameters()}
        state = model.state_dict()
        pickled = {}
        for what, value in (("state_dict", state), ("device_mesh", jm4.device_mesh)):
            try:
                pickle.dumps(value)
                pickled[what] = "ok"
            except Exception as e:  # noqa: BLE001 - reported
                pickled[what] = "%s: %s" % (type(e).__name__, e)
        try:
            dcp.load(state, checkpoint_id=ckpt)
            model.load_state_dict(state)
        except Exception as e:  # noqa: BLE001 - the other checks of this job still report
            out["dcp"] = {"error": "%s: %s" % (type(e).__name__, e)}
        else:
            out["dcp"] = {
                "before": before, "pickled": pickled,
                "after": {n: bool(torch.equal(p.full_tensor(), want[n]))
                          for n, p in model.named_parameters()},
                "placements": {n: [repr(x) for x in p.placements] for n, p in
                               model.named_parameters()},
                "zero_copy": {n: p.to_local().data_ptr() == pointers[n]
                              for n, p in model.named_parameters()}}
    with open(os.path.join(outdir, "%d.json" % job.rank), "w") as f:
        json.dump(out, f)
    dist.barrier()
    dist.destroy_process_group()


def run_job(daemon, world, outdir, ckpt, env):
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(world),
            "--master-addr", "127.0.0.1", "--master-port", str(H.free_port()),
            os.path.abspath(__file__), "--worker", outdir, daemon.socket, ckpt]
    start = time.monotonic()
    try:
        p = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=JOB_TIMEOUT)
    except subprocess.TimeoutExpired as e:
        return None, "timed out after %ds:\n%s" % (JOB_TIMEOUT, (e.output or b"").decode(
            errors="replace")[-6000:])
    out = p.stdout.decode(errors="replace")
    sys.stderr.write("torchrun of %d ranks: %.1f s\n" % (world, time.monotonic() - start))
    if p.returncode != 0:
        return None, "torchrun of %d ranks exited %d:\n%s" % (world, p.returncode, out[-6000:])
    results = {}
    for rank in range(world):
        with open(os.path.join(outdir, "%d.json" % rank)) as f:
            results[rank] = json.load(f)
    return results, out


class TorchEcosystem(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = H.Daemon(registry=REGISTRY, host_devices=4, node_name="itest-ecosystem")
        cls.daemon.start()
        cls.tmp = tempfile.mkdtemp(prefix="fd-ecosystem-", dir=cls.daemon.tmpdir)
        ckpt = os.path.join(cls.tmp, "checkpoint")
        # A cold inductor cache of our own: compile times as a fresh machine sees them.
        env = job_env({"TORCHINDUCTOR_CACHE_DIR": os.path.join(cls.tmp, "inductor"),
                       "TRITON_CACHE_DIR": os.path.join(cls.tmp, "triton")})
        cls.jobs = {}
        for world in (2, 4):
            outdir = os.path.join(cls.tmp, "out%d" % world)
            os.mkdir(outdir)
            cls.jobs[world] = run_job(cls.daemon, world, outdir, ckpt, env)

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)
        cls.daemon.cleanup()

    def results(self, world):
        results, out = self.jobs[world]
        self.assertIsNotNone(results, out)
        return results

    def test_clip_grad_norm(self):
        for rank, r in self.results(4).items():
            c = r["clip"]
            where = "rank %d: %s" % (rank, c)
            self.assertGreater(c["whole"], 0.01, where)            # it clips
            self.assertAlmostEqual(c["norm"], c["whole"], delta=1e-5 * c["whole"], msg=where)
            self.assertTrue(c["grads"], where)
            # torch's own fails to stack the two meshes' norms (its words differ by release:
            # 2.13's "must have the same mesh", 2.9's failed sharding propagation of aten.stack).
            self.assertRegex(c["torch_experts"], r"must have the same mesh|Sharding propagation "
                             r"failed for Op\(op=aten\.stack", where)
            self.assertTrue(c["experts_unclipped"], where)
            self.assertNotAlmostEqual(c["experts_whole"], c["whole"], delta=1e-4, msg=where)
            self.assertAlmostEqual(c["experts_norm"], c["experts_whole"],
                                   delta=1e-5 * c["experts_whole"], msg=where)
            self.assertTrue(c["experts_grads"], where)

    def test_fsdp2_matches_data_parallel(self):
        for rank, r in self.results(4).items():
            f = r["fsdp"]
            where = "rank %d: %s" % (rank, f)
            self.assertEqual(len(f["losses"]), STEPS)
            self.assertNotEqual(f["reference"][0], f["reference"][-1], where)     # it trains
            for got, want in zip(f["losses"], f["reference"]):
                self.assertLessEqual(abs(got - want), 1e-5 * abs(want), where)
            self.assertEqual(f["violations"], [], where)
            # FSDP's sharded parameters: dp (Shard or _StridedShard) x the build's tp placement.
            self.assertEqual(f["placements"]["mlp.down_proj"], ["Shard(dim=0)", "Shard(dim=1)"])
            self.assertEqual(f["placements"]["n1.weight"], ["Shard(dim=0)", "Replicate()"])
            self.assertIn("StridedShard", f["placements"]["mlp.gate_proj"][0])
            refusals = f["refusals"]
            self.assertEqual(
                refusals["experts/dp"],
                "familyd.torch.fully_shard: parameter 'gate_up_proj' is laid out on DeviceMesh "
                "['edp_shard', 'ep'], not on the device view ['dp', 'tp'] that axis 'dp' belongs "
                "to (shard each view's modules over its own data-parallel axis: \"dp\" for the "
                "device view, \"edp_shard\" for the expert view)")
            self.assertEqual(
                refusals["mlp/tp"],
                "familyd.torch.fully_shard: parameter 'gate_proj' is Shard(dim=0) on axis 'tp', "
                "not Replicate(): FSDP shards only a parameter that is replicated over its "
                "data-parallel axis")
            self.assertIn("axis 'nope' is not a dimension of mesh", refusals["experts/nope"])
            self.assertTrue(f["experts_equal"], where)
            # Sharded: edp_shard x ep; after a forward the root stays unsharded: the ep sub-mesh.
            self.assertEqual(f["experts_placements"],
                             ["_StridedShard(dim=0, sf=2)", "Shard(dim=0)"], where)
            self.assertEqual(f["experts_unsharded"], ["Shard(dim=0)"], where)
            self.assertEqual(f["experts_violations"], [], where)

    def test_dcp_tp2_checkpoint_into_tp4(self):
        self.results(2)                                   # the job that saved it
        for rank, r in self.results(4).items():
            d = r["dcp"]
            where = "rank %d: %s" % (rank, d)
            self.assertEqual(len(d["after"]), 10, where)
            self.assertNotIn("error", d, where)
            # Another seed, other values (but the norms' weights: ones on every seed).
            self.assertFalse(any(v for n, v in d["before"].items() if n[:3] not in ("n1.", "n2.")),
                             where)
            self.assertTrue(all(d["after"].values()), where)
            self.assertEqual(d["placements"]["attn.wq"], ["Shard(dim=0)"], where)
            self.assertTrue(all(d["zero_copy"].values()), where)
            self.assertEqual(d["pickled"], {"state_dict": "ok", "device_mesh": "ok"}, where)

    def test_compile_matches_eager(self):
        for rank, r in self.results(2).items():
            for name in COMPILED:
                c = r["compile." + name]
                where = "rank %d, %s: %s" % (rank, name, c)
                self.assertTrue(c["equal"], where)
                self.assertTrue(c["again"], where)
                self.assertEqual(c["breaks"], 0, where)
                self.assertEqual(c["graphs"], 1, where)
                sys.stderr.write("compile %s on rank %d: %.1f s\n" % (name, rank, c["seconds"]))


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3], sys.argv[4])
        sys.exit(0)
    unittest.main(verbosity=2)
