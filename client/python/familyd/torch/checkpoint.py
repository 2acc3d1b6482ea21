"""save_checkpoint(): a model's parameters written as safetensors under the names they are
loaded from, so that the job's output loads back into any mesh (familyd.torch.load_pretrained,
build_module(checkpoint=...), or transformers' from_pretrained for a Llama).

Names. A module familyd built (build_info()) writes each parameter under the registry's
checkpoint names of its family (ParameterLayout.checkpoint in the Build reply; docs/registry.md,
"Checkpoint names"), `{prefix}` being the prefix it was built from (BuildRequest.checkpoint)
or else its fqn, the maps undone: a transposed tensor is transposed back, a stacked parameter
is written as one tensor per index, a concatenation is split into its parts (taken to be of
equal extent, each part's shards regrouped when the mesh shards the concatenated dimension:
the rule "sharded before joined" undone). A parameter without registry names, or with
names="parameters", is written as "<prefix>.<parameter>" in its logical shape (what
build_module(checkpoint_names="parameters") reads); every other parameter of the model under
its own fqn. A tensor two modules share by name (a tied head built from the embedding's
tensor) is written once.

Gathered, written by one rank. Every rank of the job calls save_checkpoint with the same
model (it is a collective: DTensor.full_tensor() of each sharded parameter, in the model's
order); the full tensors are gathered one at a time, and global rank 0 writes them, in files
of at most max_file_bytes (model-0000K-of-0000N.safetensors and model.safetensors.index.json,
or one model.safetensors when they fit), then config.json when a config is given. Memory: one
full tensor at a time on every rank, plus one file's tensors on rank 0.
"""

import hashlib
import json
import os
import re
from typing import Any, Dict, Iterator, List, Mapping, Optional, Set, Tuple, Union

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard

from familyd.torch.build import build_info

_SOURCE = re.compile(r"^(?:stack\(dim=(-?\d+), key=(\w+)\): )?(?:concat\(dim=(-?\d+)\): )?(.+)$")
_TRANSPOSED = " (transposed)"


class CheckpointSaveError(ValueError):
    """A parameter save_checkpoint cannot write under its checkpoint names (the message says
    which and why)."""


def _full(p: torch.Tensor) -> torch.Tensor:
    """The whole logical tensor (a collective for a DTensor)."""
    t = p.full_tensor() if isinstance(p, DTensor) else p
    return t.detach()


def _shard_groups(p: torch.Tensor, dim: int) -> int:
    """How many pieces the mesh cuts dimension dim of p into (1 for a plain tensor)."""
    if not isinstance(p, DTensor):
        return 1
    g = 1
    for i, placement in enumerate(p.placements):
        if isinstance(placement, Shard) and placement.dim % p.dim() == dim:
            g *= p.device_mesh.size(i)
    return g


def _name(template: str, prefix: str, key: Optional[str], index: int) -> str:
    name = template.replace("{prefix}", prefix) if prefix else template.replace("{prefix}.", "")
    return name.replace("{%s}" % key, str(index)) if key else name


def _parts(where: str, t: torch.Tensor, dim: int, n: int, groups: int) -> List[torch.Tensor]:
    """The n parts of t joined along dim, each sharded into groups before the join."""
    extent = t.shape[dim]
    if extent % (n * groups):
        raise CheckpointSaveError(
            "%s: its %d concatenated parts cannot be split evenly from %d along dimension %d "
            "(in %d shard groups); save it with names=\"parameters\"" % (where, n, extent, dim,
                                                                      groups))
    piece = extent // (n * groups)
    group = extent // groups
    return [torch.cat([t.narrow(dim, k * group + i * piece, piece) for k in range(groups)],
                      dim=dim) for i in range(n)]


def unmap(where: str, source: str, prefix: str, p: torch.Tensor,
          full: torch.Tensor) -> Iterator[Tuple[str, torch.Tensor]]:
    """(tensor name, tensor) of parameter p (its whole value: full) under its checkpoint names
    (source: ParameterLayout.checkpoint's canonical text)."""
    m = _SOURCE.match(source)
    if not m:
        raise CheckpointSaveError("%s: checkpoint names %r are not understood" % (where, source))
    stack_dim, key, concat_dim, rest = m.groups()
    parts = [(t[:-len(_TRANSPOSED)], True) if t.endswith(_TRANSPOSED) else (t, False)
             for t in rest.split(", ")]
    ndim = full.dim()
    sd = int(stack_dim) % ndim if stack_dim is not None else None
    cd = int(concat_dim) % ndim if concat_dim is not None else None
    groups = _shard_groups(p, cd) if cd is not None else 1
    count = full.shape[sd] if sd is not None else 1
    for index in range(count):
        value = full.select(sd, index) if sd is not None else full
        d = cd - (1 if sd is not None and cd > sd else 0) if cd is not None else None
        values = _parts(where, value, d, len(parts), groups) if d is not None else [value]
        if d is None and len(parts) != 1:
            raise CheckpointSaveError("%s: %d tensors without a concatenation" % (where,
                                                                                len(parts)))
        for (template, transposed), v in zip(parts, values):
            if transposed:
                v = v.transpose(-2, -1)
            yield _name(template, prefix, key, index), v.contiguous()


