"""The collectives of the parallel members, as autograd Functions with the right backward.

torch.distributed.nn.functional.all_reduce is not used: on torch 1.13 its backward all-reduces
the gradient again, which is wrong for the output of a row-parallel layer (each rank already
holds the full gradient there). Megatron's pair is written out instead:

- copy_to_parallel: identity forward, all-reduce backward (the input of a column-parallel
  layer: every rank uses the whole input, so its gradient is the sum of the ranks' parts);
- reduce_from_parallel: all-reduce forward, identity backward (the output of a row-parallel
  layer, or of a vocab-parallel embedding);
- all_to_all: all_to_all_single forward, the reverse exchange backward (expert parallelism).

With group None (axis size 1) each is the identity. gloo on torch 1.13 has no bfloat16
("Invalid scalar type"): bfloat16 tensors cross a gloo group as float32 (exact for the
all-to-all; an all-reduce then sums in float32) and come back as bfloat16.
"""

from typing import Any, Sequence, Tuple

import torch
import torch.distributed as dist


def _wire_dtype(x: torch.Tensor, group: Any) -> torch.dtype:
    """The dtype x travels in over group: float32 for bfloat16 on gloo, else its own."""
    if x.dtype == torch.bfloat16 and dist.get_backend(group) == "gloo":
        return torch.float32
    return x.dtype


def _all_reduce(x: torch.Tensor, group: Any) -> torch.Tensor:
    """The sum over group of x, as a new tensor (x is left alone)."""
    # Always a copy (no data_ptr comparison: torch.compile cannot trace one and breaks the graph).
    y = x.to(_wire_dtype(x, group), memory_format=torch.contiguous_format, copy=True)
    dist.all_reduce(y, group=group)
    return y.to(x.dtype)


class _CopyToParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[torch.Tensor, None]:
        return _all_reduce(grad, ctx.group), None


class _ReduceFromParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[torch.Tensor, None]:
        return grad, None


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, send_splits: Sequence[int],
                recv_splits: Sequence[int], group: Any) -> torch.Tensor:
        ctx.send_splits, ctx.recv_splits, ctx.group = send_splits, recv_splits, group
        return _exchange(x, send_splits, recv_splits, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[torch.Tensor, None, None, None]:
        return _exchange(grad, ctx.recv_splits, ctx.send_splits, ctx.group), None, None, None


def _exchange(x: torch.Tensor, send_splits: Sequence[int], recv_splits: Sequence[int],
              group: Any) -> torch.Tensor:
    wire = x.to(_wire_dtype(x, group)).contiguous()
    out = wire.new_empty((sum(recv_splits),) + tuple(x.shape[1:]))
    dist.all_to_all_single(out, wire, output_split_sizes=list(recv_splits),
                           input_split_sizes=list(send_splits), group=group)
    return out.to(x.dtype)


def copy_to_parallel(x: torch.Tensor, group: Any) -> torch.Tensor:
    return x if group is None else _CopyToParallel.apply(x, group)


def reduce_from_parallel(x: torch.Tensor, group: Any) -> torch.Tensor:
    return x if group is None else _ReduceFromParallel.apply(x, group)


def all_to_all(x: torch.Tensor, send_splits: Sequence[int], recv_splits: Sequence[int],
               group: Any) -> torch.Tensor:
    """Rows of x, split by send_splits (one count per rank of group), go to their ranks; the
    result holds the rows received, recv_splits from each rank, in rank order."""
    if group is None:
        return x
    return _AllToAll.apply(x, list(send_splits), list(recv_splits), group)


def exchange_counts(send_counts: Sequence[int], group: Any) -> torch.Tensor:
    """all_to_all of one int64 per rank: how many rows each rank will send this rank."""
    send = torch.as_tensor(send_counts, dtype=torch.int64)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return recv


def exchange_ints(values: torch.Tensor, send_splits: Sequence[int], recv_splits: Sequence[int],
                  group: Any) -> torch.Tensor:
    """all_to_all of an int64 vector (no gradient): the expert ids travelling with the rows."""
    return _exchange(values, send_splits, recv_splits, group)
