#!/usr/bin/python3
"""familyd.torch.modules' flash, ring, fused and mxfp8 members, for real (no daemon).

- FlashGQAAttention: torch's scaled_dot_product_attention (seen called, and no softmax of our
  own) gives the eager member's outputs and gradients for the same weights within float32
  tolerance, window 0 and 3, batched or not, position_ids; cp_size > 1 refused.
- FusedSwiGLUMLP: one matmul over torch.cat(gate_proj, up_proj) (two matmuls in all, not
  three), the plain member's outputs and gradients; local shapes as TPSwiGLUMLP's; pp refused.
- MXFP8GroupedSwiGLU: its dequantised weights equal, bit for bit, a float8 e4m3 quantiser
  written here (every e4m3fn value from its bits, round to nearest, ties to even, one float32
  scale max|block| / 448 per 32 elements along the reduction dim); its output equals the
  EPGroupedExperts member's on those weights exactly and is within a bound derived from
  e4m3's precision (2^-4 relative, 2^-10 of the scale below the normals) of the float32
  member's output; weight gradients pass straight through.
- RingGQAAttention: one process (cp 1) equals eager; its refusals.
- Two torchrun jobs (gloo, CPU) of this file's worker: 2 ranks (tp=2: flash with and without
  window, fused, fused in bfloat16; cp=2: ring batched, in bfloat16, unbatched with
  position_ids, with as many kv heads as heads, chunks of different shapes refused on both
  ranks; ep=2: mxfp8) and 4 ranks (ring over cp=2 x tp=2). The parent compares each rank's
  output and input gradient with the unsharded member on the whole input in this process
  (ring: the eager member on the whole sequence, the rank's chunk of it), and the weight
  gradients, summed over cp and concatenated over tp or ep shards, with the whole member's,
  within 1e-5 relative to the largest value (bfloat16: 2e-2).
"""

import math
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from torch_job_common import (Close, PACKAGE, free_port, job_env, launcher, require_torch,  # noqa: E402
                              run)

require_torch()
sys.path.insert(0, PACKAGE)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.overrides import TorchFunctionMode  # noqa: E402

from familyd.torch import modules as M  # noqa: E402

RTOL = 1e-5
JOB_TIMEOUT = 300
ATTN = {"hidden_size": 16, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 4}
ATTN_TP4 = dict(ATTN, num_attention_heads=8, num_key_value_heads=4, head_dim=2)
MHA = dict(ATTN, num_key_value_heads=4)
MLP = {"hidden_size": 16, "intermediate_size": 22}
EXPERTS = {"hidden_size": 40, "moe_intermediate_size": 8, "num_experts": 4}
ATTN_SHARDS = {"wq": 0, "wk": 0, "wv": 0, "wo": 1}


def gen(seed):
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def randn(shape, seed, scale=1.0):
    return torch.randn(*shape, generator=gen(seed)) * scale


def full_weights(module, seed=4000):
    g = gen(seed)
    return {n: torch.randn(p.shape, generator=g) * 0.5 for n, p in module.named_parameters()}


def load(module, weights):
    with torch.no_grad():
        for n, p in module.named_parameters():
            assert p.shape == weights[n].shape, (n, p.shape, weights[n].shape)
            p.copy_(weights[n])
    return module


def twin(cls, other, **kw):
    """A member of cls with other's weights."""
    return load(cls(**kw), {n: p.detach() for n, p in other.named_parameters()})


# --- the parallel cases: one member on a layout against its unsharded reference ------------------

