#!/usr/bin/python3
"""familyd.torch.modules: the reference PyTorch members of the example registry, for real.

No daemon: real torch (Debian's 1.13, CPU) and real gloo process groups. For every parallel
member, worker processes of this file (started with subprocess and env://, since
torch.distributed.run does not work on this torch with Python 3.11) each take their shards of
one seeded full set of weights, run forward and backward, and save what they got; the parent
compares the outputs and the gradients (the ranks' weight gradients concatenated along the shard
dim) with the unsharded member on the full weights in this process, within 1e-5 relative to the
largest value. Worlds of 2 and 4 ranks, uneven shards (an empty one included), a rank with no
tokens. The plain members are checked against formulas written here; names and local shapes
against deploy/registry; the refusals raise what they say. (The flash, ring, fused and mxfp8
members: test_torch_members.py.)
"""

import faulthandler
import importlib
import inspect
import math
import os
import socket
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_ROOT = os.environ.get("FAMILYD_SOURCE_ROOT") or os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(SOURCE_ROOT, "client", "python"))
SKIP = 77

try:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
except ImportError:  # pragma: no cover - depends on the machine
    sys.stderr.write("test_torch_modules: torch missing (apt-get install python3-torch)\n")
    sys.exit(1 if os.environ.get("CI") else SKIP)

from familyd.torch import modules as M  # noqa: E402

sys.path.insert(0, HERE)
from torch_job_common import Close  # noqa: E402

REGISTRY = os.path.join(SOURCE_ROOT, "deploy", "registry")
RTOL = 1e-5
WORKER_TIMEOUT = 150

BASE = {"hidden_size": 16, "intermediate_size": 22, "moe_intermediate_size": 8,
        "num_experts": 8, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 4,
        "vocab_size": 37, "initializer_range": 0.02}


def cfg(**over):
    c = dict(BASE)
    c.update(over)
    return c


# --- the cases: one parallel member against its unsharded twin ----------------------------------

def _gen(seed):
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def _routing(rank, tokens, num_experts, top_k, hidden):
    g = _gen(1000 + rank)
    x = torch.randn(tokens, hidden, generator=g)
    idx = torch.stack([torch.randperm(num_experts, generator=g)[:top_k] for _ in range(tokens)]) \
        if tokens else torch.zeros((0, top_k), dtype=torch.int64)
    w = torch.rand(tokens, top_k, generator=g)
    return (x, idx, w)


def _dense(seed, shape):
    return (torch.randn(*shape, generator=_gen(2000 + seed)),)


def _tokens(seed, shape, vocab):
    ids = torch.randint(0, vocab, shape, generator=_gen(3000 + seed))
    ids.view(-1)[:2] = torch.tensor([0, vocab - 1])      # both ends of the vocabulary
    return (ids,)


EXPERT_TOKENS = {2: [6, 9], 4: [5, 0, 7, 3]}       # rank 1 of 4 routes nothing
PAIRS = {"experts_pairs": "experts", "mlp_pairs": "mlp"}   # over groups {0, 1} and {2, 3}
BF16 = {"experts_bf16": "experts", "mlp_bf16": "mlp", "embedding_bf16": "embedding"}
BF16_RTOL = 2e-2           # bfloat16 keeps 8 bits: partial sums round differently


def dtype_of(name):
    return torch.bfloat16 if name in BF16 else torch.float32


def group_size(name, world):
    return 2 if name in PAIRS else world


