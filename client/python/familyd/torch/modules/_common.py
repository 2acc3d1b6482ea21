"""What every member shares: reading the model config, the parallel context, shard ranges.

A member's constructor takes the registry's runtime names (config, module, module_fqn,
context) as keywords. `config` is a dict or any object with attributes (a transformers
config); `context` is a ParallelContext, a dict with the same keys, or None (every axis 1).
"""

from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence, Tuple

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

AXES = ("tp", "ep", "cp", "pp")
_MISSING = object()


@dataclass
class ParallelContext:
    """The job's axis sizes and, for the axes a member communicates over, their groups.

    groups: axis name ("tp", "ep", ...) -> torch.distributed ProcessGroup of that axis (the
    ranks that hold the other shards of this member). ranks: optional axis -> this process's
    coordinate on that axis, for building shapes without a group (on `meta`); with a group the
    coordinate is the group rank.

    sequence_parallel: outside the tensor-parallel blocks, activations are split over the
    sequence dimension across the tp group (each rank its equal piece): the tensor-parallel
    members all-gather the sequence on the way in and reduce-scatter it on the way out, the
    sequence-parallel norm sums its weight's gradient over tp. loss_parallel: the logits stay
    split over the vocabulary and the loss is vocab_parallel_cross_entropy (the trainer's
    choice: the members do not compute the loss). Both are the job's (its mesh's), as Resolve
    answers them (ResolvedFamily.sequence_parallel / .loss_parallel).
    """

    tp_size: int = 1
    ep_size: int = 1
    cp_size: int = 1
    pp_size: int = 1
    groups: dict = field(default_factory=dict)
    ranks: dict = field(default_factory=dict)
    sequence_parallel: bool = False
    loss_parallel: bool = False


def config_value(config: Any, name: str, default: Any = _MISSING, owner: str = "module") -> Any:
    """config[name] or config.name; a missing field without a default is a ValueError."""
    if config is None:
        value = _MISSING
    elif isinstance(config, dict):
        value = config.get(name, _MISSING)
    else:
        value = getattr(config, name, _MISSING)
    if value is _MISSING or value is None:
        if default is _MISSING:
            raise ValueError("%s: config has no field '%s'" % (owner, name))
        return default
    return value


def config_int(config: Any, name: str, owner: str, default: Any = _MISSING) -> int:
    value = config_value(config, name, default, owner)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError("%s: config field '%s' must be a positive integer, not %r"
                         % (owner, name, value))
    return value


def resolve_config(config: Any, module: Any, owner: str) -> Any:
    """The config a member is built from: config, else the source module's .config."""
    if config is None and module is not None:
        config = getattr(module, "config", None)
    if config is None:
        raise TypeError("%s needs config (or a module with a .config attribute)" % owner)
    return config


def _context_get(context: Any, name: str, default: Any) -> Any:
    if context is None:
        return default
    if isinstance(context, dict):
        return context.get(name, default)
    return getattr(context, name, default)


@dataclass
class Axis:
    """One axis as a member sees it: size, this process's coordinate, the group (or None)."""

    name: str
    size: int
    rank: int
    group: object

    def require_group(self, owner: str) -> Any:
        if self.size > 1 and self.group is None:
            raise RuntimeError("%s: %s_size=%d needs the %s process group in context.groups['%s']"
                               % (owner, self.name, self.size, self.name, self.name))
        return self.group


def context_axis(context: Any, axis: str, owner: str, coordinate: bool = True) -> Axis:
    """Read one axis from the context: its size, coordinate and group, checked. coordinate
    False: a member whose parameters do not depend on its coordinate on the axis (forward
    takes it from the group) is made without a group or ranks too; rank is then 0."""
    size = _context_get(context, axis + "_size", 1)
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError("%s: %s_size must be a positive integer, not %r" % (owner, axis, size))
    groups = _context_get(context, "groups", None) or {}
    ranks = _context_get(context, "ranks", None) or {}
    group = groups.get(axis)
    if group is not None:
        actual = dist.get_world_size(group)
        if actual != size:
            raise ValueError("%s: %s_size=%d but the %s group has %d ranks"
                             % (owner, axis, size, axis, actual))
        rank = dist.get_rank(group)
    elif size == 1 or (not coordinate and axis not in ranks):
        rank = 0
    elif axis in ranks:
        rank = ranks[axis]
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < size:
            raise ValueError("%s: context.ranks['%s']=%r is not in [0, %d)"
                             % (owner, axis, rank, size))
    else:
        raise ValueError("%s: %s_size=%d needs context.groups['%s'] (or context.ranks['%s'])"
                         % (owner, axis, size, axis, axis))
    return Axis(axis, size, rank, group)


def context_flag(context: Any, name: str, owner: str) -> bool:
    """The job flag `name` ("sequence_parallel" or "loss_parallel") of the context; False
    when the context does not say."""
    value = _context_get(context, name, False)
    if not isinstance(value, bool):
        raise ValueError("%s: context %s must be a bool, not %r" % (owner, name, value))
    return value


def reject_axis(context: Any, axis: str, owner: str, instead: str) -> None:
    """A member that does not parallelise over `axis` refuses a job where it is > 1."""
    size = _context_get(context, axis + "_size", 1)
    if isinstance(size, int) and not isinstance(size, bool) and size > 1:
        raise ValueError("%s does not support %s_size=%d; use %s" % (owner, axis, size, instead))


def chunk_range(length: int, parts: int, index: int) -> Tuple[int, int]:
    """[start, stop) of piece `index` when `length` is split as torch.chunk does (familyd's
    shard(d), docs/semantics.md): ceil(length / parts) each, the last ones short or empty."""
    chunk = -(-length // parts)
    return min(length, index * chunk), min(length, (index + 1) * chunk)


def local(p: torch.Tensor) -> torch.Tensor:
    """The tensor a member computes with: a DTensor parameter's local shard (to_local, which
    carries the gradient back to the DTensor with the same placements), any other tensor as
    it is. build_module binds DTensor parameters; a module made by hand holds plain ones."""
    if isinstance(p, DTensor):
        return p.to_local()
    return p


def new_parameter(shape: Sequence[int], device: Any, dtype: Any) -> torch.nn.Parameter:
    """An uninitialised parameter of the local shape (reset_parameters fills it)."""
    return torch.nn.Parameter(torch.empty(tuple(shape), device=device, dtype=dtype))


def init_normal(parameters: Iterable[torch.Tensor], std: float, mean: float = 0.0) -> None:
    """The registry's init {normal: {mean, std}}; parameters on `meta` are left alone."""
    with torch.no_grad():
        for p in parameters:
            if p.device.type != "meta":
                p.normal_(mean=mean, std=std)
