"""Loss parallelism: cross-entropy over logits sharded along the vocabulary, never gathered.

The head of a tensor-parallel model (a vocab-parallel embedding used as the output projection)
leaves each tp rank the logits of its own vocabulary rows, [N, V_local] where the rank holds
[vocab_start, vocab_start + V_local) of the vocabulary. vocab_parallel_cross_entropy computes
F.cross_entropy(the whole logits, target) from those pieces with three all-reduces of [N]
vectors (the row maximum, the sum of exponentials, the target's logit), so no rank ever holds
the [N, V] logits. Its backward is local: softmax minus the one-hot of the target on the rank's
own columns, scaled by the incoming gradient. Every tp rank gets the same loss.

The arithmetic is float32 at least (float16 / bfloat16 logits are upcast, as F.cross_entropy
does internally), so the result equals F.cross_entropy of the gathered logits up to the order
of float32 sums.
"""

from typing import Any, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F


def _sum(x: torch.Tensor, group: Any) -> torch.Tensor:
    dist.all_reduce(x, group=group)
    return x


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, target: torch.Tensor, vocab_start: int,
                ignore_index: int, group: Any) -> torch.Tensor:
        work = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
        width = work.shape[-1]
        # The row maximum over the whole vocabulary, for a stable exp (no gradient through it).
        row_max = work.max(dim=-1).values if width else \
            work.new_full(work.shape[:-1], float("-inf"))
        dist.all_reduce(row_max, op=dist.ReduceOp.MAX, group=group)
        shifted = work - row_max.unsqueeze(-1)
        exp = shifted.exp()
        sum_exp = _sum(exp.sum(dim=-1), group)
        # The target's logit: from the one rank whose columns hold it, zero elsewhere.
        local = target - vocab_start
        mine = (local >= 0) & (local < width) & (target != ignore_index)
        index = torch.where(mine, local, torch.zeros_like(local)).unsqueeze(-1)
        picked = shifted.gather(-1, index).squeeze(-1) if width else \
            shifted.new_zeros(shifted.shape[:-1])
        target_logit = _sum(torch.where(mine, picked, torch.zeros_like(picked)), group)
        valid = target != ignore_index
        loss = torch.where(valid, sum_exp.log() - target_logit, torch.zeros_like(target_logit))
        ctx.save_for_backward(exp / sum_exp.unsqueeze(-1), index, mine, valid)
        ctx.dtype = logits.dtype
        return loss

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[torch.Tensor, None, None, None, None]:
        softmax, index, mine, valid = ctx.saved_tensors
        g = softmax.clone()
        if g.shape[-1]:
            g.scatter_add_(-1, index, -mine.to(g.dtype).unsqueeze(-1))
        g = g * (grad * valid.to(grad.dtype)).unsqueeze(-1)
        return g.to(ctx.dtype), None, None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor, group: Any,
                                 vocab_start: Optional[int] = None, ignore_index: int = -100,
                                 reduction: str = "mean") -> torch.Tensor:
    """F.cross_entropy(logits gathered over the vocabulary, target), from this rank's columns.

    logits: [..., V_local], this rank's vocabulary columns; target: [...] int64 token ids of the
    whole vocabulary (the same on every rank of group); group: the tp process group (None: one
    rank holds the whole vocabulary, and this is F.cross_entropy); vocab_start: the first
    vocabulary id of this rank's columns (a VocabParallelEmbedding's .vocab_start; None: the
    sum of the lower ranks' widths, found with one all-gather); ignore_index and reduction
    ("mean" over the targets not ignored, "sum" or "none") as F.cross_entropy."""
    if reduction not in ("mean", "sum", "none"):
        raise ValueError("vocab_parallel_cross_entropy: reduction must be 'mean', 'sum' or "
                         "'none', not %r" % (reduction,))
    if tuple(target.shape) != tuple(logits.shape[:-1]):
        raise ValueError("vocab_parallel_cross_entropy: target shape %s does not match the "
                         "logits' %s" % (tuple(target.shape), tuple(logits.shape[:-1])))
    if group is None:
        flat = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                               ignore_index=ignore_index, reduction=reduction)
        return flat.reshape(target.shape) if reduction == "none" else flat
    if vocab_start is None:
        widths = [torch.zeros((), dtype=torch.int64) for _ in range(dist.get_world_size(group))]
        dist.all_gather(widths, torch.tensor(logits.shape[-1], dtype=torch.int64), group=group)
        vocab_start = int(sum(int(w) for w in widths[:dist.get_rank(group)]))
    loss = _VocabParallelCrossEntropy.apply(logits, target.long(), int(vocab_start),
                                            ignore_index, group)
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / (target != ignore_index).sum()
