"""Grouped-query attention, eager (registry family attention, variant eager).

Parameters (deploy/registry/attention.yaml), [out_features, in_features]:
  wq [num_attention_heads * head_dim, hidden_size],   tp shard(0)
  wk [num_key_value_heads * head_dim, hidden_size],   tp shard(0)
  wv [num_key_value_heads * head_dim, hidden_size],   tp shard(0)
  wo [hidden_size, num_attention_heads * head_dim],   tp shard(1)

head_dim is the config's, else hidden_size / num_attention_heads (as transformers derives it).
Over tp the heads are split: each rank holds num_attention_heads / tp query heads and
num_key_value_heads / tp key/value heads (both must divide), runs attention on them and
all-reduces its partial output projection over the tp group (with the job's sequence
parallelism: takes this rank's piece of the sequence, all-gathers it over tp, and
reduce-scatters the output projection back to the piece; position_ids, when given, are the
whole sequence's). RoPE as Llama applies it
(rotate_half over the two halves of head_dim, frequencies rope_theta ** (-2i / head_dim)),
causal, and with window > 0 a sliding window: position i sees positions i - window + 1 .. i.

Three members share those parameters and that math:
  EagerGQAAttention  (variant eager) the scores, mask and softmax written out; cp_size > 1 is
                     refused (that is RingGQAAttention).
  FlashGQAAttention  (variant flash) torch.nn.functional.scaled_dot_product_attention
                     (is_causal, or the window's mask; enable_gqa); cp_size > 1 refused too.
  RingGQAAttention   (variant ring) context parallel: cp rank r holds the contiguous chunk
                     [r * S / cp, (r + 1) * S / cp) of the sequence, the K/V chunks go round
                     the cp group (isend/irecv, gloo on CPU) and the softmax is combined online
                     (running max and sum); causal, no window (the registry's ring variant
                     does not accept one). Heads over tp as the others.
"""

import math
from typing import Any, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ._common import (config_int, config_value, context_axis, context_flag, init_normal, local,
                      new_parameter, reject_axis, resolve_config)
from ._comm import (copy_to_parallel, gather_sequence, reduce_from_parallel,
                    reduce_scatter_sequence)


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