def case(name, world):
    """(axis, part class, full class, config, kwargs, {param: shard dim}, inputs(seed),
    replicated inputs?). Replicated inputs (tp) are the same on the ranks of a group (seed: the
    group's index), the others (ep) are each rank's own (seed: the rank)."""
    name = PAIRS.get(name, BF16.get(name, name))
    if name == "experts":                       # 8 experts over 2 or 4: even
        c = cfg()
        return ("ep", M.EPGroupedExperts, M.GroupedExpertsLocal, c, {},
                {"gate_up_proj": 0, "down_proj": 0},
                lambda r: _routing(r, EXPERT_TOKENS[world][r], 8, 2, 16), False)
    if name == "experts_uneven":                # 6 experts over 4: 2, 2, 2, 0
        c = cfg(num_experts=6)
        return ("ep", M.EPGroupedExperts, M.GroupedExpertsLocal, c, {"activation": "silu"},
                {"gate_up_proj": 0, "down_proj": 0},
                lambda r: _routing(r, EXPERT_TOKENS[world][r], 6, 3, 16), False)
    if name == "mlp":                           # intermediate 22: 11+11, or 6+6+6+4
        return ("tp", M.TPSwiGLUMLP, M.PlainSwiGLUMLP, cfg(), {},
                {"gate_proj": 0, "up_proj": 0, "down_proj": 1},
                lambda r: _dense(r, (2, 5, 16)), True)
    if name in ("attention", "attention_window"):
        c = cfg() if world == 2 else cfg(num_attention_heads=8, num_key_value_heads=4, head_dim=2)
        kw = {"rope_theta": 10000.0, "window": 3} if name == "attention_window" else {}
        return ("tp", M.EagerGQAAttention, M.EagerGQAAttention, c, kw,
                {"wq": 0, "wk": 0, "wv": 0, "wo": 1},
                lambda r: _dense(r, (2, 7, 16)), True)
    if name == "embedding":                     # vocab 37: 19+18, or 10+10+10+7
        return ("tp", M.VocabParallelEmbedding, M.PlainEmbedding, cfg(), {}, {"weight": 0},
                lambda r: _tokens(r, (3, 6), 37), True)
    raise KeyError(name)


def shard_range(length, parts, index):
    """torch.chunk's split, as familyd's shard(d) makes it (written here independently)."""
    chunk = (length + parts - 1) // parts
    return min(length, index * chunk), min(length, (index + 1) * chunk)


def full_weights(module):
    g = _gen(4000)
    return {n: (torch.randn(p.shape, generator=g) * 0.5).to(p.dtype)
            for n, p in module.named_parameters()}


def load(module, weights):
    with torch.no_grad():
        for n, p in module.named_parameters():
            assert p.shape == weights[n].shape, (n, p.shape, weights[n].shape)
            p.copy_(weights[n])


def run_once(module, inputs, seed, dtype=torch.float32):
    """Forward and backward of sum(out * probe): (out, input grads, parameter grads)."""
    inputs = [t.to(dtype).requires_grad_() if t.is_floating_point() else t.clone()
              for t in inputs]
    out = module(*inputs)
    probe = torch.randn(out.shape, generator=_gen(5000 + seed)).to(out.dtype)
    (out * probe).sum().backward()
    return (out.detach(), [t.grad for t in inputs if t.is_floating_point()],
            {n: p.grad.clone() for n, p in module.named_parameters()})


# --- worker: one rank of a gloo world -----------------------------------------------------------

