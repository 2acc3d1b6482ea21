"""familyd.torch: PyTorch pieces for trainers that build their models through familyd.

familyd.torch.modules holds the reference torch implementations of the example registry's
members (deploy/registry): import it explicitly. familyd.torch.distributed joins a torchrun
job to a familyd mesh; its names (init, create_mesh, process_groups, parallel_context,
device_mesh, Job, JobError) are also reachable here, imported on first use. This package
imports nothing at import time, so `import familyd.torch` stays cheap and works without torch
installed.
"""

import importlib
from typing import Any

__all__ = ["modules", "distributed", "init", "create_mesh", "process_groups",
           "parallel_context", "device_mesh", "mesh_groups", "Job", "JobError"]

_DISTRIBUTED = ("init", "create_mesh", "process_groups", "parallel_context", "device_mesh",
                "mesh_groups", "Job", "JobError")


def __getattr__(name: str) -> Any:
    """Imports familyd.torch.distributed (and so torch) only when one of its names is used."""
    if name in _DISTRIBUTED:
        return getattr(importlib.import_module("familyd.torch.distributed"), name)
    if name in ("modules", "distributed"):
        return importlib.import_module("familyd.torch." + name)
    raise AttributeError("module 'familyd.torch' has no attribute %r" % name)
