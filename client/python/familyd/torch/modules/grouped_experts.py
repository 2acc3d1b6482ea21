"""Grouped MoE experts (registry family grouped_experts): local, expert-parallel and MXFP8.

Parameters (deploy/registry/grouped_experts.yaml):
  gate_up_proj [num_experts, hidden_size, 2 * moe_intermediate_size], ep shard(0)
  down_proj    [num_experts, moe_intermediate_size, hidden_size],     ep shard(0)

Each expert computes act(x @ gate_up[:, :I]) * (x @ gate_up[:, I:]) @ down (SwiGLU with the
default activation "silu"). The router is the caller's: forward takes the hidden states
[T, H], the chosen experts [T, k] (global expert ids) and their weights [T, k], and returns
sum_k weight * expert(x) as [T, H].

EPGroupedExperts holds the experts of its ep coordinate only (torch.chunk ranges of the expert
dim, familyd's shard(0)), the same number on every ep rank: experts that do not divide over ep
are refused with the daemon's sentence (its EXPERTS_UNEVEN, docs/semantics.md): "parameter
'gate_up_proj': 6 experts (dimension 0) do not divide over ep=4; each ep rank must hold the same
number of experts". Each (token, slot) pair goes to the rank of its expert with
all_to_all_single over the ep group and its result comes back the same way. Every rank of the
group must call forward together (with its own tokens; any count, zero included).

MXFP8GroupedSwiGLU is EPGroupedExperts computing with its weights quantised to float8 e4m3 in
blocks of 32 along the reduction dim, one float32 scale each (mxfp8_quantize), dequantised to
float32.
"""

from typing import Any, Callable, Dict, List, Tuple

import torch
import torch.nn.functional as F

from ._common import (chunk_range, config_int, config_value, context_axis, init_normal, local,
                      new_parameter, resolve_config)
from ._comm import all_to_all, exchange_counts, exchange_ints

Activation = Callable[[torch.Tensor], torch.Tensor]

ACTIVATIONS: Dict[str, Activation] = {"silu": F.silu, "gelu": F.gelu, "relu": F.relu}


def _activation(activation: str, owner: str) -> Activation:
    if activation not in ACTIVATIONS:
        raise ValueError("%s: activation '%s' is not supported; use one of %s"
                         % (owner, activation, ", ".join(sorted(ACTIVATIONS))))
    return ACTIVATIONS[activation]


def _check_routing(x: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor, hidden: int,
                   num_experts: int, owner: str) -> None:
    if x.dim() != 2 or x.shape[1] != hidden:
        raise ValueError("%s: hidden_states must be [tokens, %d], not %s"
                         % (owner, hidden, list(x.shape)))
    if indices.dim() != 2 or indices.shape[0] != x.shape[0] or weights.shape != indices.shape:
        raise ValueError("%s: expert_indices and expert_weights must both be [%d, top_k], not %s "
                         "and %s" % (owner, x.shape[0], list(indices.shape), list(weights.shape)))
    if indices.numel():
        low, high = int(indices.min()), int(indices.max())
        if low < 0 or high >= num_experts:
            bad = low if low < 0 else high
            raise ValueError("%s: expert index %d is not in [0, %d)" % (owner, bad, num_experts))


def _run_experts(rows: torch.Tensor, local_ids: torch.Tensor, gate_up: torch.Tensor,
                 down: torch.Tensor, act: Activation) -> torch.Tensor:
    """rows [N, H], each for local expert local_ids[n]: the expert outputs [N, H], same order."""
    order = torch.argsort(local_ids, stable=True)
    counts = torch.bincount(local_ids, minlength=gate_up.shape[0]).tolist()
    inter = down.shape[1]
    outs: List[torch.Tensor] = []
    for e, piece in enumerate(rows[order].split(counts)):
        h = piece @ gate_up[e]
        outs.append((act(h[:, :inter]) * h[:, inter:]) @ down[e])
    if not outs:
        # No expert here (an empty shard), so no rows either: zeros that keep the rows and the
        # empty weights in the graph, so that backward still takes part in the exchanges.
        return rows.new_zeros((rows.shape[0], down.shape[2])) + (
            rows.sum() + gate_up.sum() + down.sum())
    return torch.cat(outs)[torch.argsort(order)]


