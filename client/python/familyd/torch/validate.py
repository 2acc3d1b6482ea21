"""validate_model(): a live torch model checked against its job by familyd's Validate.

DESIGN. The walk is by module identity, as the original framework's was: a module reached
under several names (aliases) is one boundary with all its fqns. Each module that
build_module made is a boundary: its build id and the layout it has now (logical shapes from
its build's layout, placements, and each parameter's current dtype: a module cast after it was
built shows as a layout conflict). A parameter tensor reached from modules of different builds
(tied weights) is declared to Validate as shared, with each build's parameter name; the daemon
compares their shapes, placements and dtypes. The daemon needs no parameter identity: the
client sends what it found.

The job's mesh, as the original checked it ("constructed families cannot be applied with a
different job mesh"): a module's parameters must live on the build's mesh as this job lays it.
For each DTensor parameter, every dimension of its DeviceMesh (a sub-mesh, or FSDP2's, included)
must be a dimension of the build's mesh view whose process group holds this rank's group of
that view (mesh position i is torch rank i, familyd.torch.distributed); with a JobMesh as the
context, each of its process groups must be the mesh's too. A module that fails either is sent
with an applied layout naming another mesh (the DeviceMesh or groups it found), and Validate
reports LAYOUT_MESH_MISMATCH with that text.

Activation layouts: a family's declared one (the registry's `layout`) comes with its build
(BuildInfo.layout.activations). A trainer that applies another records it on the module
(set_activation_layout); validate_model sends it and Validate reports each field that differs
(ACTIVATION_LAYOUT_CONFLICT). validate_model itself compares neighbours: for two boundaries next
to each other in the walk (neither inside the other), the first's out_dst must be the second's
in_src when both state them (ACTIVATION_NEIGHBOUR_MISMATCH, a violation made here).
"""

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from familyd.client import Client
from familyd.torch.build import build_info
from familyd.torch.distributed import JobMesh, axis_groups, mesh_groups
from familyd.torch.fsdp import FSDP_AXIS_ATTR

ACTIVATION_ATTR = "_familyd_activation_layout"
NEIGHBOUR_REASON = "ACTIVATION_NEIGHBOUR_MISMATCH"

_TORCH_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


class ModelValidationError(ValueError):
    """validate_model(raise_errors=True) found violations: .violations lists every one."""

    def __init__(self, violations: List[Any]) -> None:
        self.violations = violations
        lines = ["%s %s: %s" % (v.reason, list(v.fqns), v.message) for v in violations]
        super().__init__("the model does not fit its job (%d violations):\n  %s"
                         % (len(violations), "\n  ".join(lines)))


@dataclass
class Boundary:
    """One built module in the model: every fqn it is reached under, the module, its build."""

    fqns: Tuple[str, ...]
    module: torch.nn.Module
    build_id: str


def _aliases(model: torch.nn.Module) -> List[Tuple[torch.nn.Module, Tuple[str, ...]]]:
    """Every module of the model once, in first-reached order, with all its paths."""
    found: Dict[int, Tuple[torch.nn.Module, List[str]]] = {}
    for fqn, module in model.named_modules(remove_duplicate=False):
        found.setdefault(id(module), (module, []))[1].append(fqn)
    return [(module, tuple(paths)) for module, paths in found.values()]


def model_boundaries(model: torch.nn.Module) -> List[Boundary]:
    """The boundaries of the model: every module build_module made, by identity, with its
    aliases (the root's fqn is "")."""
    out = []
    for module, paths in _aliases(model):
        info = build_info(module)
        if info is not None:
            out.append(Boundary(paths, module, info.build_id))
    return out


def _dtensor_placements(tensor: DTensor, built: Any,
                        fsdp_axis: Optional[str] = None) -> List[Dict[str, str]]:
    """A DTensor's placements as familyd.v1.Placement dicts: a Shard(d) on mesh dimension NAME
    is shard(d) over axis NAME; Replicate() splits nothing (Validate drops replicate entries);
    anything else (Partial: a pending sum) is named by its kind, which Validate counts as a
    placement of its own. The build's placements over axes the DeviceMesh lacks (size 1 on
    this mesh view, or the axis familyd.torch.fully_shard took off the parameter's mesh) are
    kept as built. fsdp_axis: the axis FSDP2 shards the module's parameters over
    (familyd.torch.fully_shard): its placement there (Shard(0) or _StridedShard, FSDP's
    storage, all-gathered back before every use) counts as the Replicate() it was built as."""
    names = tensor.device_mesh.mesh_dim_names or ()
    out = [{"axis": x.axis, "kind": x.kind, "dim": str(x.dim)}
           for x in built.placements if x.axis not in names]
    for name, placement in zip(names, tensor.placements):
        if name == fsdp_axis:
            continue
        if placement.is_shard():
            out.append({"axis": name, "kind": "shard", "dim": str(getattr(placement, "dim"))})
        elif not placement.is_replicate():
            out.append({"axis": name, "kind": type(placement).__name__.lower(), "dim": "0"})
    return out


