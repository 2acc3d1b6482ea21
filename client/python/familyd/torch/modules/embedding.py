"""Token embedding (registry family embedding): plain and vocab parallel.

Parameter (deploy/registry/embedding.yaml): weight [vocab_size, hidden_size], tp shard(0).
forward(token ids, any shape) -> [..., hidden_size]. VocabParallelEmbedding holds the tp
coordinate's rows of the vocabulary (a torch.chunk range, familyd's shard(0)): tokens outside
it give zeros there, and the all-reduce over tp adds the one rank that holds each token. Every
tp rank must be given the same token ids. A token id outside [0, vocab_size) is an error.
With the job's sequence parallelism the sum is reduce-scattered instead: each tp rank gets its
piece of the sequence ([..., S/tp, hidden_size]; the sequence is the ids' last dimension and
must split evenly over tp).
"""

from typing import Any, Callable, Tuple

import torch
import torch.nn.functional as F

from ._common import (chunk_range, config_int, config_value, context_axis, context_flag,
                      init_normal, local, new_parameter, resolve_config)
from ._comm import reduce_from_parallel, reduce_scatter_sequence


class _EmbeddingBase(torch.nn.Module):
    def _setup(self, config: Any, module: Any, module_fqn: str,
               rows: Callable[[int], Tuple[int, int]], device: Any, dtype: Any) -> None:
        owner = type(self).__name__
        config = resolve_config(config, module, owner)
        self.vocab_size = config_int(config, "vocab_size", owner)
        self.hidden_size = config_int(config, "hidden_size", owner)
        self.initializer_range = float(config_value(config, "initializer_range", 0.02, owner))
        self.module_fqn = module_fqn
        self.vocab_start, self.vocab_stop = rows(self.vocab_size)
        self.weight = new_parameter((self.vocab_stop - self.vocab_start, self.hidden_size),
                                    device, dtype)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The registry's init: normal(0, initializer_range)."""
        init_normal([self.weight], self.initializer_range)

    def _check(self, ids: torch.Tensor) -> None:
        if ids.dtype not in (torch.int64, torch.int32):
            raise ValueError("%s: token ids must be int64 or int32, not %s"
                             % (type(self).__name__, ids.dtype))
        if ids.numel():
            low, high = int(ids.min()), int(ids.max())
            if low < 0 or high >= self.vocab_size:
                raise ValueError("%s: token id %d is not in [0, %d)" % (
                    type(self).__name__, low if low < 0 else high, self.vocab_size))

    def extra_repr(self) -> str:
        return "vocab=[%d, %d) of %d, hidden_size=%d" % (
            self.vocab_start, self.vocab_stop, self.vocab_size, self.hidden_size)


class PlainEmbedding(_EmbeddingBase):
    """The whole vocabulary on this rank (variant plain)."""

    def __init__(self, config: Any = None, module: Any = None, module_fqn: str = "", *,
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        self._setup(config, module, module_fqn, lambda n: (0, n), device, dtype)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        self._check(ids)
        return F.embedding(ids.long(), local(self.weight))


class VocabParallelEmbedding(_EmbeddingBase):
    """The vocabulary sharded over tp, masked lookups all-reduced (variant vocab_parallel)."""

    def __init__(self, config: Any = None, module: Any = None, module_fqn: str = "",
                 context: Any = None, *, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        self._tp = context_axis(context, "tp", type(self).__name__)
        self.tp_size, self.tp_rank = self._tp.size, self._tp.rank
        self.sequence_parallel = context_flag(context, "sequence_parallel",
                                              type(self).__name__)
        self._setup(config, module, module_fqn,
                    lambda n: chunk_range(n, self._tp.size, self._tp.rank), device, dtype)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        group = self._tp.require_group(type(self).__name__)
        self._check(ids)
        ids = ids.long()
        outside = (ids < self.vocab_start) | (ids >= self.vocab_stop)
        rows = torch.where(outside, torch.zeros_like(ids), ids - self.vocab_start)
        weight = local(self.weight)
        if weight.shape[0] == 0:
            out = weight.new_zeros(tuple(ids.shape) + (self.hidden_size,))
            out = out + weight.sum()               # keeps the (empty) weight in the graph
        else:
            out = F.embedding(rows, weight).masked_fill(outside.unsqueeze(-1), 0.0)
        if self.sequence_parallel:
            return reduce_scatter_sequence(out, group)
        return reduce_from_parallel(out, group)
