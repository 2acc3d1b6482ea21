"""SwiGLU feed-forward (registry family mlp): plain, tensor parallel and fused.

Parameters (deploy/registry/mlp.yaml), [out_features, in_features] as torch.nn.Linear keeps them:
  gate_proj [intermediate_size, hidden_size], tp shard(0)   (column-parallel)
  up_proj   [intermediate_size, hidden_size], tp shard(0)   (column-parallel)
  down_proj [hidden_size, intermediate_size], tp shard(1)   (row-parallel)

forward(x [..., H]) = (silu(x @ gate_proj.T) * (x @ up_proj.T)) @ down_proj.T. TPSwiGLUMLP holds
the tp coordinate's rows of gate_proj/up_proj and the same columns of down_proj (torch.chunk
ranges of intermediate_size), and all-reduces its partial output over the tp group; the input is
the whole x on every tp rank. FusedSwiGLUMLP computes gate and up in one matmul over the
concatenated weights, with or without tp.

With the job's sequence parallelism (context.sequence_parallel) the tensor-parallel members take
and give this rank's piece of the sequence ([..., S/tp, H]): the sequence is all-gathered on the
way in and the partial output reduce-scattered on the way out, instead of the all-reduce.
"""

from typing import Any, Callable, Tuple

import torch
import torch.nn.functional as F

from ._common import (chunk_range, config_int, config_value, context_axis, context_flag,
                      init_normal, local, new_parameter, reject_axis, resolve_config)
from ._comm import (copy_to_parallel, gather_sequence, reduce_from_parallel,
                    reduce_scatter_sequence)


class _SwiGLUMLPBase(torch.nn.Module):
    def _setup(self, config: Any, module: Any, module_fqn: str,
               rows: Callable[[int], Tuple[int, int]], device: Any, dtype: Any) -> None:
        owner = type(self).__name__
        config = resolve_config(config, module, owner)
        self.hidden_size = config_int(config, "hidden_size", owner)
        self.intermediate_size = config_int(config, "intermediate_size", owner)
        self.initializer_range = float(config_value(config, "initializer_range", 0.02, owner))
        self.module_fqn = module_fqn
        self.inter_start, self.inter_stop = rows(self.intermediate_size)
        local = self.inter_stop - self.inter_start
        self.gate_proj = new_parameter((local, self.hidden_size), device, dtype)
        self.up_proj = new_parameter((local, self.hidden_size), device, dtype)
        self.down_proj = new_parameter((self.hidden_size, local), device, dtype)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The registry's init: normal(0, initializer_range) for all three."""
        init_normal([self.gate_proj, self.up_proj, self.down_proj], self.initializer_range)

    def _local(self, x: torch.Tensor) -> torch.Tensor:
        return (F.silu(x @ local(self.gate_proj).t()) * (x @ local(self.up_proj).t())) @ \
            local(self.down_proj).t()

    def _enter(self, x: torch.Tensor, group: Any) -> torch.Tensor:
        """The block's input: the whole sequence, its gradient summed over tp."""
        if getattr(self, "sequence_parallel", False):
            return gather_sequence(x, group)
        return copy_to_parallel(x, group)

    def _leave(self, y: torch.Tensor, group: Any) -> torch.Tensor:
        """The block's partial output summed over tp (this rank's piece of the sequence with
        sequence parallelism)."""
        if getattr(self, "sequence_parallel", False):
            return reduce_scatter_sequence(y, group)
        return reduce_from_parallel(y, group)

    def extra_repr(self) -> str:
        return "hidden_size=%d, intermediate=[%d, %d) of %d" % (
            self.hidden_size, self.inter_start, self.inter_stop, self.intermediate_size)


class PlainSwiGLUMLP(_SwiGLUMLPBase):
    """The whole MLP on this rank (variant plain)."""

    def __init__(self, config: Any = None, module: Any = None, module_fqn: str = "", *,
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        self._setup(config, module, module_fqn, lambda n: (0, n), device, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._local(x)


class TPSwiGLUMLP(_SwiGLUMLPBase):
    """Column-parallel gate/up, row-parallel down, all-reduce over tp (variant tensor_parallel)."""

    def __init__(self, config: Any = None, module: Any = None, module_fqn: str = "",
                 context: Any = None, *, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        self._tp = context_axis(context, "tp", type(self).__name__)
        self.tp_size, self.tp_rank = self._tp.size, self._tp.rank
        self.sequence_parallel = context_flag(context, "sequence_parallel", type(self).__name__)
        self._setup(config, module, module_fqn,
                    lambda n: chunk_range(n, self._tp.size, self._tp.rank), device, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        group = self._tp.require_group(type(self).__name__)
        return self._leave(self._local(self._enter(x, group)), group)


class FusedSwiGLUMLP(_SwiGLUMLPBase):
    """The same parameters and result with gate and up in one matmul (variant fused): x times
    the concatenated [gate_proj; up_proj] (torch.cat of the two, [2 * I/tp, H]), split into
    gate and up, silu(gate) * up, then down_proj. Tensor parallel as TPSwiGLUMLP over the
    context's tp group (each rank its rows of gate/up, its columns of down, all-reduce), the
    plain MLP with tp_size 1. pp_size > 1 is refused, as the registry's requires says."""

    def __init__(self, config: Any = None, module: Any = None, module_fqn: str = "",
                 context: Any = None, *, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        owner = type(self).__name__
        reject_axis(context, "pp", owner, "PlainSwiGLUMLP or TPSwiGLUMLP")
        self._tp = context_axis(context, "tp", owner)
        self.tp_size, self.tp_rank = self._tp.size, self._tp.rank
        self.sequence_parallel = context_flag(context, "sequence_parallel", owner)
        self._setup(config, module, module_fqn,
                    lambda n: chunk_range(n, self._tp.size, self._tp.rank), device, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        group = self._tp.require_group(type(self).__name__)
        x = self._enter(x, group)
        gate_up = torch.cat((local(self.gate_proj), local(self.up_proj)))
        h = F.linear(x, gate_up)
        rows = self.inter_stop - self.inter_start
        gate, up = h[..., :rows], h[..., rows:]
        return self._leave(F.linear(F.silu(gate) * up, local(self.down_proj)), group)
