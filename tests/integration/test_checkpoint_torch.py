#!/usr/bin/python3
"""familyd.torch.load_pretrained on 4 torchrun workers (dp=2 x tp=2) gives the logits and the
loss of the same model loaded whole by plain torch in one process from the same files.

Then the job's output: save_checkpoint of the F32 model from dp=2 x tp=2 writes the
checkpoint's own names and bytes back (gathered, rank 0 writing), and a second job loads it
into tp=4 with the reference's logits; that job also builds a replacement with
copy_weights=True, whole in each process and over tp=4: its values are the source module's.

The checkpoint is a small Llama (2 layers, GQA, SwiGLU, untied lm_head) written by the
safetensors library (checkpoint_files.py), split over two files with an index and a
config.json, once in F32 and once in BF16. Each worker builds the model from each checkpoint
through familyd (one deposit per checkpoint and process, every module's Build naming its token;
trainable=False: the node's processes share one build per module) and runs the same tokens
through it; then the F32 model again as training handouts (trainable=True: each process's
own writable build of its rank) whose logits must be the same and whose parameters all get
gradients. The reference here reads the files with safetensors.torch.load_file and computes
Llama's forward with plain torch ops (RMSNorm, RoPE with rotate_half, causal grouped-query
attention, SwiGLU, lm_head), in float64 from the stored values. Tolerances, of the largest
logit: float32 1e-5 (measured 5.8e-7 to 6.2e-7), the loss 1e-5 relative; bfloat16, where the workers
compute in bfloat16, 6e-2 (measured 1.5e-2 to 2e-2), the loss 5e-3 (measured 6e-4).

Daemon: deploy/registry, --host-devices 4, one node; the workers reach its shard socket
through $FAMILYD_SHARD_SOCKET.
"""

import json
import os
import shutil
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import familyd_harness as H  # noqa: E402
import torch_job_common as C  # noqa: E402
import checkpoint_files as CF  # noqa: E402

REGISTRY = os.path.join(H.SOURCE_ROOT, "deploy", "registry")
TIMEOUT = 300
CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 64,
          "hidden_size": 32, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 4,
          "intermediate_size": 48, "num_hidden_layers": 2, "rms_norm_eps": 1e-5,
          "rope_theta": 10000.0, "tie_word_embeddings": False, "initializer_range": 0.02}
BATCH, SEQ = 2, 12
# checkpoint dtype -> the parameters' dtype the workers build it in
DTYPES = {"F32": "float32", "BF16": "bfloat16"}
# FQNs built (prefixes in the checkpoint) and the member each resolves to on dp=2 x tp=2.
MEMBERS = {"model.embed_tokens": "vocab_parallel", "model.norm": "plain",
           "lm_head": "vocab_parallel"}
for _i in range(CONFIG["num_hidden_layers"]):
    MEMBERS.update({"model.layers.%d.input_layernorm" % _i: "plain",
                    "model.layers.%d.self_attn" % _i: "eager",
                    "model.layers.%d.post_attention_layernorm" % _i: "plain",
                    "model.layers.%d.mlp" % _i: "tensor_parallel"})


def tokens():
    import torch
    g = torch.Generator().manual_seed(1234)
    return torch.randint(0, CONFIG["vocab_size"], (BATCH, SEQ), generator=g)