def _module_tensors(module: torch.nn.Module, info: Any,
                    names: str) -> Iterator[Tuple[str, torch.Tensor]]:
    prefix = info.request.checkpoint.prefix if info.request.HasField("checkpoint") else info.fqn
    for lp in info.layout.parameters:
        p = getattr(module, lp.name)
        full = _full(p)
        where = "parameter %r of %s (%s)" % (lp.name, info.fqn or "the module",
                                             info.request.family)
        if names == "registry" and lp.checkpoint:
            yield from unmap(where, lp.checkpoint, prefix, p, full)
        else:
            yield ("%s.%s" % (prefix, lp.name) if prefix else lp.name), full


def _tensors(model: torch.nn.Module, names: str) -> Iterator[Tuple[str, torch.Tensor]]:
    """Every tensor to write, in the model's order (the same on every rank)."""
    done: Set[int] = set()
    for fqn, module in model.named_modules():
        info = build_info(module)
        if info is None:
            continue
        done.update(id(p) for p in module.parameters())
        yield from _module_tensors(module, info, names)
    for fqn, p in model.named_parameters():
        if id(p) not in done:
            done.add(id(p))
            yield fqn, _full(p)


def _digest(t: torch.Tensor) -> str:
    """What tells two tensors of one name apart: dtype, shape and a hash of the bytes."""
    data = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return "%s %s %s" % (t.dtype, tuple(t.shape), hashlib.blake2b(data, digest_size=16).hexdigest())


def _write(directory: str, files: List[Dict[str, torch.Tensor]]) -> None:
    from safetensors.torch import save_file
    metadata = {"format": "pt"}
    if len(files) == 1:
        save_file(files[0], os.path.join(directory, "model.safetensors"), metadata=metadata)
        return
    weight_map, total = {}, 0
    for k, tensors in enumerate(files):
        name = "model-%05d-of-%05d.safetensors" % (k + 1, len(files))
        save_file(tensors, os.path.join(directory, name), metadata=metadata)
        for t_name, t in tensors.items():
            weight_map[t_name] = name
            total += t.numel() * t.element_size()
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def save_checkpoint(model: torch.nn.Module, directory: Union[str, "os.PathLike[str]"],
                    config: Optional[Mapping[str, Any]] = None, names: str = "registry",
                    max_file_bytes: int = 5 << 30) -> List[str]:
    """Writes model's parameters into directory as safetensors (see the module docstring):
    call it on every rank of the job. names: "registry" (default), each familyd-built
    parameter under its family's checkpoint names; "parameters", under "<prefix>.<parameter>".
    config: written as config.json (a dict: the model's transformers config). Returns the
    tensor names written, on every rank. Raises CheckpointSaveError for a parameter whose
    checkpoint names cannot be undone, ValueError for two different tensors under one name."""
    if names not in ("registry", "parameters"):
        raise ValueError("save_checkpoint: names must be \"registry\" or \"parameters\", not %r"
                         % (names,))
    directory = os.fspath(directory)
    writer = not dist.is_initialized() or dist.get_rank() == 0
    files: List[Dict[str, torch.Tensor]] = [{}]
    size = 0
    written: Dict[str, str] = {}
    for name, tensor in _tensors(model, names):
        # Every rank has the same full tensor: each decides alike on a repeated name.
        digest = _digest(tensor)
        if name in written:
            if written[name] != digest:
                raise ValueError("save_checkpoint: two different tensors are named %r" % name)
            continue
        written[name] = digest
        if not writer:
            continue
        nbytes = tensor.numel() * tensor.element_size()
        if files[-1] and size + nbytes > max_file_bytes:
            files.append({})
            size = 0
        files[-1][name] = tensor.cpu().clone()
        size += nbytes
    if writer:
        os.makedirs(directory, exist_ok=True)
        _write(directory, files)
        if config is not None:
            with open(os.path.join(directory, "config.json"), "w") as f:
                json.dump(dict(config), f, indent=2)
    if dist.is_initialized():
        dist.barrier()
    return list(written)


__all__ = ["CheckpointSaveError", "save_checkpoint", "unmap"]