def worker(outdir, names):
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world)
    results = {}
    for name in names:
        axis, part_cls, full_cls, c, kw, shards, inputs, replicated = case(name, world)
        size = group_size(name, world)
        group = dist.group.WORLD
        if size < world:                          # every rank makes every group, in order
            groups = [dist.new_group(list(range(b, b + size))) for b in range(0, world, size)]
            group = groups[rank // size]
        dtype = dtype_of(name)
        weights = full_weights(full_cls(config=c, dtype=dtype, **kw))
        context = M.ParallelContext(groups={axis: group}, **{axis + "_size": size})
        part = part_cls(config=c, context=context, module_fqn="layers.0." + name, dtype=dtype,
                        **kw)
        local = {}
        for n, t in weights.items():
            start, stop = shard_range(t.shape[shards[n]], size, rank % size)
            local[n] = t.narrow(shards[n], start, stop - start)
        load(part, local)
        seed = rank // size if replicated else rank   # the same loss on a tp group's ranks
        results[name] = run_once(part, inputs(seed), seed, dtype)
    try:
        M.TPSwiGLUMLP(config=cfg(), context=M.ParallelContext(
            tp_size=world + 1, groups={"tp": dist.group.WORLD}))
    except ValueError as e:
        results["mismatch"] = str(e)
    torch.save(results, os.path.join(outdir, "rank%d.pt" % rank))
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(world, names):
    """Run the cases on `world` worker processes; {rank: {case: (out, in_grads, grads)}}."""
    with tempfile.TemporaryDirectory(prefix="fd-torch-") as outdir:
        return _launch(world, names, outdir)


def _launch(world, names, outdir):
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                   WORLD_SIZE=str(world), OMP_NUM_THREADS="1")
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")     # not whatever the host name resolves to
        procs.append(subprocess.Popen(
            [sys.executable, "-X", "faulthandler", os.path.abspath(__file__), "--worker", outdir,
             ",".join(names)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    logs = []
    try:
        for p in procs:
            try:
                out, _ = p.communicate(timeout=WORKER_TIMEOUT)
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                out, _ = p.communicate()
                out += b"\n(killed after %d s)" % WORKER_TIMEOUT
            logs.append(out.decode(errors="replace"))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
            p.stdout.close()
    failed = ["worker %d of %d exited %s:\n%s" % (rank, world, p.returncode, logs[rank])
              for rank, p in enumerate(procs) if p.returncode != 0]
    if failed:
        raise AssertionError("\n".join(failed))
    return {r: torch.load(os.path.join(outdir, "rank%d.pt" % r)) for r in range(world)}




class ParallelWorld(Close):
    WORLD = None
    CASES = ()
    results = None

    @classmethod
    def setUpClass(cls):
        cls.results = launch(cls.WORLD, cls.CASES)

    def check(self, name):
        world = self.WORLD
        size = group_size(name, world)
        axis, _, full_cls, c, kw, shards, inputs, replicated = case(name, world)
        dtype = dtype_of(name)
        rtol = BF16_RTOL if dtype == torch.bfloat16 else RTOL
        for b in range(world // size):
            members = range(b * size, (b + 1) * size)
            full = full_cls(config=c, dtype=dtype, **kw)
            load(full, full_weights(full))
            ref = {}
            for s in ([b] if replicated else members):  # one backward over the group's tokens
                ref[s] = run_once(full, inputs(s), s, dtype)
            for r in members:
                got_out, got_in, _ = self.results[r][name]
                want_out, want_in, _ = ref[b if replicated else r]
                self.assertClose(got_out, want_out, "%s rank %d output" % (name, r), rtol)
                for i, (g, w) in enumerate(zip(got_in, want_in)):
                    self.assertClose(g, w, "%s rank %d grad of input %d" % (name, r, i), rtol)
            for n, p in full.named_parameters():
                gathered = torch.cat([self.results[r][name][2][n] for r in members], shards[n])
                self.assertClose(gathered, p.grad, "%s grad of %s (gathered over ranks %s)"
                                 % (name, n, list(members)), rtol)


class TestParallelTwo(ParallelWorld, unittest.TestCase):
    """Two ranks: every parallel member, attention with and without a sliding window."""

    WORLD = 2
    CASES = ("experts", "mlp", "attention", "attention_window", "embedding", "experts_bf16",
             "mlp_bf16", "embedding_bf16")

    def test_ep_grouped_experts(self):
        self.check("experts")

    def test_tp_swiglu_mlp(self):
        self.check("mlp")

    def test_eager_gqa_attention_tp(self):
        self.check("attention")

    def test_eager_gqa_attention_tp_window(self):
        self.check("attention_window")

    def test_vocab_parallel_embedding(self):
        self.check("embedding")

    def test_bfloat16_over_gloo(self):
        """gloo has no bfloat16 on torch 1.13: the members carry it over as float32."""
        self.check("experts_bf16")
        self.check("mlp_bf16")
        self.check("embedding_bf16")
        self.assertEqual(self.results[0]["experts_bf16"][0].dtype, torch.bfloat16)

    def test_group_size_must_match(self):
        self.assertEqual(self.results[0]["mismatch"],
                         "TPSwiGLUMLP: tp_size=3 but the tp group has 2 ranks")


class TestParallelFour(ParallelWorld, unittest.TestCase):
    """Four ranks: uneven shards (6 experts: 2, 2, 2, 0; vocab 37; intermediate 22), a rank
    routing no tokens, one kv head per rank."""

    WORLD = 4
    CASES = ("experts", "experts_uneven", "mlp", "attention", "embedding", "experts_pairs",
             "mlp_pairs")

    def test_ep_grouped_experts(self):
        self.check("experts")

    def test_ep_grouped_experts_uneven_and_empty(self):
        self.check("experts_uneven")
        self.assertEqual(tuple(self.results[3]["experts_uneven"][2]["gate_up_proj"].shape),
                         (0, 16, 16))

    def test_tp_swiglu_mlp_uneven(self):
        self.check("mlp")

    def test_eager_gqa_attention_tp(self):
        self.check("attention")

    def test_vocab_parallel_embedding_uneven(self):
        self.check("embedding")

    def test_members_use_their_group(self):
        """Two groups of two: each pair is its own ep (or tp) world, with its own tokens."""
        self.check("experts_pairs")
        self.check("mlp_pairs")


# --- the plain members against formulas written here -------------------------------------------

def seeded(module, seed=7):
    g = _gen(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return module


def naive_rope(x, positions, theta):
    """x [S, D]: rotate each pair (i, i + D/2) by positions * theta^(-2i/D)."""
    s, d = x.shape
    out = x.clone()
    for t in range(s):
        for i in range(d // 2):
            a = float(positions[t]) * theta ** (-2.0 * i / d)
            x1, x2 = float(x[t, i]), float(x[t, i + d // 2])
            out[t, i] = x1 * math.cos(a) - x2 * math.sin(a)
            out[t, i + d // 2] = x2 * math.cos(a) + x1 * math.sin(a)
    return out


def naive_attention(m, x, theta, window):
    """One sequence x [S, H], head by head and query by query."""
    s, d = x.shape[0], m.head_dim
    q = (x @ m.wq.t()).view(s, m.num_heads, d)
    k = (x @ m.wk.t()).view(s, m.num_kv_heads, d)
    v = (x @ m.wv.t()).view(s, m.num_kv_heads, d)
    pos = torch.arange(s)
    heads = []
    for h in range(m.num_heads):
        kv = h // (m.num_heads // m.num_kv_heads)
        qh, kh = naive_rope(q[:, h], pos, theta), naive_rope(k[:, kv], pos, theta)
        rows = []
        for i in range(s):
            lo = 0 if window == 0 else max(0, i - window + 1)
            w = torch.softmax(kh[lo:i + 1] @ qh[i] / math.sqrt(d), dim=0)
            rows.append(w @ v[lo:i + 1, kv])
        heads.append(torch.stack(rows))
    return torch.cat(heads, dim=1) @ m.wo.t()


class TestPlainMembers(Close, unittest.TestCase):
    def test_grouped_experts_local_is_the_per_token_sum(self):
        m = seeded(M.GroupedExpertsLocal(config=cfg(), dtype=torch.float64))
        x, idx, w = (t.double() if t.is_floating_point() else t for t in _routing(0, 9, 8, 2, 16))
        want = torch.zeros_like(x)
        for t in range(x.shape[0]):
            for s in range(idx.shape[1]):
                e = int(idx[t, s])
                h = x[t] @ m.gate_up_proj[e]
                want[t] += w[t, s] * ((F.silu(h[:8]) * h[8:]) @ m.down_proj[e])
        self.assertClose(m(x, idx, w).detach(), want.detach(), "GroupedExpertsLocal")
        gelu = seeded(M.GroupedExpertsLocal(config=cfg(), activation="gelu", dtype=torch.float64))
        h = x[0] @ gelu.gate_up_proj[int(idx[0, 0])]
        one = (F.gelu(h[:8]) * h[8:]) @ gelu.down_proj[int(idx[0, 0])]
        self.assertClose(gelu(x[:1], idx[:1, :1], torch.ones(1, 1, dtype=torch.float64))[0]
                         .detach(), one.detach(), "activation gelu")

    def test_plain_swiglu_mlp(self):
        m = seeded(M.PlainSwiGLUMLP(config=cfg(), dtype=torch.float64))
        x = torch.randn(3, 16, dtype=torch.float64)
        want = F.linear(F.silu(F.linear(x, m.gate_proj)) * F.linear(x, m.up_proj), m.down_proj)
        self.assertClose(m(x).detach(), want.detach(), "PlainSwiGLUMLP")

    def test_eager_attention_rope_causal_and_window(self):
        for window, theta in ((0, 500000.0), (3, 10000.0)):
            m = seeded(M.EagerGQAAttention(config=cfg(), rope_theta=theta, window=window,
                                           dtype=torch.float64))
            x = torch.randn(6, 16, dtype=torch.float64)
            want = naive_attention(m, x, theta, window)
            self.assertClose(m(x).detach(), want.detach(), "attention window=%d" % window)
            batched = m(torch.stack([x, x]))
            self.assertClose(batched[1].detach(), want.detach(), "batched window=%d" % window)
        later = x.clone()
        later[4:] += 1.0                       # window 3: position 3 sees 1..3, not 0 nor 4
        earlier = x.clone()
        earlier[0] += 1.0
        base = m(x).detach()
        self.assertClose(m(later)[:4].detach(), base[:4], "causal")
        self.assertClose(m(earlier)[3:].detach(), base[3:], "window")
        self.assertGreater(float((m(earlier)[2] - base[2]).abs().max()), 1e-6)

    def test_embedding_and_rmsnorm(self):
        e = seeded(M.PlainEmbedding(config=cfg()))
        ids = torch.tensor([[0, 36, 5], [5, 1, 2]])
        self.assertTrue(torch.equal(e(ids).detach(), e.weight.detach()[ids]))
        with self.assertRaisesRegex(ValueError, r"PlainEmbedding: token id 37 is not in \[0, 37\)"):
            e(torch.tensor([37]))
        n = M.PlainRMSNorm(config=cfg())
        self.assertTrue(torch.equal(n.weight.detach(), torch.ones(16)))
        self.assertEqual(n.eps, 1e-6)
        n = seeded(M.PlainRMSNorm(config=cfg(rms_norm_eps=1e-5), dtype=torch.float64))
        self.assertEqual(n.eps, 1e-5)
        x = torch.randn(4, 16, dtype=torch.float64)
        want = x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-5) * n.weight
        self.assertClose(n(x).detach(), want.detach(), "RMSNorm")
        bf = M.PlainRMSNorm(config=cfg())(x.bfloat16())
        self.assertEqual(bf.dtype, torch.bfloat16)


# --- the registry's names and local shapes; refusals --------------------------------------------

def registry():
    import yaml
    families = {}
    for f in sorted(os.listdir(REGISTRY)):
        if f.endswith(".yaml"):
            with open(os.path.join(REGISTRY, f)) as fh:
                doc = yaml.safe_load(fh)
            families[doc["name"]] = doc
    return families


class TestRegistryAgreement(unittest.TestCase):
    def test_every_member_is_here_with_the_registry_names(self):
        seen = set()
        for fam in registry().values():
            for vname, variant in fam["variants"].items():
                path, cls_name = variant["constructor"].rsplit(".", 1)
                self.assertEqual(path, "familyd.torch.modules", variant["constructor"])
                cls = getattr(importlib.import_module(path), cls_name)
                self.assertIs(cls, getattr(M, cls_name))
                seen.add(cls_name)
                accepted = [n for n in inspect.signature(cls).parameters
                            if n not in ("device", "dtype")]
                self.assertEqual(accepted, variant["accepts"], cls_name)
                kwargs = {a: {"activation": "silu", "rope_theta": 1e4, "window": 0,
                              "module_fqn": "x", "module": None}.get(a)
                          for a in variant["accepts"] if a not in ("config", "context")}
                if "context" in variant["accepts"]:
                    # a job as the variant's requires has it (the sequence-parallel norm)
                    flags = {k: v for k, v in variant.get("requires", {}).items()
                             if k in ("sequence_parallel", "loss_parallel")}
                    kwargs["context"] = M.ParallelContext(**flags)
                m = cls(config=cfg(), device="meta", **kwargs)
                self.assertEqual([n for n, _ in m.named_parameters()],
                                 list(fam["parameters"]), cls_name)
                self.assertTrue(all(p.is_meta for p in m.parameters()))
        self.assertEqual(len(seen), 13)

    def test_local_shard_shapes(self):
        def shapes(cls, axis, size, rank, c=None, **kw):
            ctx = M.ParallelContext(ranks={axis: rank}, **{axis + "_size": size})
            m = cls(config=c or cfg(), context=ctx, device="meta", **kw)
            return {n: tuple(p.shape) for n, p in m.named_parameters()}

        self.assertEqual(shapes(M.EPGroupedExperts, "ep", 4, 1),
                         {"gate_up_proj": (2, 16, 16), "down_proj": (2, 8, 16)})
        self.assertEqual(shapes(M.EPGroupedExperts, "ep", 4, 3, cfg(num_experts=6))
                         ["gate_up_proj"], (0, 16, 16))
        self.assertEqual(shapes(M.TPSwiGLUMLP, "tp", 4, 3),
                         {"gate_proj": (4, 16), "up_proj": (4, 16), "down_proj": (16, 4)})
        self.assertEqual(shapes(M.EagerGQAAttention, "tp", 2, 1),
                         {"wq": (8, 16), "wk": (4, 16), "wv": (4, 16), "wo": (16, 8)})
        self.assertEqual(shapes(M.VocabParallelEmbedding, "tp", 2, 1), {"weight": (18, 16)})
        self.assertEqual(shapes(M.VocabParallelEmbedding, "tp", 2, 1, {
            "hidden_size": 16, "vocab_size": 37}), {"weight": (18, 16)})

    def test_object_config_and_dict_context(self):
        class Config:
            hidden_size, intermediate_size = 16, 22

        m = M.TPSwiGLUMLP(config=Config(), context={"tp_size": 2, "ranks": {"tp": 0}},
                          device="meta")
        self.assertEqual(tuple(m.gate_proj.shape), (11, 16))

        class Source(torch.nn.Module):
            config = {"hidden_size": 8}

        self.assertEqual(tuple(M.PlainRMSNorm(module=Source(), module_fqn="norm").weight.shape),
                         (8,))

    def test_refusals(self):
        cases = [
            (lambda: M.PlainSwiGLUMLP(config={"hidden_size": 16}), ValueError,
             "PlainSwiGLUMLP: config has no field 'intermediate_size'"),
            (lambda: M.PlainSwiGLUMLP(), TypeError,
             "PlainSwiGLUMLP needs config"),
            (lambda: M.PlainRMSNorm(config={"hidden_size": 0}), ValueError,
             "PlainRMSNorm: config field 'hidden_size' must be a positive integer, not 0"),
            (lambda: M.TPSwiGLUMLP(config=cfg(), context=M.ParallelContext(tp_size=2)),
             ValueError, r"TPSwiGLUMLP: tp_size=2 needs context.groups\['tp'\]"),
            (lambda: M.EPGroupedExperts(config=cfg(), context={"ep_size": 0}), ValueError,
             "EPGroupedExperts: ep_size must be a positive integer, not 0"),
            (lambda: M.EagerGQAAttention(config=cfg(), context={"cp_size": 2}), ValueError,
             "EagerGQAAttention does not support cp_size=2; use RingGQAAttention"),
            (lambda: M.EagerGQAAttention(config=cfg(), context={"tp_size": 4, "ranks": {"tp": 0}}),
             ValueError, "num_key_value_heads 2 does not split over tp_size=4"),
            (lambda: M.EagerGQAAttention(config=cfg(), window=-1), ValueError,
             "window must be an integer >= 0"),
            (lambda: M.GroupedExpertsLocal(config=cfg(), activation="tanh"), ValueError,
             "activation 'tanh' is not supported; use one of gelu, relu, silu"),
        ]
        for make, exc, text in cases:
            with self.assertRaisesRegex(exc, text):
                make()
        m = M.GroupedExpertsLocal(config=cfg())
        with self.assertRaisesRegex(ValueError, r"expert index 8 is not in \[0, 8\)"):
            m(torch.randn(2, 16), torch.tensor([[0, 8], [1, 2]]), torch.ones(2, 2))
        with self.assertRaisesRegex(ValueError, r"hidden_states must be \[tokens, 16\]"):
            m(torch.randn(2, 15), torch.zeros(2, 1, dtype=torch.int64), torch.ones(2, 1))
        ctx = M.ParallelContext(tp_size=2, ranks={"tp": 0})
        with self.assertRaisesRegex(RuntimeError, r"TPSwiGLUMLP: tp_size=2 needs the tp process "
                                    r"group in context.groups\['tp'\]"):
            M.TPSwiGLUMLP(config=cfg(), context=ctx)(torch.randn(2, 16))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        faulthandler.dump_traceback_later(WORKER_TIMEOUT - 10, exit=True)   # a hang shows where
        worker(sys.argv[2], sys.argv[3].split(","))
        sys.exit(0)
    unittest.main(verbosity=2)