def applied_layout(module: torch.nn.Module, mesh_id: Optional[str] = None) -> Dict[str, Any]:
    """The layout the module has now, as a proto3 JSON dict of familyd.v1.Layout: the build's
    mesh and, per parameter of its layout, the logical shape and placements (a DTensor
    parameter's own: its global shape and its placements now, so a parameter redistributed
    after the build is reported; a plain tensor's: the layout's while the local shape is the
    one bound, else the current shape) and the current dtype. Under familyd.torch.fully_shard
    the placement FSDP2 adds on its axis counts as the build's Replicate() there. mesh_id: the
    mesh the module was found on, when it is not its build's (validate_model's mesh check)."""
    info = build_info(module)
    if info is None:
        raise ValueError("module %s was not built by familyd" % type(module).__name__)
    own = dict(module.named_parameters())
    params = []
    for p in info.layout.parameters:
        entry: Dict[str, Any] = {"name": p.name,
                                 "placements": [{"axis": x.axis, "kind": x.kind, "dim": str(x.dim)}
                                                for x in p.placements]}
        tensor = own.get(p.name)
        shape = list(p.shape)
        if isinstance(tensor, DTensor):
            shape = list(tensor.shape)
            entry["placements"] = _dtensor_placements(tensor, p,
                                                      getattr(module, FSDP_AXIS_ATTR, None))
        elif tensor is not None and tuple(tensor.shape) != info.local_shapes.get(p.name):
            shape = list(tensor.shape)
        entry["shape"] = [str(d) for d in shape]
        if tensor is not None and tensor.dtype in _TORCH_NAMES:
            entry["dtype"] = _TORCH_NAMES[tensor.dtype]
        params.append(entry)
    out: Dict[str, Any] = {"meshId": info.mesh_id if mesh_id is None else mesh_id,
                           "parameters": params}
    applied = getattr(module, ACTIVATION_ATTR, None)
    if applied is not None:
        out["activations"] = dict(applied)
    return out


def _activations_dict(layout: Any) -> Dict[str, Any]:
    """A familyd.v1.ActivationLayout (message or proto3 JSON dict) as a proto3 JSON dict."""
    if isinstance(layout, Mapping):
        return dict(layout)
    from google.protobuf import json_format
    result: Dict[str, Any] = json_format.MessageToDict(layout)
    return result


def set_activation_layout(module: torch.nn.Module, layout: Any) -> None:
    """Records the activation layout the trainer applies to a module build_module made (a
    familyd.v1.ActivationLayout or its proto3 JSON dict: inSrc, inDst, outSrc, outDst, each a
    list of {"placements": [{"axis", "kind", "dim"}]}, outNames, isBoundary); None forgets
    it. validate_model sends it, and Validate compares it with the constructed one."""
    if build_info(module) is None:
        raise ValueError("module %s was not built by familyd" % type(module).__name__)
    if layout is None:
        if hasattr(module, ACTIVATION_ATTR):
            delattr(module, ACTIVATION_ATTR)
        return
    setattr(module, ACTIVATION_ATTR, _activations_dict(layout))


def activation_layout(module: torch.nn.Module) -> Optional[Dict[str, Any]]:
    """The module's activation layout as a proto3 JSON dict: the one the trainer applied
    (set_activation_layout), else its family's as built, else None (none declared)."""
    applied = getattr(module, ACTIVATION_ATTR, None)
    if applied is not None:
        return dict(applied)
    info = build_info(module)
    if info is None:
        raise ValueError("module %s was not built by familyd" % type(module).__name__)
    if info.layout.HasField("activations"):
        return _activations_dict(info.layout.activations)
    return None


def _activation_key(activation: Mapping[str, Any]) -> Tuple[Tuple[str, str, int], ...]:
    """One activation's placements, comparable: (axis, kind, dim for shard), sorted by axis."""
    out = []
    for p in activation.get("placements", []):
        kind = p.get("kind", "")
        out.append((p.get("axis", ""), kind, int(p.get("dim", 0)) if kind == "shard" else 0))
    return tuple(sorted(out))


