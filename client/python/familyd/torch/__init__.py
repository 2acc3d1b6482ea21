"""familyd.torch: PyTorch pieces for trainers that build their models through familyd.

familyd.torch.modules holds the reference torch implementations of the example registry's
members (deploy/registry): import it explicitly. familyd.torch.distributed joins a torchrun
job to a familyd mesh with torch DeviceMeshes (init, create_mesh, process_groups,
parallel_context, job_mesh, make_device_mesh, check_device_mesh, Job, JobMesh, JobError);
familyd.torch.build makes sharded modules through familyd (build_module, build_info, register,
release, derive_seed); familyd.torch.validate checks a live model (validate_model,
model_boundaries); familyd.torch.fsdp puts a built module under torch's FSDP2 over a
data-parallel axis (fully_shard, FullyShardError); familyd.torch.clip clips gradients on several
DeviceMeshes (clip_grad_norm_). Their names are reachable here, imported on first use. This package imports
nothing at import time, so `import familyd.torch` stays cheap and works without torch
installed.
"""

import importlib
from typing import Any

__all__ = ["modules", "distributed", "build", "validate", "init", "create_mesh",
           "process_groups", "parallel_context", "device_mesh", "make_device_mesh",
           "check_device_mesh", "mesh_groups", "job_mesh", "Job",
           "JobError", "JobMesh", "build_module", "build_info", "register", "release",
           "derive_seed", "BuildInfo", "ModuleBuildError", "validate_model", "model_boundaries",
           "ModelValidationError", "fsdp", "clip", "fully_shard", "FullyShardError",
           "clip_grad_norm_"]

_DISTRIBUTED = ("init", "create_mesh", "process_groups", "parallel_context", "device_mesh",
                "make_device_mesh", "check_device_mesh", "mesh_groups", "job_mesh", "Job",
                "JobError", "JobMesh")
_BUILD = ("build_module", "build_info", "register", "release", "derive_seed", "BuildInfo",
          "ModuleBuildError")
_VALIDATE = ("validate_model", "model_boundaries", "ModelValidationError")
_FSDP = ("fully_shard", "FullyShardError")
_CLIP = ("clip_grad_norm_",)


def __getattr__(name: str) -> Any:
    """Imports familyd.torch.distributed (and so torch) only when one of its names is used."""
    if name in _DISTRIBUTED:
        return getattr(importlib.import_module("familyd.torch.distributed"), name)
    if name in _BUILD:
        return getattr(importlib.import_module("familyd.torch.build"), name)
    if name in _VALIDATE:
        return getattr(importlib.import_module("familyd.torch.validate"), name)
    if name in _FSDP:
        return getattr(importlib.import_module("familyd.torch.fsdp"), name)
    if name in _CLIP:
        return getattr(importlib.import_module("familyd.torch.clip"), name)
    if name in ("modules", "distributed", "build", "validate", "fsdp", "clip"):
        return importlib.import_module("familyd.torch." + name)
    raise AttributeError("module 'familyd.torch' has no attribute %r" % name)
