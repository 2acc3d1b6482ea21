"""fully_shard(): torch's FSDP2 over one data-parallel axis of a familyd-built model.

DESIGN. build_module binds each parameter as a DTensor on the whole DeviceMesh of its mesh view
(dp x tp for the device view, edp_shard x ep for the expert view), Replicate() on the
data-parallel axis. torch's FSDP2 (torch.distributed.fsdp.fully_shard) takes a model-parallel
DTensor parameter only on a mesh WITHOUT its data-parallel dimension, sharing the root mesh with
the FSDP mesh (it concatenates the two). fully_shard() therefore re-binds every DTensor
parameter of the module onto the sub-mesh of the view's other dimensions (view[("tp",)]), with
the same local tensor (zero-copy) and the placements of those dimensions, and then calls torch's
fully_shard with mesh=view[axis]. A parameter whose view has no other dimension becomes a plain
tensor (its local tensor is the whole parameter: it is replicated over the axis). Parameters of
submodules already under FSDP (an earlier fully_shard, e.g. the experts over edp_shard) are
left to it; plain tensor parameters (a router made by hand) are FSDP's as usual.

FSDP2 copies every parameter into its own sharded storage: after fully_shard the parameters no
longer view familyd's copy-on-write shards (the values are the same; the shards stay mapped
until familyd.torch.release). validate_model still checks the model: familyd.torch.validate
counts the placement FSDP adds on the axis it shards (Shard(0) or _StridedShard over `axis`) as
the Replicate() the build had there, since FSDP all-gathers it back before every use; every
other axis is checked as before.
"""

from typing import Any, Dict, List, Optional, Tuple

import torch
from torch.distributed.tensor import DTensor

from familyd.torch.distributed import JobMesh

# Set on every module that familyd.torch.fully_shard put under FSDP: the axis FSDP shards over.
FSDP_AXIS_ATTR = "_familyd_fsdp_axis"


class FullyShardError(ValueError):
    """fully_shard refused the module (nothing was changed)."""


def _where() -> str:
    return "familyd.torch.fully_shard"


def _view_of(mesh: JobMesh, axis: str) -> Tuple[str, Any]:
    """("device" or "expert", the view's DeviceMesh) of the view that has `axis`."""
    views = [("device", mesh.device_mesh), ("expert", mesh.expert_mesh)]
    for name, device_mesh in views:
        if device_mesh is not None and axis in (device_mesh.mesh_dim_names or ()):
            return name, device_mesh
    raise FullyShardError(
        "%s: axis %r is not a dimension of mesh %s's DeviceMeshes (device view %s, expert view "
        "%s)" % (_where(), axis, mesh.mesh_id, _names(mesh.device_mesh),
                 _names(mesh.expert_mesh)))


def _names(device_mesh: Any) -> Optional[List[str]]:
    return None if device_mesh is None else list(device_mesh.mesh_dim_names or ())


def _is_fsdp(module: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule
    return isinstance(module, FSDPModule)


def _owned(module: torch.nn.Module) -> Tuple[List[torch.nn.Module],
                                             List[Tuple[torch.nn.Module, str, str, Any]]]:
    """The modules whose parameters the fully_shard of `module` manages (not submodules
    already under FSDP), and (owner, attribute, fqn, parameter) of every such parameter."""
    out = []
    modules: List[torch.nn.Module] = []
    stack: List[Tuple[str, torch.nn.Module]] = [("", module)]
    seen = set()
    while stack:
        prefix, m = stack.pop(0)
        if id(m) in seen:
            continue
        seen.add(id(m))
        modules.append(m)
        for name, p in m._parameters.items():
            if p is not None:
                out.append((m, name, prefix + name, p))
        for name, child in m._modules.items():
            if child is not None and not _is_fsdp(child):
                stack.append((prefix + name + ".", child))
    return modules, out


def _rebound(p: Any, sub_mesh: Any, keep: List[int]) -> torch.nn.Parameter:
    """The DTensor parameter p on the sub-mesh of its mesh dimensions `keep` (the same local
    tensor), or that local tensor as a plain parameter when no dimension is kept."""
    with torch.no_grad():
        data = p.to_local()
    if sub_mesh is None:
        return torch.nn.Parameter(data, requires_grad=p.requires_grad)
    placements = [p.placements[i] for i in keep]
    tensor = DTensor.from_local(data, sub_mesh, placements, run_check=False, shape=p.shape,
                                stride=p.stride())
    return torch.nn.Parameter(tensor, requires_grad=p.requires_grad)


def fully_shard(module: torch.nn.Module, mesh: JobMesh, axis: str = "dp",
                **fsdp_kwargs: Any) -> torch.nn.Module:
    """torch.distributed.fsdp.fully_shard of a familyd-built module over the JobMesh's `axis`.

    axis: a data-parallel axis of the mesh: "dp" (device view) or "edp_shard" (the expert
    view's). Every DTensor parameter of `module` (but those already under FSDP) must be on the
    DeviceMesh of the view `axis` belongs to and Replicate() on it; all are re-bound onto the
    sub-mesh of the view's other dimensions (zero-copy), then torch's fully_shard(module,
    mesh=view[axis], **fsdp_kwargs) runs (reshard_after_forward=, mp_policy=, ...; not mesh=).
    FSDP2 then copies the parameters into its own sharded storage: they no longer share
    familyd's copy-on-write shards (the values are kept). Returns the module (an FSDPModule).
    Raises FullyShardError (a ValueError) before changing anything when a parameter does not
    fit; collective like torch's fully_shard: every rank calls it with the same arguments."""
    from torch.distributed.fsdp import fully_shard as torch_fully_shard
    if not isinstance(mesh, JobMesh):
        raise TypeError("%s: mesh must be a familyd.torch.JobMesh (familyd.torch.job_mesh), not "
                        "%s" % (_where(), type(mesh).__name__))
    if "mesh" in fsdp_kwargs:
        raise TypeError("%s: mesh= is the JobMesh's view[axis]; pass axis= instead"
                        % _where())
    view, view_mesh = _view_of(mesh, axis)
    names = list(view_mesh.mesh_dim_names)
    keep = [i for i, n in enumerate(names) if n != axis]
    at = names.index(axis)
    managed, owned = _owned(module)
    for _, _, fqn, p in owned:
        if not isinstance(p, DTensor):
            continue
        if p.device_mesh is not view_mesh and p.device_mesh != view_mesh:
            raise FullyShardError(
                "%s: parameter %r is laid out on DeviceMesh %s, not on the %s view %s that axis "
                "%r belongs to (shard each view's modules over its own data-parallel axis: "
                "\"dp\" for the device view, \"edp_shard\" for the expert view)"
                % (_where(), fqn, _names(p.device_mesh), view, names, axis))
        if not p.placements[at].is_replicate():
            raise FullyShardError(
                "%s: parameter %r is %r on axis %r, not Replicate(): FSDP shards only a "
                "parameter that is replicated over its data-parallel axis"
                % (_where(), fqn, p.placements[at], axis))
    sub_mesh = view_mesh[tuple(names[i] for i in keep)] if keep else None
    done: Dict[int, torch.nn.Parameter] = {}
    for owner, name, _, p in owned:
        if isinstance(p, DTensor):
            if id(p) not in done:
                done[id(p)] = _rebound(p, sub_mesh, keep)
            setattr(owner, name, done[id(p)])
    result = torch_fully_shard(module, mesh=view_mesh[axis], **fsdp_kwargs)
    for m in managed:
        setattr(m, FSDP_AXIS_ATTR, axis)
    return result


__all__ = ["FSDP_AXIS_ATTR", "FullyShardError", "fully_shard"]