def _activation_text(activations: List[Mapping[str, Any]]) -> str:
    """[{tp: shard(1), dp: replicate}] as the registry writes it."""
    def one(a: Mapping[str, Any]) -> str:
        return "{%s}" % ", ".join(
            "%s: %s" % (axis, "shard(%d)" % dim if kind == "shard" else kind)
            for axis, kind, dim in _activation_key(a))
    return "[%s]" % ", ".join(one(a) for a in activations)


def _inside(outer: str, inner: str) -> bool:
    return outer == "" or inner == outer or inner.startswith(outer + ".")


def neighbour_mismatches(client: Client, boundaries: List[Boundary]) -> List[Any]:
    """Violations (made here, reason ACTIVATION_NEIGHBOUR_MISMATCH) for each two boundaries next
    to each other in the walk, neither inside the other, whose out_dst and in_src are both
    stated and differ."""
    Violation = client.protos.cls("familyd.v1.Violation")
    out = []
    for a, b in zip(boundaries, boundaries[1:]):
        fa, fb = (a.fqns[0] if a.fqns else ""), (b.fqns[0] if b.fqns else "")
        if _inside(fa, fb) or _inside(fb, fa):
            continue
        la, lb = activation_layout(a.module), activation_layout(b.module)
        if not la or not lb or not la.get("outDst") or not lb.get("inSrc"):
            continue
        if [_activation_key(x) for x in la["outDst"]] == [_activation_key(x) for x in lb["inSrc"]]:
            continue
        out.append(Violation(fqns=[fa, fb], reason=NEIGHBOUR_REASON, message=(
            "out_dst at %r %s disagrees with in_src at %r %s, the next component"
            % (fa, _activation_text(la["outDst"]), fb, _activation_text(lb["inSrc"])))))
    return out


def _all_parameters(module: torch.nn.Module) -> List[Tuple[str, Any]]:
    """Every (name, parameter) of the module, a parameter reached under several names once per
    name (torch 1.13's named_parameters has no remove_duplicate)."""
    out = []
    for prefix, sub in module.named_modules(remove_duplicate=False):
        for name, p in sub._parameters.items():
            if p is not None:
                out.append((prefix + "." + name if prefix else name, p))
    return out


def shared_parameters(boundaries: List[Boundary]) -> List[List[Dict[str, str]]]:
    """Parameters reached from boundaries of different builds: for each, its uses (fqn,
    build_id, parameter), in walk order."""
    uses: Dict[int, List[Dict[str, str]]] = {}
    for b in boundaries:
        prefix = b.fqns[0] + "." if b.fqns and b.fqns[0] else ""
        for name, p in _all_parameters(b.module):
            uses.setdefault(id(p), []).append({"fqn": prefix + name, "build_id": b.build_id,
                                               "parameter": name})
    out = []
    for found in uses.values():
        if len({u["build_id"] for u in found}) > 1:
            first_per_build: Dict[str, Dict[str, str]] = {}
            for u in found:
                first_per_build.setdefault(u["build_id"], u)
            out.append(list(first_per_build.values()))
    return out


