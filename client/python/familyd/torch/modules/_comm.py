"""The collectives of the parallel members, as autograd Functions with the right backward.

torch.distributed.nn.functional.all_reduce is not used: on torch 1.13 its backward all-reduces
the gradient again, which is wrong for the output of a row-parallel layer (each rank already
holds the full gradient there). Megatron's pair is written out instead:

- copy_to_parallel: identity forward, all-reduce backward (the input of a column-parallel
  layer: every rank uses the whole input, so its gradient is the sum of the ranks' parts);
- reduce_from_parallel: all-reduce forward, identity backward (the output of a row-parallel
  layer, or of a vocab-parallel embedding);
- all_to_all: all_to_all_single forward, the reverse exchange backward (expert parallelism);

and, for sequence parallelism (activations outside the tensor-parallel blocks split over the
sequence dimension across the tp group, each rank its torch.chunk piece, equal pieces):

- gather_sequence: all-gather along the sequence forward, reduce-scatter backward (the input of
  a tensor-parallel block: each rank's gradient of the whole sequence is a partial sum, and the
  rank keeps the sum of its own piece);
- reduce_scatter_sequence: reduce-scatter along the sequence forward, all-gather backward (the
  output of a row-parallel layer or of a vocab-parallel embedding: partial sums in, this rank's
  piece of the sum out);
- scatter_sequence: this rank's piece forward, all-gather backward (a whole, replicated
  activation entering the sequence-parallel region).

gloo has the single-tensor all-gather and reduce-scatter on torch 2 (checked on 2.13), so the
sequence collectives are the same on gloo and nccl: the sequence dimension is moved to the
front, the collective runs on dimension 0 and the dimension is moved back. torch 2.13 names them
all_gather_single / reduce_scatter_single (all_gather_into_tensor / reduce_scatter_tensor, the
older names, warn there); the older names are used where the new ones are missing.

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


# torch >= 2.13's names, else the older ones (the same signature).
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _pieces(x: torch.Tensor, dim: int, group: Any, owner: str) -> int:
    """The tp size, after checking that x's sequence dimension splits into equal pieces."""
    size = int(dist.get_world_size(group))
    if x.shape[dim] % size:
        raise ValueError("%s: the sequence length %d does not split evenly over tp=%d "
                         "(sequence parallelism needs equal pieces)" % (owner, x.shape[dim], size))
    return size


def _gather_along(x: torch.Tensor, dim: int, group: Any) -> torch.Tensor:
    size = dist.get_world_size(group)
    wire = x.to(_wire_dtype(x, group)).movedim(dim, 0).contiguous()
    out = wire.new_empty((wire.shape[0] * size,) + tuple(wire.shape[1:]))
    _ALL_GATHER(out, wire, group=group)
    return out.movedim(0, dim).to(x.dtype)


def _reduce_scatter_along(x: torch.Tensor, dim: int, group: Any) -> torch.Tensor:
    size = _pieces(x, dim, group, "reduce_scatter_sequence")
    wire = x.to(_wire_dtype(x, group)).movedim(dim, 0).contiguous()
    out = wire.new_empty((wire.shape[0] // size,) + tuple(wire.shape[1:]))
    _REDUCE_SCATTER(out, wire, group=group)
    return out.movedim(0, dim).to(x.dtype)


def _piece_along(x: torch.Tensor, dim: int, group: Any) -> torch.Tensor:
    size = _pieces(x, dim, group, "scatter_sequence")
    step = x.shape[dim] // size
    return x.narrow(dim, dist.get_rank(group) * step, step).contiguous()


class _GatherSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dim: int, group: Any) -> torch.Tensor:
        ctx.dim, ctx.group = dim, group
        return _gather_along(x, dim, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[torch.Tensor, None, None]:
        return _reduce_scatter_along(grad, ctx.dim, ctx.group), None, None


class _ReduceScatterSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dim: int, group: Any) -> torch.Tensor:
        ctx.dim, ctx.group = dim, group
        return _reduce_scatter_along(x, dim, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[torch.Tensor, None, None]:
        return _gather_along(grad, ctx.dim, ctx.group), None, None


class _ScatterSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, dim: int, group: Any) -> torch.Tensor:
        ctx.dim, ctx.group = dim, group
        return _piece_along(x, dim, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[torch.Tensor, None, None]:
        return _gather_along(grad, ctx.dim, ctx.group), None, None


def gather_sequence(x: torch.Tensor, group: Any, dim: int = -2) -> torch.Tensor:
    """The whole sequence from every tp rank's piece (dim: the sequence dimension, -2 for
    [..., S, H]); backward reduce-scatters the gradient. Identity without a group."""
    if group is None:
        return x
    return _GatherSequence.apply(x, dim % x.dim(), group)


def reduce_scatter_sequence(x: torch.Tensor, group: Any, dim: int = -2) -> torch.Tensor:
    """This rank's piece of the sequence of the sum over the tp group of x; backward
    all-gathers the gradient. Identity without a group. The sequence must split evenly."""
    if group is None:
        return x
    return _ReduceScatterSequence.apply(x, dim % x.dim(), group)


def scatter_sequence(x: torch.Tensor, group: Any, dim: int = -2) -> torch.Tensor:
    """This rank's piece of the sequence of a tensor every tp rank holds whole; backward
    all-gathers the gradient. Identity without a group. The sequence must split evenly."""
    if group is None:
        return x
    return _ScatterSequence.apply(x, dim % x.dim(), group)