# name: (sizes {axis: size}, part class, reference class, config, kwargs, tp shard dims,
#        input shape (ring: the whole sequence), position_ids?)
CASES = {
    "flash_tp": ({"tp": 2}, M.FlashGQAAttention, M.EagerGQAAttention, ATTN, {}, ATTN_SHARDS,
                 (2, 7, 16), False),
    "flash_tp_window": ({"tp": 2}, M.FlashGQAAttention, M.EagerGQAAttention, ATTN,
                        {"window": 3, "rope_theta": 1e4}, ATTN_SHARDS, (2, 7, 16), False),
    "fused_tp": ({"tp": 2}, M.FusedSwiGLUMLP, M.PlainSwiGLUMLP, MLP, {},
                 {"gate_proj": 0, "up_proj": 0, "down_proj": 1}, (2, 5, 16), False),
    "ring_cp": ({"cp": 2}, M.RingGQAAttention, M.EagerGQAAttention, ATTN, {"rope_theta": 1e4},
                {}, (2, 8, 16), False),
    "ring_cp_positions": ({"cp": 2}, M.RingGQAAttention, M.EagerGQAAttention, ATTN, {}, {},
                          (10, 16), True),
    "ring_cp_mha": ({"cp": 2}, M.RingGQAAttention, M.EagerGQAAttention, MHA, {}, {},
                    (1, 6, 16), False),
    "mxfp8_ep": ({"ep": 2}, M.MXFP8GroupedSwiGLU, M.MXFP8GroupedSwiGLU, EXPERTS, {},
                 {"gate_up_proj": 0, "down_proj": 0}, None, False),
    "ring_cp_tp": ({"cp": 2, "tp": 2}, M.RingGQAAttention, M.EagerGQAAttention, ATTN_TP4,
                   {"rope_theta": 1e4}, ATTN_SHARDS, (2, 8, 16), False),
}
CASES["ring_cp_bf16"] = CASES["ring_cp"]
CASES["fused_tp_bf16"] = CASES["fused_tp"]
BF16 = {"ring_cp_bf16", "fused_tp_bf16"}
BF16_RTOL = 2e-2           # bfloat16 keeps 8 bits: the members round at different places
JOBS = {2: ("flash_tp", "flash_tp_window", "fused_tp", "ring_cp", "ring_cp_positions",
            "ring_cp_mha", "mxfp8_ep", "ring_cp_bf16", "fused_tp_bf16"),
        4: ("ring_cp_tp",)}
EP_TOKENS = [6, 3]


def coords(rank, sizes):
    """This rank's coordinate on each axis: the axes row-major in the order given (the last
    fastest), as familyd lays a mesh."""
    out = {}
    for axis in reversed(list(sizes)):
        out[axis] = rank % sizes[axis]
        rank //= sizes[axis]
    return out


def chunk(length, parts, index):
    """torch.chunk's [start, stop), written here independently (familyd's shard(d))."""
    c = (length + parts - 1) // parts
    return min(length, index * c), min(length, (index + 1) * c)


def whole_inputs(name):
    """(x, probe, position_ids or None) of the whole sequence, the same on every rank."""
    shape, positions = CASES[name][6], CASES[name][7]
    x = randn(shape, 10)
    pos = torch.arange(shape[-2]) * 2 + 5 if positions else None
    return x, randn(shape[:-1] + (16,), 11), pos


def ep_inputs(rank):
    g = gen(100 + rank)
    tokens = EP_TOKENS[rank]
    x = torch.randn(tokens, 40, generator=g)
    idx = torch.stack([torch.randperm(4, generator=g)[:2] for _ in range(tokens)])
    return x, idx, torch.rand(tokens, 2, generator=g), torch.randn(tokens, 40, generator=g)


def dtype_of(name):
    return torch.bfloat16 if name in BF16 else torch.float32


def forward_backward(module, x, probe, *args, **kw):
    dtype = next(module.parameters()).dtype
    x, probe = x.to(dtype), probe.to(dtype)
    x = x.clone().requires_grad_()
    out = module(x, *args, **kw)
    (out * probe).sum().backward()
    return out.detach(), x.grad, {n: p.grad.clone() for n, p in module.named_parameters()}