class _MeshCheck:
    """Whether modules live on their build's mesh as this job lays it: this rank's group along
    each mesh dimension, in coordinate order (a DTensor's DeviceMesh, a JobMesh's process
    groups), against the positions familyd's mesh has there (position i is torch rank i).
    Caches each familyd mesh (GetMesh, or the JobMesh's) and each verdict."""

    def __init__(self, client: Client, job: Optional[JobMesh]) -> None:
        self.client = client
        self.job = job
        self.meshes: Dict[str, Any] = {job.mesh_id: job.mesh} if job is not None else {}
        self.verdicts: Dict[Tuple[int, str, str], Optional[str]] = {}
        self.rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0

    def _mesh(self, mesh_id: str) -> Any:
        if mesh_id not in self.meshes:
            self.meshes[mesh_id] = self.client.get_mesh(mesh_id)
        return self.meshes[mesh_id]

    def _mine(self, dims: List[Tuple[str, int]]) -> Dict[str, List[int]]:
        """axis -> the positions of this rank's group along it, over a row-major view."""
        return {name: next(g for g in groups if self.rank in g)
                for name, groups in axis_groups(dims)}

    def device_mesh(self, device_mesh: Any, mesh_id: str, view: str) -> Optional[str]:
        """None when every dimension of the DeviceMesh is one of the build's mesh view, with
        this rank's group along it; else a description of the DeviceMesh."""
        key = (id(device_mesh), mesh_id, view)
        if key not in self.verdicts:
            mesh = self._mesh(mesh_id)
            dims = [(str(d.name), int(d.size)) for d in
                    (mesh.expert_mesh if view == "expert" else mesh.device_mesh)]
            want = self._mine(dims)
            names = tuple(device_mesh.mesh_dim_names or ())
            ranks = device_mesh.mesh.to("cpu")
            at = (ranks == self.rank).nonzero()
            got: Dict[str, List[int]] = {}
            for k, name in enumerate(names if at.numel() else ()):
                index: List[Any] = list(at[0].tolist())
                index[k] = slice(None)
                got[name] = ranks[tuple(index)].tolist()   # in coordinate order
            verdict = None
            if not got or any(want.get(n) != r for n, r in got.items()):
                verdict = "torch DeviceMesh %s" % (
                    ", ".join("%s=%s" % (n, r) for n, r in got.items()) or "without names")
            self.verdicts[key] = verdict
        return self.verdicts[key]

    def job_groups(self, job: JobMesh) -> Optional[str]:
        """None when the JobMesh's process groups are its mesh's; else the first that is not."""
        key = (id(job), job.mesh_id, "groups")
        if key not in self.verdicts:
            verdict = None
            for name, groups in mesh_groups(job.mesh):
                want = next(g for g in groups if self.rank in g)
                group = job.groups.get(name)
                got = dist.get_process_group_ranks(group) if group is not None else None
                if got != want:
                    verdict = "job process group %s=%s" % (name, got)
                    break
            self.verdicts[key] = verdict
        return self.verdicts[key]

    def module(self, module: torch.nn.Module) -> Optional[str]:
        """None when the module lives on its build's mesh; else where it was found."""
        info = build_info(module)
        if info is None or not info.mesh_id:
            return None
        if self.job is not None and self.job.mesh_id == info.mesh_id:
            found = self.job_groups(self.job)
            if found is not None:
                return found
        views = {p.name: p.mesh_view for p in info.layout.parameters}
        for name, p in module.named_parameters():
            if isinstance(p, DTensor) and name in views:
                found = self.device_mesh(p.device_mesh, info.mesh_id, views[name])
                if found is not None:
                    return found
        return None


def _context(context: Union[JobMesh, Mapping[str, Any], None]) -> Optional[Mapping[str, Any]]:
    if isinstance(context, JobMesh):
        return {"mesh_id": context.mesh_id}
    return context


def validate_model(client: Client, model: torch.nn.Module,
                   context: Union[JobMesh, Mapping[str, Any], None] = None,
                   raise_errors: bool = False) -> List[Any]:
    """Validate on the live model: the familyd.v1.Violation list (empty: the model fits).

    context: the job, a JobMesh (its mesh) or Client.validate's context keywords (mesh_id=,
    ep_size=, ...). raise_errors=True raises ModelValidationError with every violation
    instead of returning a non-empty list. A module whose parameters are not on its build's
    mesh as the job lays it (a DTensor on another DeviceMesh, or a JobMesh context whose
    process groups are not its mesh's) is LAYOUT_MESH_MISMATCH: "constructed families cannot
    be applied with a different job mesh" (docs/torch.md). An activation layout recorded with
    set_activation_layout is sent and compared (ACTIVATION_LAYOUT_CONFLICT); neighbouring
    boundaries whose out_dst and in_src disagree are reported after the daemon's violations
    (ACTIVATION_NEIGHBOUR_MISMATCH)."""
    boundaries = model_boundaries(model)
    check = _MeshCheck(client, context if isinstance(context, JobMesh) else None)
    request = [{"fqns": list(b.fqns), "build_id": b.build_id,
                "applied_layout": applied_layout(b.module, check.module(b.module))}
               for b in boundaries]
    result = client.validate(request, _context(context),
                             shared_parameters=shared_parameters(boundaries))
    violations = list(result.violations) + neighbour_mismatches(client, boundaries)
    if violations and raise_errors:
        raise ModelValidationError(violations)
    return violations


__all__ = ["Boundary", "ModelValidationError", "activation_layout", "applied_layout",
           "model_boundaries", "neighbour_mismatches", "set_activation_layout",
           "shared_parameters", "validate_model"]
