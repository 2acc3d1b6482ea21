"""clip_grad_norm_(): torch's gradient clipping over parameters on several DeviceMeshes.

DESIGN. torch.nn.utils.clip_grad_norm_ works on a familyd-built model whose parameters are all
DTensors on ONE DeviceMesh (the device view's): each gradient's norm is a DTensor pending a
reduction over the mesh dimensions that shard it, and torch stacks them into one. A model with
grouped experts has parameters on a second DeviceMesh (the expert view's, edp_shard x ep), and
torch's stack of the per-parameter norms then fails with DTensor's "All operands in
aten.stack.default must have the same mesh, but got DeviceMesh((dp=2, tp=2), ...) and
DeviceMesh((edp_shard=2, ep=2), ...)": DTensor has no operation across meshes. This
clip_grad_norm_ groups the gradients by DeviceMesh (plain tensors in a group of their own),
takes torch.nn.utils.get_total_norm of each group, reduces it to a plain tensor (full_tensor:
every rank of the mesh gets the group's norm, replicas counted once), combines the groups'
norms with the same norm and scales every gradient's local tensor by torch's clip coefficient.
"""

from typing import Any, Iterable, List, Optional, Tuple, Union

import torch
from torch.distributed.tensor import DTensor


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def grad_groups(parameters: Iterable[torch.Tensor]) -> List[Tuple[Any, List[torch.Tensor]]]:
    """The parameters' gradients (those that have one) grouped by their DeviceMesh, in first-seen
    order: [(mesh, [grad, ...]), ...], mesh None for plain tensors."""
    groups: List[Tuple[Any, List[torch.Tensor]]] = []
    for p in parameters:
        g = p.grad
        if g is None:
            continue
        key = g.device_mesh if isinstance(g, DTensor) else None
        for mesh, grads in groups:
            if (mesh is None and key is None) or (mesh is not None and key is not None and
                                                  (mesh is key or mesh == key)):
                grads.append(g)
                break
        else:
            groups.append((key, [g]))
    return groups


def clip_grad_norm_(parameters: Union[torch.Tensor, Iterable[torch.Tensor]], max_norm: float,
                    norm_type: float = 2.0, error_if_nonfinite: bool = False,
                    foreach: Optional[bool] = None) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_ for parameters on any number of DeviceMeshes (a
    familyd-built model with both mesh views: the experts' parameters on the expert view's
    DeviceMesh, the others on the device view's) and plain tensors.

    Returns the total norm of all the gradients as a plain 0-dim tensor, the same on every rank
    (each DTensor gradient counted once over its replicas, as full_tensor() would see it), and
    scales every gradient in place by min(1, max_norm / (total + 1e-6)), as torch does.
    Arguments as torch.nn.utils.clip_grad_norm_ (error_if_nonfinite: RuntimeError for a nan or
    inf total). Collective over every DeviceMesh a gradient is on: every rank of the job calls
    it with its parameters in the same order."""
    with torch.no_grad():
        return _clip(parameters, max_norm, norm_type, error_if_nonfinite, foreach)


def _clip(parameters: Union[torch.Tensor, Iterable[torch.Tensor]], max_norm: float,
          norm_type: float, error_if_nonfinite: bool, foreach: Optional[bool]) -> torch.Tensor:
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    groups = grad_groups(list(parameters))
    if not groups:
        return torch.tensor(0.0)
    norms = []
    for _, grads in groups:
        norm = torch.nn.utils.get_total_norm(grads, norm_type, False, foreach)
        norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    total = torch.nn.utils.get_total_norm(norms, norm_type, error_if_nonfinite, foreach)
    coefficient = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    locals_ = [_local(g) for _, grads in groups for g in grads]
    for g in locals_:
        g.mul_(coefficient.to(g.device, g.dtype))
    return total


__all__ = ["clip_grad_norm_", "grad_groups"]
