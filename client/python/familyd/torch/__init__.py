"""familyd.torch: PyTorch pieces for trainers that build their models through familyd.

familyd.torch.modules holds the reference torch implementations of the example registry's
members (deploy/registry): import it explicitly. familyd.torch.distributed joins a torchrun
job to a familyd mesh with torch DeviceMeshes (init, create_mesh, process_groups,
parallel_context, job_mesh, make_device_mesh, check_device_mesh, Job, JobMesh, JobError);
familyd.torch.build makes sharded modules through familyd (build_module, build_info, register,
release, derive_seed); familyd.torch.validate checks a live model (validate_model,
model_boundaries); familyd.torch.fsdp puts a built module under torch's FSDP2 over a
data-parallel axis (fully_shard, FullyShardError); familyd.torch.clip clips gradients on several
DeviceMeshes (clip_grad_norm_); familyd.torch.pretrained builds a Llama-style model from a
directory of safetensors files (load_pretrained, LlamaForCausalLM, PretrainedError). Their
names are reachable here, imported on first use. This package imports
nothing at import time, so `import familyd.torch` stays cheap and works without torch
installed; it reads the installed torch's version from its package metadata and refuses a torch
older than OLDEST_TORCH with an ImportError that says so (docs/toolchain.md lists the torch
versions the tests ran on).
"""

import importlib
import importlib.metadata
import re
from typing import Any, Optional, Tuple

# The oldest torch release every torch test of the project passed on (docs/toolchain.md).
OLDEST_TORCH = (2, 9)

__all__ = ["modules", "distributed", "build", "validate", "init", "create_mesh",
           "process_groups", "parallel_context", "device_mesh", "make_device_mesh",
           "check_device_mesh", "mesh_groups", "job_mesh", "Job",
           "JobError", "JobMesh", "build_module", "build_info", "register", "release",
           "derive_seed", "BuildInfo", "ModuleBuildError", "validate_model", "model_boundaries",
           "ModelValidationError", "activation_layout", "set_activation_layout", "fsdp", "clip", "fully_shard", "FullyShardError",
           "clip_grad_norm_", "pretrained", "load_pretrained", "LlamaForCausalLM",
           "PretrainedError", "checkpoint", "save_checkpoint", "CheckpointSaveError",
           "vocab_parallel_cross_entropy", "gather_sequence", "reduce_scatter_sequence",
           "scatter_sequence"]

_DISTRIBUTED = ("init", "create_mesh", "process_groups", "parallel_context", "device_mesh",
                "make_device_mesh", "check_device_mesh", "mesh_groups", "job_mesh", "Job",
                "JobError", "JobMesh")
_BUILD = ("build_module", "build_info", "register", "release", "derive_seed", "BuildInfo",
          "ModuleBuildError")
_VALIDATE = ("validate_model", "model_boundaries", "ModelValidationError", "activation_layout",
             "set_activation_layout")
_FSDP = ("fully_shard", "FullyShardError")
_CLIP = ("clip_grad_norm_",)
_PRETRAINED = ("load_pretrained", "LlamaForCausalLM", "PretrainedError")
_CHECKPOINT = ("save_checkpoint", "CheckpointSaveError")
_MODULES = ("vocab_parallel_cross_entropy", "gather_sequence", "reduce_scatter_sequence",
            "scatter_sequence")


def torch_release(version: str) -> Optional[Tuple[int, int]]:
    """(major, minor) of a torch version ("2.13.0+cpu", "2.9.0a0+git1234"), None if it has
    none."""
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _check_torch() -> None:
    """ImportError when the installed torch is older than OLDEST_TORCH; nothing when torch is
    not installed (the submodules' `import torch` says so) or its version cannot be read."""
    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return
    release = torch_release(version)
    if release is not None and release < OLDEST_TORCH:
        raise ImportError(
            "familyd.torch needs torch %d.%d or newer, and this Python has torch %s: install a "
            "newer torch (the project tests the one pinned in deploy/dev/requirements.txt)"
            % (OLDEST_TORCH + (version,)))


_check_torch()


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
    if name in _PRETRAINED:
        return getattr(importlib.import_module("familyd.torch.pretrained"), name)
    if name in _CHECKPOINT:
        return getattr(importlib.import_module("familyd.torch.checkpoint"), name)
    if name in _MODULES:
        return getattr(importlib.import_module("familyd.torch.modules"), name)
    if name in ("modules", "distributed", "build", "validate", "fsdp", "clip", "pretrained",
                "checkpoint"):
        return importlib.import_module("familyd.torch." + name)
    raise AttributeError("module 'familyd.torch' has no attribute %r" % name)