class _GQAAttentionBase(torch.nn.Module):
    """The parameters, checks, projections and RoPE the attention members share."""

    def _setup(self, config: Any, module: Any, module_fqn: str, context: Any,
               rope_theta: float, window: int, device: Any, dtype: Any) -> None:
        owner = type(self).__name__
        config = resolve_config(config, module, owner)
        self._tp = context_axis(context, "tp", owner)
        self.tp_size, self.tp_rank = self._tp.size, self._tp.rank
        self.sequence_parallel = context_flag(context, "sequence_parallel", owner)
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

    def _inputs(self, hidden_states: torch.Tensor) -> Tuple[torch.Tensor, bool]:
        """hidden_states as [B, S, H], and whether it came unbatched ([S, H])."""
        unbatched = hidden_states.dim() == 2
        x = hidden_states.unsqueeze(0) if unbatched else hidden_states
        if x.dim() != 3 or x.shape[-1] != self.hidden_size:
            raise ValueError("%s: hidden_states must be [batch, seq, %d] or [seq, %d], not %s" % (
                type(self).__name__, self.hidden_size, self.hidden_size,
                list(hidden_states.shape)))
        return x, unbatched

    def _project(self, x: torch.Tensor, position_ids: torch.Tensor
                 ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [B, heads, S, D] and k, v [B, kv_heads, S, D] of this rank's heads, RoPE applied to
        q and k at position_ids ([S] or [B, S])."""
        batch, seq, _ = x.shape

        def heads(w: torch.Tensor, n: int) -> torch.Tensor:
            return (x @ local(w).t()).view(batch, seq, n, self.head_dim).transpose(1, 2)

        q = heads(self.wq, self.local_heads)
        k, v = heads(self.wk, self.local_kv_heads), heads(self.wv, self.local_kv_heads)
        cos, sin = rope_tables(position_ids, self.head_dim, self.rope_theta, x.dtype)
        if cos.dim() == 3:                                 # [B, S, D] -> [B, 1, S, D]
            cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _first_position(self, batch: int, seq: int) -> int:
        """The position of this rank's first token in the sequence (0 without cp)."""
        return 0

    def forward(self, hidden_states: torch.Tensor,
                position_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        """hidden_states [B, S, H] (or [S, H]); position_ids [S] or [B, S] for RoPE, default
        the tokens' positions in the sequence (0..S-1 without cp)."""
        group = self._tp.require_group(type(self).__name__)
        x, unbatched = self._inputs(hidden_states)
        # With sequence parallelism this rank holds its piece of the sequence: the whole
        # sequence in (reduce-scatter of the gradient), this rank's piece of the sum out.
        x = gather_sequence(x, group) if self.sequence_parallel else copy_to_parallel(x, group)
        batch, seq, _ = x.shape
        first = self._first_position(batch, seq)
        if position_ids is None:
            position_ids = torch.arange(first, first + seq, device=x.device)
        q, k, v = self._project(x, position_ids)
        out = self._attend(q, k, v)
        out = out.transpose(1, 2).reshape(batch, seq, self.local_heads * self.head_dim)
        out = out @ local(self.wo).t()
        out = reduce_scatter_sequence(out, group) if self.sequence_parallel \
            else reduce_from_parallel(out, group)
        return out.squeeze(0) if unbatched else out

    def extra_repr(self) -> str:
        return ("hidden_size=%d, heads=%d of %d, kv_heads=%d of %d, head_dim=%d, "
                "rope_theta=%g, window=%d" % (
                    self.hidden_size, self.local_heads, self.num_heads,
                    self.local_kv_heads, self.num_kv_heads, self.head_dim, self.rope_theta,
                    self.window))


class EagerGQAAttention(_GQAAttentionBase):
    """Attention written out (variant eager): scores, mask, softmax in float32, over tp."""

    def __init__(self, config: Any = None, module: Any = None, module_fqn: str = "",
                 context: Any = None, rope_theta: float = 500000.0, window: int = 0, *,
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        reject_axis(context, "cp", type(self).__name__, "RingGQAAttention")
        self._setup(config, module, module_fqn, context, rope_theta, window, device, dtype)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """softmax(q k^T / sqrt(D), causal and windowed) v, [B, heads, S, D]: written out."""
        seq = q.shape[2]
        repeat = self.local_heads // self.local_kv_heads
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        allowed = attention_mask(seq, self.window, q.device)
        scores = scores.masked_fill(~allowed, float("-inf"))
        work = torch.float64 if scores.dtype == torch.float64 else torch.float32
        probs = torch.softmax(scores.to(work), dim=-1).to(q.dtype)
        return probs @ v


class FlashGQAAttention(EagerGQAAttention):
    """The eager member's parameters and math through torch's fused kernel (variant flash):
    torch.nn.functional.scaled_dot_product_attention with is_causal (window 0) or the window's
    boolean mask, the kv heads shared by enable_gqa. cp_size > 1 is refused as by the eager one."""

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        gqa = self.local_heads != self.local_kv_heads
        if self.window > 0:
            mask = attention_mask(q.shape[2], self.window, q.device)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)


def _ring_shift(x: torch.Tensor, group: Any) -> torch.Tensor:
    """x sent to the next rank of the cp ring and the previous rank's x received (group ranks,
    r -> r + 1 mod cp), with isend/irecv so that neither direction waits on the other."""
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    x = x.contiguous()
    got = torch.empty_like(x)
    works = [dist.isend(x, group=group, group_dst=(rank + 1) % size),
             dist.irecv(got, group=group, group_src=(rank - 1) % size)]
    for work in works:
        if work is not None:
            work.wait()
    return got


def _repeat_heads(x: torch.Tensor, repeat: int) -> torch.Tensor:
    """kv heads [B, kv_heads, L, D] -> [B, kv_heads * repeat, L, D], each head `repeat` times
    in a row (query head h uses kv head h // repeat)."""
    return x if repeat == 1 else x.repeat_interleave(repeat, dim=1)


def _sum_heads(x: torch.Tensor, repeat: int) -> torch.Tensor:
    """The reverse of _repeat_heads for gradients: the repeats of each kv head summed."""
    if repeat == 1:
        return x
    b, h, length, d = x.shape
    return x.view(b, h // repeat, repeat, length, d).sum(2)


class _RingAttention(torch.autograd.Function):
    """Causal attention of this cp rank's queries over the whole sequence, the K/V chunks
    passed around the cp ring (ring attention). q [B, heads, L, D], k and v [B, kv_heads, L, D]
    are the chunk of positions [rank * L, (rank + 1) * L). At step t this rank holds the K/V of
    rank (rank - t) mod cp: a chunk before its own is seen whole, its own causally, one after
    it not at all (but still passed on). The softmax is combined online: a running row max m,
    sum l of exp(score - m) and sum of exp(score - m) * v, rescaled by exp(m_old - m_new) when
    the max grows. Backward recomputes each block's probabilities from the saved log-sum-exp
    and sends the K/V chunks round again, each with the gradient of its K/V accumulating as
    it goes; one more step brings those home. Computed in float32 (float64 for float64)."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: Any,
                scale: float) -> torch.Tensor:
        size = 1 if group is None else dist.get_world_size(group)
        rank = 0 if group is None else dist.get_rank(group)
        work = torch.float64 if q.dtype == torch.float64 else torch.float32
        repeat = q.shape[1] // k.shape[1]
        qw = q.to(work)
        kv = torch.stack((k, v)).to(work)
        shape = qw.shape[:-1] + (1,)
        row_max = torch.full(shape, float("-inf"), dtype=work, device=q.device)
        row_sum = torch.zeros(shape, dtype=work, device=q.device)
        acc = torch.zeros_like(qw)
        causal = attention_mask(q.shape[2], 0, q.device)
        for step in range(size):
            source = (rank - step) % size
            if source <= rank:
                scores = (qw @ _repeat_heads(kv[0], repeat).transpose(-1, -2)) * scale
                if source == rank:
                    scores = scores.masked_fill(~causal, float("-inf"))
                new_max = torch.maximum(row_max, scores.amax(-1, keepdim=True))
                rescale = torch.exp(row_max - new_max)
                p = torch.exp(scores - new_max)
                row_sum = row_sum * rescale + p.sum(-1, keepdim=True)
                acc = acc * rescale + p @ _repeat_heads(kv[1], repeat)
                row_max = new_max
            if step < size - 1:
                kv = _ring_shift(kv, group)
        out = acc / row_sum
        ctx.save_for_backward(q, k, v, out, row_max + torch.log(row_sum))
        ctx.group, ctx.scale = group, scale
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor
                 ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, None, None]:
        q, k, v, out, lse = ctx.saved_tensors
        group, scale = ctx.group, ctx.scale
        size = 1 if group is None else dist.get_world_size(group)
        rank = 0 if group is None else dist.get_rank(group)
        repeat = q.shape[1] // k.shape[1]
        qw, dout = q.to(out.dtype), grad.to(out.dtype)
        delta = (dout * out).sum(-1, keepdim=True)
        dq = torch.zeros_like(qw)
        # K, V and their gradients travel together: [k, v, dk, dv].
        kv = torch.cat((torch.stack((k, v)).to(out.dtype), torch.zeros((2,) + k.shape,
                        dtype=out.dtype, device=k.device)))
        causal = attention_mask(q.shape[2], 0, q.device)
        for step in range(size):
            source = (rank - step) % size
            if source <= rank:
                kb, vb = _repeat_heads(kv[0], repeat), _repeat_heads(kv[1], repeat)
                scores = (qw @ kb.transpose(-1, -2)) * scale
                if source == rank:
                    scores = scores.masked_fill(~causal, float("-inf"))
                p = torch.exp(scores - lse)
                dscores = p * (dout @ vb.transpose(-1, -2) - delta)
                dq = dq + (dscores @ kb) * scale
                kv[2] += _sum_heads((dscores.transpose(-1, -2) @ qw) * scale, repeat)
                kv[3] += _sum_heads(p.transpose(-1, -2) @ dout, repeat)
            if step < size - 1:
                kv = _ring_shift(kv, group)
        grads = kv[2:] if size == 1 else _ring_shift(kv[2:], group)
        return dq.to(q.dtype), grads[0].to(k.dtype), grads[1].to(v.dtype), None, None


class RingGQAAttention(_GQAAttentionBase):
    """Context-parallel attention (variant ring): the eager member's parameters (replicated
    over cp, heads split over tp as there) and math, causal, with the sequence split over the
    cp group. Each cp rank holds a contiguous chunk in rank order: with a sequence of S
    positions, cp rank r holds [r * S / cp, (r + 1) * S / cp), and forward takes that chunk
    [B, S / cp, H] (or [S / cp, H]) and returns its output. Every rank of the cp group must
    call forward together with chunks of the same shape (checked: a ValueError on every
    rank). position_ids default to the chunk's positions in the sequence. No sliding window:
    the registry's ring variant does not accept one. The weight gradients are this rank's part
    (its queries' and its keys' and values' share): sum them over cp as over dp."""

    def __init__(self, config: Any = None, module: Any = None, module_fqn: str = "",
                 context: Any = None, rope_theta: float = 500000.0, *, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__()
        # The parameters do not depend on the cp coordinate: forward needs the group.
        self._cp = context_axis(context, "cp", type(self).__name__, coordinate=False)
        self.cp_size = self._cp.size
        self._setup(config, module, module_fqn, context, rope_theta, 0, device, dtype)

    def _first_position(self, batch: int, seq: int) -> int:
        owner = type(self).__name__
        group = self._cp.require_group(owner)
        if group is None:
            return 0
        mine = torch.tensor([batch, seq], dtype=torch.int64)
        shapes = [torch.empty_like(mine) for _ in range(self.cp_size)]
        dist.all_gather(shapes, mine, group=group)
        if any(not torch.equal(s, mine) for s in shapes):
            raise ValueError("%s: every cp rank must hold a chunk of the same [batch, seq] "
                             "(rank r holds positions [r * S / cp, (r + 1) * S / cp)), not %s"
                             % (owner, [s.tolist() for s in shapes]))
        return int(dist.get_rank(group)) * seq

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = _RingAttention.apply(q, k, v, self._cp.group,
                                                 1.0 / math.sqrt(self.head_dim))
        return out

    def extra_repr(self) -> str:
        return super().extra_repr() + ", cp_size=%d" % self.cp_size
