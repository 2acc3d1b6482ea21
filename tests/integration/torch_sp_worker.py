#!/usr/bin/python3
"""One of 2 workers (torchrun, gloo, no daemon) checking familyd.torch's sequence-parallel
collectives, members and vocab_parallel_cross_entropy against the whole computation in one
process. Started as `torch_sp_worker.py OUTDIR`; writes OUTDIR/RANK.json: {name: [ok, detail]}.

- vocab_parallel_cross_entropy over uneven vocabulary columns (torch.chunk of 11 over 2: 6 and
  5; vocab_start found by the function) equals F.cross_entropy of the whole logits, with an
  ignored target, for reduction mean, sum and none, and so do the logits' gradients; a
  bfloat16 input gives a bfloat16 gradient; its errors (reduction, shapes);
- TPSwiGLUMLP, EagerGQAAttention and VocabParallelEmbedding with sequence_parallel in their
  context, given this rank's piece of the sequence, give this rank's piece of the plain
  member's output, and the input gradients' pieces; SequenceParallelRMSNorm's weight gradient is
  the whole sequence's; SequenceParallelRMSNorm refuses a context without the flag;
- a sequence that does not split over tp is refused with its sentence.
"""

import json
import os
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_ROOT = os.environ.get("FAMILYD_SOURCE_ROOT") or os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(SOURCE_ROOT, "client", "python"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import familyd.torch as FT  # noqa: E402
import familyd.torch.modules as M  # noqa: E402

CONFIG = {"vocab_size": 10, "hidden_size": 8, "intermediate_size": 12,
          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 2,
          "initializer_range": 0.5, "rms_norm_eps": 1e-6}


def close(a, b, tol=1e-5):
    return torch.allclose(a.double(), b.double(), rtol=tol, atol=tol)


def check_cross_entropy(rank, group, out):
    gen = torch.Generator().manual_seed(3)
    whole = torch.randn(6, 11, generator=gen)
    target = torch.randint(0, 11, (6,), generator=gen)
    target[2] = -100
    lo, hi = M.chunk_range(11, 2, rank)
    for reduction in ("mean", "sum", "none"):
        ref_logits = whole.clone().requires_grad_(True)
        ref = F.cross_entropy(ref_logits, target, reduction=reduction)
        mine = whole[:, lo:hi].clone().requires_grad_(True)
        got = FT.vocab_parallel_cross_entropy(mine, target, group, reduction=reduction)
        weight = torch.arange(1.0, 7.0) if reduction == "none" else torch.tensor(1.0)
        (ref * weight).sum().backward()
        (got * weight).sum().backward()
        out["ce_" + reduction] = [close(got, ref) and close(mine.grad, ref_logits.grad[:, lo:hi]),
                                  "%s %s" % (got.tolist(), ref.tolist())]
    # [B, S, V] logits, an explicit vocab_start, bfloat16
    batched = torch.randn(2, 3, 11, generator=gen)
    tgt = torch.randint(0, 11, (2, 3), generator=gen)
    ref = F.cross_entropy(batched.reshape(-1, 11), tgt.reshape(-1))
    got = FT.vocab_parallel_cross_entropy(batched[..., lo:hi], tgt, group, vocab_start=lo)
    out["ce_batched"] = [close(got, ref), "%r %r" % (float(got), float(ref))]
    half = batched[..., lo:hi].bfloat16().requires_grad_(True)
    FT.vocab_parallel_cross_entropy(half, tgt, group).backward()
    out["ce_bfloat16_grad"] = [half.grad.dtype == torch.bfloat16, str(half.grad.dtype)]
    for name, call, text in (
            ("ce_bad_reduction", lambda: FT.vocab_parallel_cross_entropy(
                whole[:, lo:hi], target, group, reduction="max"),
             "vocab_parallel_cross_entropy: reduction must be 'mean', 'sum' or 'none', not "
             "'max'"),
            ("ce_bad_shape", lambda: FT.vocab_parallel_cross_entropy(
                whole[:, lo:hi], target[:5], group),
             "vocab_parallel_cross_entropy: target shape (5,) does not match the logits' (6,)")):
        try:
            call()
            out[name] = [False, "no error"]
        except ValueError as e:
            out[name] = [str(e) == text, str(e)]


def context(rank, group, sequence_parallel):
    return M.ParallelContext(tp_size=2, groups={"tp": group}, ranks={"tp": rank},
                             sequence_parallel=sequence_parallel)


def copy_shards(plain, member, rank):
    """member's parameters := its rows/columns of plain's (torch.chunk over 2)."""
    with torch.no_grad():
        for name, p in member.named_parameters():
            full = dict(plain.named_parameters())[name]
            if p.shape == full.shape:
                p.copy_(full)
                continue
            dim = [i for i, (a, b) in enumerate(zip(p.shape, full.shape)) if a != b][0]
            lo, hi = M.chunk_range(full.shape[dim], 2, rank)
            p.copy_(full.narrow(dim, lo, hi - lo))


def check_member(name, plain, member, rank, x, out, dtype_in=torch.float32):
    copy_shards(plain, member, rank)
    seq = x.shape[-2] if x.dim() > 1 and dtype_in.is_floating_point else x.shape[-1]
    piece = seq // 2
    if dtype_in.is_floating_point:
        xr = x.clone().requires_grad_(True)
        xm = x.narrow(-2, rank * piece, piece).clone().requires_grad_(True)
    else:
        xr, xm = x, x
    ref = plain(xr)
    got = member(xm)
    want = ref.narrow(-2, rank * piece, piece)
    ok = close(got, want)
    (ref * ref).sum().backward()
    (got * got).sum().backward()
    if dtype_in.is_floating_point:
        ok = ok and close(xm.grad, xr.grad.narrow(-2, rank * piece, piece), 1e-4)
    # The parameters' gradients: this rank's part of the whole ones.
    for pname, p in member.named_parameters():
        full = dict(plain.named_parameters())[pname].grad
        g = p.grad
        if g.shape != full.shape:
            dim = [i for i, (a, b) in enumerate(zip(g.shape, full.shape)) if a != b][0]
            lo, hi = M.chunk_range(full.shape[dim], 2, rank)
            full = full.narrow(dim, lo, hi - lo)
        ok = ok and close(g, full, 1e-4)
    out[name] = [bool(ok), "%s vs %s" % (tuple(got.shape), tuple(want.shape))]


def check_members(rank, group, out):
    torch.manual_seed(5)
    x = torch.randn(2, 4, 8)
    ctx = context(rank, group, True)
    check_member("sp_mlp", M.PlainSwiGLUMLP(config=CONFIG),
                 M.TPSwiGLUMLP(config=CONFIG, context=ctx), rank, x, out)
    check_member("sp_fused_mlp", M.PlainSwiGLUMLP(config=CONFIG),
                 M.FusedSwiGLUMLP(config=CONFIG, context=ctx), rank, x, out)
    check_member("sp_attention", M.EagerGQAAttention(config=CONFIG, rope_theta=100.0),
                 M.EagerGQAAttention(config=CONFIG, context=ctx, rope_theta=100.0), rank, x, out)
    check_member("sp_norm", M.PlainRMSNorm(config=CONFIG),
                 M.SequenceParallelRMSNorm(config=CONFIG, context=ctx), rank, x, out)
    ids = torch.randint(0, 10, (2, 4))
    check_member("sp_embedding", M.PlainEmbedding(config=CONFIG),
                 M.VocabParallelEmbedding(config=CONFIG, context=ctx), rank, ids, out,
                 dtype_in=torch.int64)
    try:
        M.SequenceParallelRMSNorm(config=CONFIG, context=context(rank, group, False))
        out["sp_norm_refuses"] = [False, "no error"]
    except ValueError as e:
        out["sp_norm_refuses"] = [str(e) == (
            "SequenceParallelRMSNorm needs a job with sequence parallelism "
            "(context.sequence_parallel); use PlainRMSNorm"), str(e)]
    try:
        M.VocabParallelEmbedding(config=CONFIG, context=ctx)(torch.randint(0, 10, (2, 3)))
        out["sp_uneven"] = [False, "no error"]
    except ValueError as e:
        out["sp_uneven"] = [str(e) == ("reduce_scatter_sequence: the sequence length 3 does "
                                       "not split evenly over tp=2 (sequence parallelism "
                                       "needs equal pieces)"), str(e)]


def main(outdir):
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    group = dist.new_group([0, 1])
    out = {}
    for check in (check_cross_entropy, check_members):
        try:
            check(rank, group, out)
        except Exception:
            out[check.__name__] = [False, traceback.format_exc()]
        dist.barrier()
    dist.destroy_process_group()
    with open(os.path.join(outdir, "%d.json" % rank), "w") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