def worker(outdir):
    import torch.distributed as dist
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")
    results = {}
    for name in JOBS[world]:
        sizes, part_cls, ref_cls, config, kw, shards, shape, _ = CASES[name]
        mine = coords(rank, sizes)
        groups = {}
        for axis in sizes:                      # every rank makes every group, in order
            for fixed in range(world // sizes[axis]):
                ranks = sorted({r for r in range(world)
                                if _others(r, sizes, axis) == _index(fixed, sizes, axis)})
                g = dist.new_group(ranks)
                if rank in ranks:
                    groups[axis] = g
        context = M.ParallelContext(groups=groups, **{a + "_size": s for a, s in sizes.items()})
        weights = full_weights(ref_cls(config=config, **kw))
        dtype = dtype_of(name)
        weights = {n: t.to(dtype) for n, t in weights.items()}
        part = part_cls(config=config, context=context, dtype=dtype, **kw)
        local = {}
        for n, t in weights.items():
            axis = "ep" if "ep" in sizes else "tp"
            if n in shards:
                start, stop = chunk(t.shape[shards[n]], sizes[axis], mine[axis])
                t = t.narrow(shards[n], start, stop - start)
            local[n] = t
        load(part, local)
        if "ep" in sizes:
            x, idx, w, probe = ep_inputs(rank)
            results[name] = forward_backward(part, x, probe, idx, w)
            continue
        x, probe, pos = whole_inputs(name)
        extra = {}
        if "cp" in sizes:
            start, stop = chunk(x.shape[-2], sizes["cp"], mine["cp"])
            x, probe = x[..., start:stop, :], probe[..., start:stop, :]
            if pos is not None:
                extra["position_ids"] = pos[start:stop]
        elif pos is not None:
            extra["position_ids"] = pos
        results[name] = forward_backward(part, x, probe, **extra)
        if name == "ring_cp":
            try:                                  # chunks of different lengths
                part(torch.randn(4 - rank, 16))
            except ValueError as e:
                results["ring_unequal"] = str(e)
    torch.save(results, os.path.join(outdir, "rank%d.pt" % rank))
    dist.barrier()
    dist.destroy_process_group()


def _others(rank, sizes, axis):
    """rank's coordinates on the axes other than `axis` (its group over `axis`)."""
    return [c for a, c in coords(rank, sizes).items() if a != axis]


def _index(fixed, sizes, axis):
    """The coordinates on the other axes of the fixed-th group over `axis`."""
    others = [a for a in sizes if a != axis]
    out = []
    for a in reversed(others):
        out.append(fixed % sizes[a])
        fixed //= sizes[a]
    return list(reversed(out))


def launch(world):
    with tempfile.TemporaryDirectory(prefix="fd-members-") as outdir:
        rc, out = run(launcher(world, free_port(), [os.path.abspath(__file__), "--worker",
                                                     outdir]),
                      timeout=JOB_TIMEOUT, env=job_env())
        if rc != 0:
            raise AssertionError("torchrun of %d ranks exited %d:\n%s" % (world, rc, out[-8000:]))
        return {r: torch.load(os.path.join(outdir, "rank%d.pt" % r)) for r in range(world)}




class ParallelJobs(Close, unittest.TestCase):
    results = {}

    @classmethod
    def setUpClass(cls):
        cls.results = {world: launch(world) for world in JOBS}

    def check(self, name):
        sizes, _, ref_cls, config, kw, shards, _, _ = CASES[name]
        world = math.prod(sizes.values())
        got = self.results[world]
        dtype = dtype_of(name)
        rtol = BF16_RTOL if dtype == torch.bfloat16 else RTOL
        ref = load(ref_cls(config=config, dtype=dtype, **kw),
                   {n: t.to(dtype) for n, t in full_weights(ref_cls(config=config, **kw)).items()})
        if "ep" in sizes:
            for r in range(world):
                x, idx, w, probe = ep_inputs(r)
                out, xg, _ = forward_backward(ref, x, probe, idx, w)   # grads accumulate
                self.assertClose(got[r][name][0], out, "%s rank %d output" % (name, r), rtol)
                self.assertClose(got[r][name][1], xg, "%s rank %d input grad" % (name, r), rtol)
            for n, p in ref.named_parameters():
                self.assertClose(torch.cat([got[r][name][2][n] for r in range(world)],
                                           shards[n]), p.grad, "%s grad of %s" % (name, n), rtol)
            return
        x, probe, pos = whole_inputs(name)
        out, xg, grads = forward_backward(ref, x, probe,
                                          **({} if pos is None else {"position_ids": pos}))
        for r in range(world):
            c = coords(r, sizes)
            start, stop = chunk(x.shape[-2], sizes.get("cp", 1), c.get("cp", 0))
            self.assertClose(got[r][name][0], out[..., start:stop, :],
                             "%s rank %d output" % (name, r), rtol)
            self.assertClose(got[r][name][1], xg[..., start:stop, :],
                             "%s rank %d input grad" % (name, r), rtol)
        tp = sizes.get("tp", 1)
        for n, want in grads.items():
            parts = []
            for t in range(tp):       # each tp shard: the sum of its cp ranks' gradients
                ranks = [r for r in range(world) if coords(r, sizes).get("tp", 0) == t]
                parts.append(sum(got[r][name][2][n] for r in ranks))
            gathered = torch.cat(parts, shards[n]) if n in shards else parts[0]
            self.assertClose(gathered, want, "%s grad of %s" % (name, n), rtol)

    def test_flash_tp2(self):
        self.check("flash_tp")

    def test_flash_tp2_window(self):
        self.check("flash_tp_window")

    def test_fused_tp2(self):
        self.check("fused_tp")

    def test_ring_cp2(self):
        """cp=2: rank r holds positions [r * 4, (r + 1) * 4) of 8, batch 2; output, input
        gradient and (summed over cp) weight gradients as eager's on the whole sequence."""
        self.check("ring_cp")
        # The first rank's chunk does not see the second's: its output is its own chunk's
        # eager causal attention; the second's is not (it sees the first chunk).
        sizes, _, ref_cls, config, kw, _, _, _ = CASES["ring_cp"]
        ref = load(ref_cls(config=config, **kw), full_weights(ref_cls(config=config, **kw)))
        x = whole_inputs("ring_cp")[0]
        alone = ref(x[:, 4:], position_ids=torch.arange(4, 8)).detach()
        self.assertGreater(float((self.results[2][1]["ring_cp"][0] - alone).abs().max()), 1e-3)

    def test_ring_cp2_position_ids(self):
        self.check("ring_cp_positions")

    def test_ring_cp2_as_many_kv_heads(self):
        self.check("ring_cp_mha")

    def test_bfloat16_over_gloo(self):
        """bfloat16 members on gloo (no bfloat16 there): ring sends its K/V chunks as float32
        (it computes in float32), fused all-reduces as float32; within bfloat16's precision of
        the eager and plain members in bfloat16."""
        self.check("ring_cp_bf16")
        self.check("fused_tp_bf16")
        self.assertEqual(self.results[2][0]["ring_cp_bf16"][0].dtype, torch.bfloat16)

    def test_ring_cp2_tp2(self):
        """4 ranks, cp=2 x tp=2: heads over tp, the sequence over cp."""
        self.check("ring_cp_tp")

    def test_ring_refuses_unequal_chunks(self):
        for r in (0, 1):
            self.assertEqual(self.results[2][r]["ring_unequal"],
                             "RingGQAAttention: every cp rank must hold a chunk of the same "
                             "[batch, seq] (rank r holds positions [r * S / cp, (r + 1) * S / "
                             "cp)), not [[1, 4], [1, 3]]")

    def test_mxfp8_ep2(self):
        """ep=2 (the registry allows 1 or 2): each rank's experts, tokens all-to-all, as the
        member with every expert on one rank."""
        self.check("mxfp8_ep")


# --- one process -------------------------------------------------------------------------------

class Calls(TorchFunctionMode):
    """The torch functions a forward calls, by name."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


def calls(module, *args, **kw):
    with Calls() as c:
        module(*args, **kw)
    return c.names


def seeded(cls, **kw):
    m = cls(**kw)
    return load(m, full_weights(m, 7))


class TestFlash(Close, unittest.TestCase):
    def test_equals_eager(self):
        for window, theta in ((0, 500000.0), (3, 1e4), (20, 1e4)):
            for config in (ATTN, MHA):
                eager = seeded(M.EagerGQAAttention, config=config, window=window,
                               rope_theta=theta)
                flash = twin(M.FlashGQAAttention, eager, config=config, window=window,
                             rope_theta=theta)
                for shape in ((2, 9, 16), (9, 16)):
                    what = "window %d, kv heads %d, %s" % (window, config["num_key_value_heads"],
                                                           shape)
                    x, probe = randn(shape, 1), randn(shape, 2)
                    want = forward_backward(eager, x, probe)
                    got = forward_backward(flash, x, probe)
                    self.assertClose(got[0], want[0], what + " output")
                    self.assertClose(got[1], want[1], what + " input grad")
                    for n in want[2]:
                        self.assertClose(got[2][n], want[2][n], what + " grad " + n)
                    eager.zero_grad()
                    flash.zero_grad()
        pos = torch.tensor([[3, 4, 5, 6, 7], [0, 2, 4, 6, 8]])
        x = randn((2, 5, 16), 3)
        self.assertClose(flash(x, position_ids=pos).detach(),
                         eager(x, position_ids=pos).detach(), "position_ids [B, S]")

    def test_uses_scaled_dot_product_attention(self):
        for window in (0, 3):
            flash = M.FlashGQAAttention(config=ATTN, window=window)
            names = calls(flash, randn((2, 5, 16), 1))
            self.assertEqual(names.count("scaled_dot_product_attention"), 1, names)
            self.assertNotIn("softmax", names)
        self.assertNotIn("scaled_dot_product_attention",
                         calls(M.EagerGQAAttention(config=ATTN), randn((2, 5, 16), 1)))

    def test_refusals(self):
        with self.assertRaisesRegex(ValueError, "^FlashGQAAttention does not support cp_size=2; "
                                    "use RingGQAAttention$"):
            M.FlashGQAAttention(config=ATTN, context={"cp_size": 2})
        with self.assertRaisesRegex(ValueError, "FlashGQAAttention: num_key_value_heads 2 does "
                                    "not split over tp_size=4"):
            M.FlashGQAAttention(config=ATTN, context={"tp_size": 4, "ranks": {"tp": 0}})


class TestFused(Close, unittest.TestCase):
    def test_equals_plain(self):
        plain = seeded(M.PlainSwiGLUMLP, config=MLP)
        fused = twin(M.FusedSwiGLUMLP, plain, config=MLP)
        for shape in ((3, 16), (2, 5, 16)):
            x, probe = randn(shape, 1), randn(shape, 2)
            want, got = forward_backward(plain, x, probe), forward_backward(fused, x, probe)
            self.assertClose(got[0], want[0], "output %s" % (shape,))
            self.assertClose(got[1], want[1], "input grad %s" % (shape,))
            for n in want[2]:
                self.assertClose(got[2][n], want[2][n], "grad %s %s" % (n, shape))
            plain.zero_grad()
            fused.zero_grad()

    def test_one_matmul_for_gate_and_up(self):
        names = calls(M.FusedSwiGLUMLP(config=MLP), randn((2, 5, 16), 1))
        self.assertEqual(names.count("cat"), 1, names)
        self.assertEqual(names.count("linear"), 2, names)
        self.assertNotIn("matmul", names)
        self.assertEqual(calls(M.PlainSwiGLUMLP(config=MLP), randn((2, 5, 16), 1))
                         .count("matmul"), 3)

    def test_shards_and_refusals(self):
        for rank, rows in ((0, 6), (3, 4)):
            m = M.FusedSwiGLUMLP(config=MLP, context={"tp_size": 4, "ranks": {"tp": rank}},
                                 device="meta")
            self.assertEqual({n: tuple(p.shape) for n, p in m.named_parameters()},
                             {"gate_proj": (rows, 16), "up_proj": (rows, 16),
                              "down_proj": (16, rows)})
        with self.assertRaisesRegex(ValueError, "^FusedSwiGLUMLP does not support pp_size=2; "
                                    "use PlainSwiGLUMLP or TPSwiGLUMLP$"):
            M.FusedSwiGLUMLP(config=MLP, context={"pp_size": 2})
        with self.assertRaisesRegex(RuntimeError, r"FusedSwiGLUMLP: tp_size=2 needs the tp "
                                    r"process group in context.groups\['tp'\]"):
            M.FusedSwiGLUMLP(config=MLP, context={"tp_size": 2, "ranks": {"tp": 1}})(
                randn((2, 16), 1))


class TestRingOneProcess(Close, unittest.TestCase):
    def test_cp1_equals_eager(self):
        eager = seeded(M.EagerGQAAttention, config=ATTN, rope_theta=1e4)
        ring = twin(M.RingGQAAttention, eager, config=ATTN, rope_theta=1e4)
        x, probe = randn((2, 7, 16), 1), randn((2, 7, 16), 2)
        want, got = forward_backward(eager, x, probe), forward_backward(ring, x, probe)
        for i, what in ((0, "output"), (1, "input grad")):
            self.assertClose(got[i], want[i], what)
        for n in want[2]:
            self.assertClose(got[2][n], want[2][n], "grad " + n)
        self.assertNotIn("softmax", calls(ring, x))

    def test_made_without_a_group_forward_needs_it(self):
        m = M.RingGQAAttention(config=ATTN, context={"cp_size": 2}, device="meta")
        self.assertEqual(m.cp_size, 2)
        self.assertEqual(tuple(m.wq.shape), (16, 16))
        ring = M.RingGQAAttention(config=ATTN, context={"cp_size": 2})
        with self.assertRaisesRegex(RuntimeError, r"^RingGQAAttention: cp_size=2 needs the cp "
                                    r"process group in context.groups\['cp'\]$"):
            ring(randn((4, 16), 1))

    def test_no_window(self):
        with self.assertRaisesRegex(TypeError, "window"):
            M.RingGQAAttention(config=ATTN, window=3)


# --- MXFP8: a quantiser written here -----------------------------------------------------------

def e4m3_values():
    """Every finite non-negative float8 e4m3fn value by code 0..126, from its bits: 4 exponent
    bits (bias 7), 3 mantissa bits, subnormals m/8 * 2^-6; code 127 (S.1111.111) is NaN."""
    out = []
    for code in range(127):
        e, m = code >> 3, code & 7
        out.append(m / 8.0 * 2.0 ** -6 if e == 0 else (1 + m / 8.0) * 2.0 ** (e - 7))
    return torch.tensor(out, dtype=torch.float64)


E4M3 = e4m3_values()


def round_e4m3(v):
    """float32 v (|v| <= 448) to the nearest e4m3 value, ties to the even code, as float64."""
    a = v.double().abs().flatten()
    hi = torch.searchsorted(E4M3, a).clamp(max=len(E4M3) - 1)
    lo = (hi - 1).clamp(min=0)
    dlo, dhi = a - E4M3[lo], E4M3[hi] - a
    pick = torch.where(dlo < dhi, lo, torch.where(dhi < dlo, hi, torch.where(lo % 2 == 0, lo, hi)))
    return (torch.sign(v.double().flatten()) * E4M3[pick]).view(v.shape)


def reference_dequantize(w, dim=1):
    """w quantised and dequantised block by block (32 along dim), in loops."""
    w = w.detach().float().movedim(dim, -1).contiguous()
    out = torch.empty_like(w)
    flat, res = w.reshape(-1, w.shape[-1]), out.view(-1, w.shape[-1])
    scales = []
    for row in range(flat.shape[0]):
        for start in range(0, flat.shape[1], 32):
            block = flat[row, start:start + 32]
            amax = block.abs().max()
            scale = amax / torch.tensor(448.0) if float(amax) > 0 else torch.tensor(1.0)
            scales.append(float(scale))
            res[row, start:start + 32] = round_e4m3(block / scale).float() * scale
    return out.movedim(-1, dim), scales


class TestMXFP8(Close, unittest.TestCase):
    def test_rounding_reference_is_e4m3(self):
        """The table written here is torch's float8_e4m3fn, and round_e4m3 rounds as it does
        on the values where rounding is delicate (ties, subnormals, the top)."""
        codes = torch.arange(127, dtype=torch.uint8).view(torch.float8_e4m3fn)
        self.assertTrue(torch.equal(codes.double(), E4M3))
        tricky = torch.tensor([1.0625, 1.1875, 2 ** -9 * 1.5, 2 ** -9 * 0.5, 2 ** -9 * 0.51,
                               440.0, 447.9, 416.0, 432.0, -1.0625, 0.0, 3e-4, 2 ** -10])
        self.assertEqual(round_e4m3(tricky).tolist(),
                         [1.0, 1.25, 2 ** -8, 0.0, 2 ** -9, 448.0, 448.0, 416.0, 448.0, -1.0,
                          0.0, 0.0, 0.0])
        self.assertTrue(torch.equal(tricky.to(torch.float8_e4m3fn).double(), round_e4m3(tricky)))

    def test_dequantized_weights_equal_the_reference(self):
        for config in (EXPERTS, dict(EXPERTS, hidden_size=64, moe_intermediate_size=40)):
            m = seeded(M.MXFP8GroupedSwiGLU, config=config)
            with torch.no_grad():      # ties at scale 1, a block of zeros, tiny values
                m.gate_up_proj[0, :4, 0] = torch.tensor([448.0, 1.0625, 1.1875, 2 ** -9 * 1.5])
                m.gate_up_proj[0, 4:32, 0] = 1e-4
                m.gate_up_proj[1, :32, 1] = 0.0
            gate_up, down = m.dequantized()
            for got, p in ((gate_up, m.gate_up_proj), (down, m.down_proj)):
                want, scales = reference_dequantize(p)
                self.assertTrue(torch.equal(got.detach(), want),
                                float((got.detach() - want).abs().max()))
                q, s = M.mxfp8_quantize(p)
                self.assertEqual(q.dtype, torch.float8_e4m3fn)
                self.assertEqual(tuple(q.shape), tuple(p.shape))
                blocks = -(-p.shape[1] // 32)
                self.assertEqual(tuple(s.shape), (p.shape[0], blocks, p.shape[2]))
                self.assertEqual(s.dtype, torch.float32)
                self.assertEqual(sorted(s.flatten().tolist()), sorted(scales))
                self.assertTrue(torch.equal(M.mxfp8_dequantize(q, s), want))
            self.assertEqual(gate_up[0, :4, 0].tolist(), [448.0, 1.0, 1.25, 2 ** -8])
            self.assertEqual(gate_up[0, 4:32, 0].tolist(), [0.0] * 28)   # below e4m3 there
            self.assertEqual(gate_up[1, :32, 1].tolist(), [0.0] * 32)

    def test_output_is_the_dequantized_members(self):
        """Exactly EPGroupedExperts' output on the reference-dequantised weights; weight
        gradients straight through (those of the dequantised weights)."""
        m = seeded(M.MXFP8GroupedSwiGLU, config=EXPERTS)
        plain = M.EPGroupedExperts(config=EXPERTS)
        load(plain, {n: reference_dequantize(p)[0] for n, p in m.named_parameters()})
        x, idx, w, probe = ep_inputs(0)
        got, want = forward_backward(m, x, probe, idx, w), forward_backward(plain, x, probe,
                                                                            idx, w)
        self.assertTrue(torch.equal(got[0], want[0]))
        self.assertTrue(torch.equal(got[1], want[1]))
        for n in want[2]:
            self.assertTrue(torch.equal(got[2][n], want[2][n]), n)
        bf = m(x.bfloat16(), idx, w.bfloat16())
        self.assertEqual(bf.dtype, torch.bfloat16)

    def test_within_e4m3_precision_of_float32(self):
        """Each dequantised weight within e4m3's half step of the float32 one: e4m3 keeps 3
        mantissa bits, so a normal element is off by at most 2^-4 of itself and one below the
        normals (2^-6 of the scale) by at most 2^-10 of the scale (sharp: float8 e5m2 would
        break it). |mxfp8 - float32| of the output within that error carried through the
        layer element by element (|x| @ error, silu's slope at most 1.1, the products'
        cross terms): a worst case, loose where signs cancel."""
        m = seeded(M.MXFP8GroupedSwiGLU, config=EXPERTS)
        f32 = twin(M.GroupedExpertsLocal, m, config=EXPERTS)
        x, idx, w, _ = ep_inputs(0)
        got, want = m(x, idx, w).detach().double(), f32(x, idx, w).detach().double()

        def delta(p):
            b = p.detach().double()
            scale = torch.zeros_like(b)
            for start in range(0, b.shape[1], 32):
                s = b[:, start:start + 32].abs().amax(1, keepdim=True) / 448
                scale[:, start:start + 32] = s
            return 2 ** -4 * b.abs() + 2 ** -10 * scale + 1e-7 * b.abs()

        for n, p in m.named_parameters():      # the weights themselves
            dq = dict(zip(("gate_up_proj", "down_proj"), m.dequantized()))[n].detach().double()
            self.assertTrue(bool(((dq - p.detach().double()).abs() <= delta(p)).all()), n)
        gu, dn = m.gate_up_proj.detach().double(), m.down_proj.detach().double()
        dgu, ddn = delta(m.gate_up_proj), delta(m.down_proj)
        bound = torch.zeros_like(want)
        xd = x.double()
        for t in range(x.shape[0]):
            for s in range(idx.shape[1]):
                e = int(idx[t, s])
                h = xd[t] @ gu[e]
                eh = xd[t].abs() @ dgu[e]
                g, u, eg, eu = h[:8], h[8:], eh[:8], eh[8:]
                a, ea = F.silu(g), 1.1 * eg
                ez = ea * u.abs() + a.abs() * eu + ea * eu
                z = a * u
                bound[t] += float(w[t, s]) * (ez @ (dn[e].abs() + ddn[e]) + z.abs() @ ddn[e])
        bound += 1e-5 * float(want.abs().max())          # float32 arithmetic
        err = (got - want).abs()
        self.assertTrue(bool((err <= bound).all()), float((err - bound).max()))
        self.assertGreater(float(err.max()), 0.0)                      # it did quantise


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker(sys.argv[2])
        sys.exit(0)
    unittest.main(verbosity=2)
