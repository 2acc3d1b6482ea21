"""Grouped-query attention, eager (registry family attention, variant eager).

Parameters (deploy/registry/attention.yaml), [out_features, in_features]:
  wq [num_attention_heads * head_dim, hidden_size],   tp shard(0)
  wk [num_key_value_heads * head_dim, hidden_size],   tp shard(0)
  wv [num_key_value_heads * head_dim, hidden_size],   tp shard(0)
  wo [hidden_size, num_attention_heads * head_dim],   tp shard(1)

head_dim is the config's, else hidden_size / num_attention_heads (as transformers derives it).
Over tp the heads are split: each rank holds num_attention_heads / tp query heads and
num_key_value_heads / tp key/value heads (both must divide), runs attention on them and
all-reduces its partial output projection over the tp group. RoPE as Llama applies it
(rotate_half over the two halves of head_dim, frequencies rope_theta ** (-2i / head_dim)),
causal, and with window > 0 a sliding window: position i sees positions i - window + 1 .. i.
Context parallelism is not done here (cp_size > 1 is refused: that is RingGQAAttention).
"""

import math
from typing import Any, Optional, Tuple

import torch

from ._common import (config_int, config_value, context_axis, init_normal, local,
                      new_parameter, reject_axis, resolve_config)
from ._comm import copy_to_parallel, reduce_from_parallel


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float,
                dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [..., S, head_dim] for the given positions (Llama's layout: halves)."""
    work = torch.float64 if dtype == torch.float64 else torch.float32
    exponent = torch.arange(0, head_dim, 2, dtype=work, device=positions.device) / head_dim
    inv_freq = 1.0 / (theta ** exponent)
    freqs = positions.to(work).unsqueeze(-1) * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def attention_mask(seq: int, window: int, device: Any) -> torch.Tensor:
    """True where query i may see key j: j <= i, and i - j < window when window > 0."""
    i = torch.arange(seq, device=device).unsqueeze(1)
    j = torch.arange(seq, device=device).unsqueeze(0)
    allowed = j <= i
    if window > 0:
        allowed = allowed & (i - j < window)
    return allowed


class EagerGQAAttention(torch.nn.Module):
    def __init__(self, config: Any = None, module: Any = None, module_fqn: str = "",
                 context: Any = None, rope_theta: float = 500000.0, window: int = 0, *,
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        owner = type(self).__name__
        config = resolve_config(config, module, owner)
        reject_axis(context, "cp", owner, "RingGQAAttention")
        self._tp = context_axis(context, "tp", owner)
        self.tp_size, self.tp_rank = self._tp.size, self._tp.rank
        self.hidden_size = config_int(config, "hidden_size", owner)
        self.num_heads = config_int(config, "num_attention_heads", owner)
        self.num_kv_heads = config_int(config, "num_key_value_heads", owner)
        if self.hidden_size % self.num_heads and config_value(config, "head_dim", None) is None:
            raise ValueError("%s: hidden_size %d is not a multiple of num_attention_heads %d; "
                             "give head_dim" % (owner, self.hidden_size, self.num_heads))
        self.head_dim = config_int(config, "head_dim", owner,
                                   default=self.hidden_size // self.num_heads)
        self.initializer_range = float(config_value(config, "initializer_range", 0.02, owner))
        self._check(owner, rope_theta, window)
        self.rope_theta, self.window, self.module_fqn = float(rope_theta), window, module_fqn
        self.local_heads = self.num_heads // self.tp_size
        self.local_kv_heads = self.num_kv_heads // self.tp_size
        q, kv, h = self.local_heads * self.head_dim, self.local_kv_heads * self.head_dim, \
            self.hidden_size
        self.wq = new_parameter((q, h), device, dtype)
        self.wk = new_parameter((kv, h), device, dtype)
        self.wv = new_parameter((kv, h), device, dtype)
        self.wo = new_parameter((h, q), device, dtype)
        self.reset_parameters()

    def _check(self, owner: str, rope_theta: object, window: object) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError("%s: num_attention_heads %d is not a multiple of num_key_value_heads "
                             "%d" % (owner, self.num_heads, self.num_kv_heads))
        if self.num_kv_heads % self.tp_size:
            raise ValueError("%s: num_key_value_heads %d does not split over tp_size=%d"
                             % (owner, self.num_kv_heads, self.tp_size))
        if self.head_dim % 2:
            raise ValueError("%s: head_dim %d must be even for RoPE" % (owner, self.head_dim))
        if isinstance(rope_theta, bool) or not isinstance(rope_theta, (int, float)) \
                or not rope_theta > 0:
            raise ValueError("%s: rope_theta must be a positive number, not %r"
                             % (owner, rope_theta))
        if isinstance(window, bool) or not isinstance(window, int) or window < 0:
            raise ValueError("%s: window must be an integer >= 0 (0: no window), not %r"
                             % (owner, window))

    def reset_parameters(self) -> None:
        """The registry's init: normal(0, initializer_range) for all four."""
        init_normal([self.wq, self.wk, self.wv, self.wo], self.initializer_range)

    def forward(self, hidden_states: torch.Tensor,
                position_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        """hidden_states [B, S, H] (or [S, H]); position_ids [S] or [B, S], default 0..S-1."""
        group = self._tp.require_group(type(self).__name__)
        unbatched = hidden_states.dim() == 2
        x = hidden_states.unsqueeze(0) if unbatched else hidden_states
        if x.dim() != 3 or x.shape[-1] != self.hidden_size:
            raise ValueError("%s: hidden_states must be [batch, seq, %d] or [seq, %d], not %s" % (
                type(self).__name__, self.hidden_size, self.hidden_size,
                list(hidden_states.shape)))
        batch, seq, _ = x.shape
        if position_ids is None:
            position_ids = torch.arange(seq, device=x.device)
        x = copy_to_parallel(x, group)
        q = (x @ local(self.wq).t()).view(batch, seq, self.local_heads, self.head_dim).transpose(1, 2)
        k = (x @ local(self.wk).t()).view(batch, seq, self.local_kv_heads, self.head_dim).transpose(1, 2)
        v = (x @ local(self.wv).t()).view(batch, seq, self.local_kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = rope_tables(position_ids, self.head_dim, self.rope_theta, x.dtype)
        if cos.dim() == 3:                                 # [B, S, D] -> [B, 1, S, D]
            cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        repeat = self.local_heads // self.local_kv_heads
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        allowed = attention_mask(seq, self.window, x.device)
        scores = scores.masked_fill(~allowed, float("-inf"))
        work = torch.float64 if scores.dtype == torch.float64 else torch.float32
        probs = torch.softmax(scores.to(work), dim=-1).to(q.dtype)
        out = (probs @ v).transpose(1, 2).reshape(batch, seq, self.local_heads * self.head_dim)
        out = reduce_from_parallel(out @ local(self.wo).t(), group)
        return out.squeeze(0) if unbatched else out

    def extra_repr(self) -> str:
        return ("hidden_size=%d, heads=%d of %d, kv_heads=%d of %d, head_dim=%d, "
                "rope_theta=%g, window=%d" % (
                    self.hidden_size, self.local_heads, self.num_heads,
                    self.local_kv_heads, self.num_kv_heads, self.head_dim, self.rope_theta,
                    self.window))
