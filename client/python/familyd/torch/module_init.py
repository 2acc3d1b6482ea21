"""init: module: a member's parameters initialised by the constructed module itself.

DESIGN. familyd cannot run Python, so for a parameter whose registry init is ``module`` the
daemon lays out and makes the shards (zeros) and this package writes the values: the member is
constructed once more, whole (unsharded: a sharded reset_parameters would depend on the layout;
its ``context``, when it takes one, is ParallelContext() with every axis 1) on the CPU under ``torch.manual_seed(seed)`` (the module's derived seed), its
``reset_parameters()`` runs once under the same seed when it has one, and each shard gets its
slice of every full tensor (global offset and local shape from the Build reply).

- A training handout (trainable=True) is this process's own writable build: the process writes
  its rank's slices into it and goes on.
- A frozen module (trainable=False) is one read-only build shared by the node. The daemon never
  makes it with zeros (MODULE_INIT_PENDING): the node's filler, the process with LOCAL_RANK 0
  (every process without torchrun's LOCAL_RANK), builds the same request writable (one build,
  all of the node's ranks), writes every rank's slices, unmaps it and publishes it
  (PublishBuild: sealed against writes, from then on the read-only build of the request); then
  it builds read-only like every other process, which gets that same build. The other
  processes retry their read-only Build until it is published, at most ``wait`` seconds.

Either way the module's ``_hp_reset_after_materialization`` is False: its values are final.
"""

import gc
import os
import time
from typing import Any, Callable, Dict, List, Mapping, Tuple

import torch

from familyd.client import Build, Client, FamilydError
from familyd.torch.modules._common import ParallelContext

# How long a process that is not its node's filler waits for the filler's publish.
WAIT_SECONDS = 300.0
_POLL_SECONDS = 0.1


def module_init_names(client: Client, member: Any) -> List[str]:
    """The member's parameters whose registry init is ``module`` (GetFamily: the variant's own
    parameters, else the family's)."""
    family = client.get_family(member.family)
    params = list(family.parameters)
    for v in family.variants:
        if v.name == member.variant and len(v.parameters):
            params = list(v.parameters)
    return [p.name for p in params if p.init == "module"]


def module_values(constructor: Callable[..., Any], kwargs: Mapping[str, Any],
                  seed: int) -> Dict[str, torch.Tensor]:
    """name -> the full tensor of each parameter of the member constructed whole on the CPU
    under torch.manual_seed(seed), then reset_parameters() once under the same seed when the
    module has one. The caller's random state is left as it was."""
    kw = dict(kwargs)
    if "device" in kw:
        kw["device"] = torch.device("cpu")
    if "context" in kw:
        # Whole: every axis of size 1, no groups (its shards are cut from the full tensors).
        kw["context"] = ParallelContext() if isinstance(kw["context"], ParallelContext) else None
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        with torch.device("cpu"):
            whole = constructor(**kw)
        reset = getattr(whole, "reset_parameters", None)
        if callable(reset):
            torch.manual_seed(seed)
            with torch.no_grad():
                reset()
    return {name: p.detach() for name, p in whole.named_parameters()}


def _slices(build: Build, rank: int) -> Dict[str, Tuple[int, ...]]:
    for s in build.message.shards:
        if s.rank == rank:
            return {sl.parameter: tuple(int(x) for x in sl.global_offset) for sl in s.slices}
    return {}


def write_rank(build: Build, rank: int, names: List[str], values: Mapping[str, torch.Tensor],
               where: str) -> None:
    """Writes rank's slice of each of names' full tensors into its (writable) mapping."""
    if rank not in build.ranks:
        return  # every slice empty: nothing mapped, nothing to write
    offsets = _slices(build, rank)
    tensors = build.ranks[rank].torch()
    try:
        for name in names:
            dst = tensors.get(name)
            if dst is None or dst.numel() == 0:
                continue
            full = values.get(name)
            if full is None:
                raise RuntimeError("%s: parameter %r has init: module, but the constructed "
                                   "module has no such parameter" % (where, name))
            index = tuple(slice(o, o + n) for o, n in zip(offsets[name], dst.shape))
            dst.copy_(full[index] if index else full)
    finally:
        del tensors


def _unmap(build: Build) -> None:
    build.close()
    gc.collect()  # the last views of the mappings go, so the publish may seal them


def is_filler() -> bool:
    """The node's filler: LOCAL_RANK 0, or a process started without torchrun."""
    return os.environ.get("LOCAL_RANK", "0") == "0"


def fill_and_publish(client: Client, family: str, request_kw: Dict[str, Any],
                     values_of: Callable[[Build], Tuple[List[str], Dict[str, torch.Tensor]]],
                     where: str) -> Build:
    """The filler's part for a frozen module: builds the request writable (shared), writes the
    module's values into each of the node's ranks, unmaps and publishes it. Returns that
    build, unmapped, still held: the caller drops this reference once its read-only Build holds
    the published build (a grace period of 0 would free it in between)."""
    writable = client.build(family, mode="shared", **request_kw)
    try:
        names, values = values_of(writable)
        for rank in list(writable.ranks):
            write_rank(writable, rank, names, values, where)
        _unmap(writable)
        client.publish_build(writable.id)
    except BaseException:
        writable.close()
        writable.release()
        raise
    return writable


def wait_published(client: Client, family: str, request_kw: Dict[str, Any], where: str,
                   wait: float = WAIT_SECONDS) -> Build:
    """A non-filler's read-only Build, retried while its build is not yet published."""
    deadline = time.monotonic() + wait
    while True:
        try:
            return client.build(family, mode="private", **request_kw)
        except FamilydError as e:
            if e.reason != "MODULE_INIT_PENDING":
                raise
            if time.monotonic() >= deadline:
                raise TimeoutError("%s: waited %g s for the node's filler (LOCAL_RANK 0) to "
                                   "publish the build of its init: module parameters"
                                   % (where, wait)) from None
        time.sleep(_POLL_SECONDS)