def worker(outdir, socket_path, ckpt_root):
    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    import familyd
    import familyd.torch as FT

    client = familyd.Client(socket_path)
    job = FT.init(client)
    mesh = FT.job_mesh(client, job, {"dp": 2, "tp": 2})
    ids = tokens()
    out = {"rank": job.rank}
    for ckpt, dtype in DTYPES.items():
        model = FT.load_pretrained(client, os.path.join(ckpt_root, ckpt.lower()), mesh=mesh)
        with torch.no_grad():
            logits = model(ids)
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                                   ids[:, 1:].reshape(-1))
        np.save(os.path.join(outdir, "%s-%d.npy" % (ckpt, job.rank)),
                logits.float().numpy())
        infos = {FT.build_info(m).fqn: FT.build_info(m) for m in model.modules()
                 if FT.build_info(m) is not None}
        out[ckpt] = {
            "dtype": str(logits.dtype).replace("torch.", ""),
            "param_dtypes": sorted({str(p.dtype).replace("torch.", "")
                                    for p in model.parameters()}),
            "trainable": any(p.requires_grad for p in model.parameters()),
            "loss": float(loss),
            "members": {fqn: i.member.variant for fqn, i in infos.items()},
            "builds": {fqn: i.build_id for fqn, i in infos.items()},
        }
        FT.release(model)
        dist.barrier()
    # The job's output: save_checkpoint of the F32 model (gathered, written by rank 0) under
    # the checkpoint's own names; worker_tp4 loads it into another mesh.
    model = FT.load_pretrained(client, os.path.join(ckpt_root, "f32"), mesh=mesh)
    out["saved"] = FT.save_checkpoint(model, os.path.join(ckpt_root, "saved"), config=CONFIG)
    FT.release(model)
    dist.barrier()
    # Training handouts from the same checkpoint: each process's own writable build of its
    # rank, the same logits, and gradients reach every parameter.
    model = FT.load_pretrained(client, os.path.join(ckpt_root, "f32"), mesh=mesh, trainable=True)
    logits = model(ids)
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    loss.backward()
    np.save(os.path.join(outdir, "F32-trainable-%d.npy" % job.rank), logits.detach().numpy())
    out["F32-trainable"] = {
        "loss": float(loss),
        "grads": all(p.requires_grad and p.grad is not None for p in model.parameters()),
        "builds": {FT.build_info(m).fqn: FT.build_info(m).build_id for m in model.modules()
                   if FT.build_info(m) is not None},
    }
    FT.release(model)
    dist.barrier()
    out["deposits"] = len(client._deposits)
    with open(os.path.join(outdir, "%d.json" % job.rank), "w") as f:
        json.dump(out, f)
    dist.barrier()
    dist.destroy_process_group()
    client.close()


def worker_tp4(outdir, socket_path, ckpt_root):
    """The saved checkpoint into tp=4 (every rank its quarter of heads, MLP and vocabulary);
    then copy_weights=True of a source module, whole in each process and over tp=4."""
    import numpy as np
    import torch
    import torch.distributed as dist
    import familyd
    import familyd.torch as FT

    client = familyd.Client(socket_path)
    job = FT.init(client)
    mesh = FT.job_mesh(client, job, {"tp": 4})
    model = FT.load_pretrained(client, os.path.join(ckpt_root, "saved"), mesh=mesh)
    with torch.no_grad():
        logits = model(tokens())
    np.save(os.path.join(outdir, "saved-tp4-%d.npy" % job.rank), logits.float().numpy())
    FT.release(model)
    dist.barrier()
    g = torch.Generator().manual_seed(99)
    src = torch.nn.Module()
    inter, hidden = CONFIG["intermediate_size"], CONFIG["hidden_size"]
    for name, shape in (("gate_proj", (inter, hidden)), ("up_proj", (inter, hidden)),
                        ("down_proj", (hidden, inter))):
        setattr(src, name, torch.nn.Parameter(torch.randn(shape, generator=g)))
    src.config = {k: CONFIG[k] for k in ("hidden_size", "intermediate_size",
                                         "initializer_range")}
    equal = {}
    for where, m_mesh in (("one rank", None), ("tp=4", mesh)):
        m = FT.build_module(client, "mlp", module=src, mesh=m_mesh, fqn="copy.mlp",
                            copy_weights=True)
        got = {n: (p.full_tensor() if isinstance(p, torch.distributed.tensor.DTensor) else p)
               for n, p in m.named_parameters()}
        equal[where] = {n: bool(torch.equal(got[n].detach(), p.detach()))
                        for n, p in src.named_parameters()}
        equal[where]["local"] = [list(p.to_local().shape) if hasattr(p, "to_local")
                                 else list(p.shape) for p in m.parameters()]
        FT.release(m)
        dist.barrier()
    with open(os.path.join(outdir, "tp4-%d.json" % job.rank), "w") as f:
        json.dump({"copy": equal}, f)
    dist.barrier()
    dist.destroy_process_group()
    client.close()