class _GroupedExpertsBase(torch.nn.Module):
    def _setup(self, config: Any, module: Any, module_fqn: str, activation: str,
               experts: Callable[[int], Tuple[int, int]], device: Any, dtype: Any) -> None:
        owner = type(self).__name__
        config = resolve_config(config, module, owner)
        self.hidden_size = config_int(config, "hidden_size", owner)
        self.moe_intermediate_size = config_int(config, "moe_intermediate_size", owner)
        self.num_experts = config_int(config, "num_experts", owner)
        self.initializer_range = float(config_value(config, "initializer_range", 0.02, owner))
        self.module_fqn = module_fqn
        self.activation = activation
        self._act = _activation(activation, owner)
        self.expert_start, self.expert_stop = experts(self.num_experts)
        local = self.expert_stop - self.expert_start
        h, i = self.hidden_size, self.moe_intermediate_size
        self.gate_up_proj = new_parameter((local, h, 2 * i), device, dtype)
        self.down_proj = new_parameter((local, i, h), device, dtype)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The registry's init: normal(0, initializer_range) for both."""
        init_normal([self.gate_up_proj, self.down_proj], self.initializer_range)

    def extra_repr(self) -> str:
        return "experts=[%d, %d) of %d, hidden_size=%d, moe_intermediate_size=%d, activation=%s" % (
            self.expert_start, self.expert_stop, self.num_experts, self.hidden_size,
            self.moe_intermediate_size, self.activation)