def reference(ckpt_dir, ids):
    """Logits and loss of the Llama in ckpt_dir, whole, plain torch, float64."""
    import torch
    import torch.nn.functional as F
    from safetensors.torch import load_file

    with open(os.path.join(ckpt_dir, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(ckpt_dir, CF.INDEX)) as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    w = {}
    for name in files:
        w.update({k: v.double() for k, v in load_file(os.path.join(ckpt_dir, name)).items()})
    heads, kv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps = cfg["rms_norm_eps"]

    def rms(x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

    def rotate_half(x):
        return torch.cat((-x[..., hd // 2:], x[..., :hd // 2]), dim=-1)

    b, s = ids.shape
    inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    freqs = torch.arange(s, dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = torch.cat((freqs, freqs), -1).cos(), torch.cat((freqs, freqs), -1).sin()
    causal = torch.ones(s, s, dtype=torch.bool).tril()
    x = w["model.embed_tokens.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % i
        h = rms(x, w[p + "input_layernorm.weight"])
        q = (h @ w[p + "self_attn.q_proj.weight"].T).view(b, s, heads, hd).transpose(1, 2)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).view(b, s, kv, hd).transpose(1, 2)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).view(b, s, kv, hd).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(heads // kv, dim=1)
        v = v.repeat_interleave(heads // kv, dim=1)
        scores = (q @ k.transpose(-1, -2)) / hd ** 0.5
        att = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1) @ v
        x = x + att.transpose(1, 2).reshape(b, s, heads * hd) @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        gate = F.silu(h @ w[p + "mlp.gate_proj.weight"].T)
        x = x + (gate * (h @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    logits = rms(x, w["model.norm.weight"]) @ w["lm_head.weight"].T
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    return logits.numpy(), float(loss)


class LoadPretrained(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        C.require_torch()
        cls.daemon = H.Daemon(registry=REGISTRY, host_devices=4, node_name="itest-ckpt-torch")
        cls.daemon.start()
        cls.ckpt = os.path.join(cls.daemon.tmpdir, "ckpt")
        tensors = CF.llama_tensors(CONFIG, layers=CONFIG["num_hidden_layers"], seed=77)
        for ckpt, dtype in DTYPES.items():
            CF.write_checkpoint(os.path.join(cls.ckpt, ckpt.lower()), tensors, ckpt, files=2,
                                config=dict(CONFIG, torch_dtype=dtype))
        cls.outdir = os.path.join(cls.daemon.tmpdir, "job")
        os.mkdir(cls.outdir)
        env = C.job_env({"FAMILYD_SHARD_SOCKET": cls.daemon.shard_socket})
        cls.rc, cls.out = C.run(C.launcher(4, C.free_port(), [
            os.path.abspath(__file__), "--worker", cls.outdir, cls.daemon.socket, cls.ckpt]),
            timeout=TIMEOUT, env=env)
        cls.results = {}
        for rank in range(4):
            path = os.path.join(cls.outdir, "%d.json" % rank)
            if os.path.exists(path):
                with open(path) as f:
                    cls.results[rank] = json.load(f)
        # The saved checkpoint into tp=4, in a job of its own.
        cls.rc4, cls.out4 = (None, "") if cls.rc != 0 else C.run(C.launcher(4, C.free_port(), [
            os.path.abspath(__file__), "--worker-tp4", cls.outdir, cls.daemon.socket, cls.ckpt]),
            timeout=TIMEOUT, env=env)
        cls.results4 = {}
        for rank in range(4):
            path = os.path.join(cls.outdir, "tp4-%d.json" % rank)
            if os.path.exists(path):
                with open(path) as f:
                    cls.results4[rank] = json.load(f)

    @classmethod
    def tearDownClass(cls):
        try:
            cls.daemon.stop_checked()
        finally:
            shutil.rmtree(cls.ckpt, ignore_errors=True)

    def ranks(self):
        self.assertEqual(self.rc, 0, "the job failed:\n" + self.out[-6000:])
        self.assertEqual(sorted(self.results), [0, 1, 2, 3], self.out[-6000:])
        return self.results

    def ranks4(self):
        self.ranks()
        self.assertEqual(self.rc4, 0, "the tp=4 job failed:\n" + self.out4[-6000:])
        self.assertEqual(sorted(self.results4), [0, 1, 2, 3], self.out4[-6000:])
        return self.results4

    def test_saved_checkpoint_loads_into_tp4(self):
        """save_checkpoint from dp=2 x tp=2, then load_pretrained into tp=4: the same names
        as the source checkpoint, byte for byte, and the same logits as the reference."""
        import numpy as np
        from safetensors.numpy import load_file
        self.ranks4()
        saved = os.path.join(self.ckpt, "saved")
        got = {}
        for n in os.listdir(saved):
            if n.endswith(".safetensors"):
                got.update(load_file(os.path.join(saved, n)))
        src = {}
        for n in os.listdir(os.path.join(self.ckpt, "f32")):
            if n.endswith(".safetensors"):
                src.update(load_file(os.path.join(self.ckpt, "f32", n)))
        self.assertEqual(sorted(got), sorted(src))
        for k in src:
            self.assertEqual(got[k].tobytes(), src[k].tobytes(), k)
        for r in self.results.values():
            self.assertEqual(sorted(r["saved"]), sorted(src))
        want, _ = reference(os.path.join(self.ckpt, "f32"), tokens())
        scale = float(np.abs(want).max())
        for rank in range(4):
            logits = np.load(os.path.join(self.outdir, "saved-tp4-%d.npy" % rank))
            self.assertLessEqual(float(np.abs(logits - want).max()), 1e-5 * scale, rank)

    def test_copy_weights_one_rank_and_tp4(self):
        for rank, r in self.ranks4().items():
            for where, equal in r["copy"].items():
                local = equal.pop("local")
                self.assertEqual(equal, {"gate_proj": True, "up_proj": True,
                                         "down_proj": True}, "rank %d, %s" % (rank, where))
                inter = CONFIG["intermediate_size"] // (4 if where == "tp=4" else 1)
                self.assertEqual(local[0], [inter, CONFIG["hidden_size"]], (rank, where))

    def check_logits(self, ckpt, logits_tol, loss_tol, key=None):
        import numpy as np
        key = key or ckpt
        want, want_loss = reference(os.path.join(self.ckpt, ckpt.lower()), tokens())
        scale = float(np.abs(want).max())
        self.assertGreater(scale, 0.5)
        for rank, r in self.ranks().items():
            got = np.load(os.path.join(self.outdir, "%s-%d.npy" % (key, rank)))
            self.assertEqual(got.shape, want.shape)
            diff = float(np.abs(got - want).max())
            sys.stderr.write("%s, rank %d: logits within %.3g of the largest (%.3g), loss %r "
                             "against %r\n" % (key, rank, diff / scale, scale, r[key]["loss"],
                                                want_loss))
            self.assertLessEqual(diff, logits_tol * scale,
                                 "%s, rank %d: logits differ by %g (largest logit %g)"
                                 % (key, rank, diff, scale))
            self.assertLessEqual(abs(r[key]["loss"] - want_loss), loss_tol * abs(want_loss),
                                 "%s, rank %d: loss %r, reference %r"
                                 % (key, rank, r[key]["loss"], want_loss))

    def test_f32_logits_equal_the_reference(self):
        self.check_logits("F32", 1e-5, 1e-5)

    def test_bf16_logits_equal_the_reference(self):
        self.check_logits("BF16", 6e-2, 5e-3)

    def test_training_handouts_from_the_checkpoint(self):
        self.check_logits("F32", 1e-5, 1e-5, key="F32-trainable")
        builds = []
        for rank, r in self.ranks().items():
            self.assertTrue(r["F32-trainable"]["grads"], "rank %d" % rank)
            builds.append(set(r["F32-trainable"]["builds"].values()))
            self.assertEqual(len(builds[-1]), len(MEMBERS))
        # Each process's own builds: no two processes share one.
        self.assertEqual(len(set().union(*builds)), 4 * len(MEMBERS))

    def test_modules_dtypes_and_members(self):
        for rank, r in self.ranks().items():
            for ckpt, dtype in DTYPES.items():
                got = r[ckpt]
                self.assertEqual(got["dtype"], dtype, "%s, rank %d" % (ckpt, rank))
                self.assertEqual(got["param_dtypes"], [dtype], "%s, rank %d" % (ckpt, rank))
                self.assertFalse(got["trainable"])
                self.assertEqual(got["members"], MEMBERS, "%s, rank %d" % (ckpt, rank))

    def test_one_build_per_module_and_one_deposit_per_checkpoint(self):
        results = self.ranks()
        for ckpt in DTYPES:
            ids = [r[ckpt]["builds"] for r in results.values()]
            self.assertTrue(all(x == ids[0] for x in ids), "%s: builds differ across the node's "
                            "processes: %s" % (ckpt, ids))
            self.assertEqual(len(set(ids[0].values())), len(MEMBERS))
        for rank, r in results.items():
            self.assertEqual(r["deposits"], len(DTYPES), "rank %d" % rank)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3], sys.argv[4])
        sys.exit(0)
    if len(sys.argv) == 5 and sys.argv[1] == "--worker-tp4":
        worker_tp4(sys.argv[2], sys.argv[3], sys.argv[4])
        sys.exit(0)
    unittest.main(verbosity=2)