class GroupedExpertsLocal(_GroupedExpertsBase):
    """Every expert on this rank (variant grouped: ep = 1)."""

    def __init__(self, config: Any = None, module: Any = None, module_fqn: str = "",
                 context: Any = None, activation: str = "silu", *, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__()
        self._setup(config, module, module_fqn, activation, lambda n: (0, n), device, dtype)

    def forward(self, hidden_states: torch.Tensor, expert_indices: torch.Tensor,
                expert_weights: torch.Tensor) -> torch.Tensor:
        _check_routing(hidden_states, expert_indices, expert_weights, self.hidden_size,
                       self.num_experts, type(self).__name__)
        tokens, top_k = expert_indices.shape
        ids = expert_indices.reshape(-1).long()
        token_of = torch.arange(tokens, device=ids.device).repeat_interleave(top_k)
        y = _run_experts(hidden_states[token_of], ids, local(self.gate_up_proj),
                         local(self.down_proj), self._act)
        y = y * expert_weights.reshape(-1, 1).to(y.dtype)
        return hidden_states.new_zeros(hidden_states.shape).index_add(0, token_of, y)


class EPGroupedExperts(_GroupedExpertsBase):
    """The experts sharded over the ep group (variant grouped_ep), tokens moved all-to-all."""

    def __init__(self, config: Any = None, module: Any = None, module_fqn: str = "",
                 context: Any = None, activation: str = "silu", *, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__()
        owner = type(self).__name__
        self._ep = context_axis(context, "ep", owner)
        self._setup(config, module, module_fqn, activation, self._experts, device, dtype)
        self.ep_size, self.ep_rank = self._ep.size, self._ep.rank

    def _experts(self, n: int) -> Tuple[int, int]:
        """This ep coordinate's experts: n / ep of them, refused as familyd's Build refuses
        them (EXPERTS_UNEVEN) when n does not divide over ep."""
        if n % self._ep.size:
            raise ValueError("parameter 'gate_up_proj': %d experts (dimension 0) do not divide "
                             "over ep=%d; each ep rank must hold the same number of experts"
                             % (n, self._ep.size))
        return chunk_range(n, self._ep.size, self._ep.rank)

    def forward(self, hidden_states: torch.Tensor, expert_indices: torch.Tensor,
                expert_weights: torch.Tensor) -> torch.Tensor:
        return self._dispatch(hidden_states, expert_indices, expert_weights,
                              local(self.gate_up_proj), local(self.down_proj))

    def _dispatch(self, hidden_states: torch.Tensor, expert_indices: torch.Tensor,
                  expert_weights: torch.Tensor, gate_up: torch.Tensor,
                  down: torch.Tensor) -> torch.Tensor:
        """forward with the local experts' weights gate_up and down."""
        owner = type(self).__name__
        group = self._ep.require_group(owner)
        _check_routing(hidden_states, expert_indices, expert_weights, self.hidden_size,
                       self.num_experts, owner)
        tokens, top_k = expert_indices.shape
        ids = expert_indices.reshape(-1).long()
        order = torch.argsort(ids, stable=True)        # grouped by expert, hence by rank
        sorted_ids = ids[order]
        token_of = torch.arange(tokens, device=ids.device).repeat_interleave(top_k)[order]
        chunk = -(-self.num_experts // self.ep_size)
        send = torch.bincount(sorted_ids // chunk, minlength=self.ep_size).tolist()
        recv = exchange_counts(send, group).tolist() if group is not None else send
        rows = all_to_all(hidden_states[token_of], send, recv, group)
        got_ids = exchange_ints(sorted_ids, send, recv, group) if group is not None else sorted_ids
        y = _run_experts(rows, got_ids - self.expert_start, gate_up, down, self._act)
        y = all_to_all(y, recv, send, group)
        y = y * expert_weights.reshape(-1)[order].reshape(-1, 1).to(y.dtype)
        return hidden_states.new_zeros(hidden_states.shape).index_add(0, token_of, y)


MX_BLOCK = 32                 # elements per scale (OCP MX's k)
E4M3_MAX = 448.0              # the largest finite float8 e4m3fn value


def _blocks(t: torch.Tensor, dim: int) -> torch.Tensor:
    """t with `dim` moved last, zero-padded to whole blocks and split: [..., blocks, 32]."""
    t = t.movedim(dim, -1)
    n = t.shape[-1]
    blocks = -(-n // MX_BLOCK)
    return F.pad(t, (0, blocks * MX_BLOCK - n)).unflatten(-1, (blocks, MX_BLOCK))


def _unblocks(b: torch.Tensor, n: int, dim: int) -> torch.Tensor:
    return b.flatten(-2)[..., :n].movedim(-1, dim)


def mxfp8_quantize(w: torch.Tensor, dim: int = 1) -> Tuple[torch.Tensor, torch.Tensor]:
    """w as float8 e4m3 (torch.float8_e4m3fn) with one float32 scale per block of 32
    consecutive elements along `dim` (the last block shorter when 32 does not divide it):
    scale = max|block| / 448 in float32 (1 for a block of zeros), element = w / scale rounded
    to nearest e4m3 (ties to even), so each block's largest element maps to 448. Returns
    (elements, w's shape; scales, w's shape with ceil(n / 32) along dim). Not OCP MX's E8M0
    power-of-two scale: a float32 scale wastes none of e4m3's range."""
    n = w.shape[dim]
    b = _blocks(w.detach().float(), dim)
    amax = b.abs().amax(-1, keepdim=True)
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    q = (b / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return _unblocks(q, n, dim), scale.squeeze(-1).movedim(-1, dim)


def mxfp8_dequantize(q: torch.Tensor, scales: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """float32 elements * their block's scale: what mxfp8_quantize's output stands for."""
    b = _blocks(q.float(), dim) * scales.movedim(dim, -1).unsqueeze(-1)
    return _unblocks(b, q.shape[dim], dim)


class MXFP8GroupedSwiGLU(EPGroupedExperts):
    """The grouped experts with MX-style float8 weights (variant mxfp8): the parameters are
    the other members' (float32 or whatever dtype they are made in); forward quantises
    gate_up_proj and down_proj with mxfp8_quantize along their reduction dim (hidden_size for
    gate_up_proj, moe_intermediate_size for down_proj: dim 1 of both), dequantises them and
    computes the SwiGLU experts in float32, the output in the input's dtype. Expert parallel
    over ep as EPGroupedExperts (the registry allows ep 1 or 2). Backward passes the weight
    gradient straight through the quantisation (to the parameter as if unquantised)."""

    def __init__(self, config: Any = None, module: Any = None, module_fqn: str = "",
                 context: Any = None, *, device: Any = None, dtype: Any = None) -> None:
        super().__init__(config, module, module_fqn, context, "silu", device=device,
                         dtype=dtype)

    def dequantized(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """(gate_up_proj, down_proj) as forward computes with them: quantised, dequantised,
        float32, with the parameters' gradient passed straight through."""
        out = []
        for p in (local(self.gate_up_proj), local(self.down_proj)):
            w = p.float()
            out.append(w + (mxfp8_dequantize(*mxfp8_quantize(w)) - w).detach())
        return out[0], out[1]

    def forward(self, hidden_states: torch.Tensor, expert_indices: torch.Tensor,
                expert_weights: torch.Tensor) -> torch.Tensor:
        gate_up, down = self.dequantized()
        y = self._dispatch(hidden_states.float(), expert_indices, expert_weights.float(),
                           gate_up, down)
        return y.to(hidden_states.dtype)
