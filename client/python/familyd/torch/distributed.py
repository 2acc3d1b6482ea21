"""A torchrun job on a familyd mesh: init(), create_mesh(), process_groups().

DESIGN. torchrun numbers a job's processes in rendezvous order: node ranks in arrival order,
which need not be familyd's node order (Topology.nodes). Instead of insisting they agree, the
job is laid over torch's order. init() all-gathers every process's familyd global rank (its
node's first_rank plus LOCAL_RANK), and create_mesh() passes that list as Mesh.ranks, so mesh
position i is torch rank i (Mesh.ranks[i] is the familyd rank of torch rank i). The process
groups then follow the row-major layout of the mesh over mesh positions, which are torch ranks,
and familyd's builds put rank Mesh.ranks[i]'s shard where torch rank i runs.

init() reads only torchrun's RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and
MASTER_PORT. Whether the job fits is decided collectively, after the gather, so that every
process fails with the same sentence instead of the good ones hanging in a collective: a job
fails when a node has more local processes than devices, or when two processes claim one device
(the same familyd rank).

torch.distributed.new_group must be called by every rank for every group, in the same order:
process_groups() walks the device view's axes, then the expert view's, in mesh order, and for
each axis every group of it in ascending order of its first rank. job_mesh() instead makes one
torch DeviceMesh per view (whose construction is collective in the same way) and takes each
axis's group from it, so that the groups of the modules and of torch's own parallelism (DTensor,
FSDP2, DCP) are the same groups.
"""

import datetime
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist

from familyd.client import Client, MeshSpec
from familyd.torch.modules._common import ParallelContext

ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
DEFAULT_TIMEOUT = datetime.timedelta(minutes=30)
EXPERT_PREFIX = "expert."


class JobError(RuntimeError):
    """The job cannot run on familyd's devices (every rank raises the same sentence)."""


@dataclass
class Job:
    """This process in its job: torch's rank and world, torchrun's local rank, familyd's rank.

    familyd_ranks[i] is the familyd global rank of torch rank i (the Mesh.ranks to create)."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    familyd_rank: int
    familyd_ranks: List[int] = field(default_factory=list)
    node: str = ""
    backend: str = ""
    nodes: List[str] = field(default_factory=list)

    def local_familyd_ranks(self) -> List[int]:
        """The familyd ranks of this node's processes, ascending: what one shared build per
        node materialises (every local process asks for the same list, so they share it)."""
        if not self.nodes:
            return [self.familyd_rank]
        return sorted(r for r, n in zip(self.familyd_ranks, self.nodes) if n == self.node)


def _env_int(name: str, env: Mapping[str, str]) -> int:
    value = env.get(name)
    if value is None or value == "":
        raise JobError("familyd.torch.init: %s is not set (launch the job with torchrun, which "
                       "sets %s)" % (name, ", ".join(ENV)))
    try:
        number = int(value)
    except ValueError:
        raise JobError("familyd.torch.init: %s=%r is not an integer" % (name, value)) from None
    if number < 0:
        raise JobError("familyd.torch.init: %s=%d is negative" % (name, number))
    return number


def _local_node(topology: Any) -> Any:
    for node in topology.nodes:
        if node.local or node.name == topology.local_node:
            return node
    raise JobError("familyd.torch.init: the daemon's topology has no local node (%r)"
                   % topology.local_node)


def _timeout(timeout: Union[float, datetime.timedelta]) -> datetime.timedelta:
    if isinstance(timeout, datetime.timedelta):
        return timeout
    return datetime.timedelta(seconds=float(timeout))


def _start(backend: Optional[str], timeout: datetime.timedelta, local_rank: int) -> str:
    """torch.distributed with env:// unless it is initialised already; returns the backend."""
    if dist.is_initialized():
        return str(dist.get_backend())
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl" and local_rank < torch.cuda.device_count():
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend=backend, init_method="env://", timeout=timeout)
    return backend


# One process as the others see it: (familyd rank or -1, local rank, local world size,
# node name, the node's device count).
Claim = Tuple[int, int, int, str, int]


def _check_fit(claims: Sequence[Claim]) -> None:
    """The sentence every rank raises when the gathered claims cannot run; None when they can."""
    for rank, (_, local_rank, local_world, node, devices) in enumerate(claims):
        if local_rank >= devices:
            raise JobError("familyd.torch.init: the job does not fit: node %s has %d devices "
                           "but torch rank %d has LOCAL_RANK %d" % (node, devices, rank,
                                                                     local_rank))
    for rank, (_, local_rank, local_world, node, devices) in enumerate(claims):
        if local_world > devices:
            raise JobError("familyd.torch.init: the job does not fit: node %s has %d devices "
                           "but LOCAL_WORLD_SIZE is %d (torch rank %d)" % (node, devices,
                                                                         local_world, rank))
    owner: Dict[int, int] = {}
    for rank, (familyd_rank, local_rank, _, node, _) in enumerate(claims):
        if familyd_rank in owner:
            raise JobError("familyd.torch.init: torch ranks %d and %d both claim familyd rank %d "
                           "(LOCAL_RANK %d on node %s): two processes on one device"
                           % (owner[familyd_rank], rank, familyd_rank, local_rank, node))
        owner[familyd_rank] = rank


def init(client: Optional[Client] = None, backend: Optional[str] = None,
         timeout: Union[float, datetime.timedelta] = DEFAULT_TIMEOUT,
         env: Optional[Mapping[str, str]] = None) -> Job:
    """Joins the torchrun job and finds where each of its processes runs in familyd's ranks.

    client: the node's daemon (default Client()). backend: for init_process_group (default
    nccl when CUDA is available, else gloo); ignored when torch.distributed is initialised
    already. timeout: seconds or a timedelta, for init_process_group. env: the environment to
    read (default os.environ). Collective: every process of the job must call it. Raises
    JobError with the same sentence on every rank when the job cannot fit familyd's devices
    (having destroyed the process group again if init started it)."""
    env = os.environ if env is None else env
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        if not env.get(name):
            raise JobError("familyd.torch.init: %s is not set (launch the job with torchrun, "
                           "which sets %s)" % (name, ", ".join(ENV)))
    rank, world_size = _env_int("RANK", env), _env_int("WORLD_SIZE", env)
    local_rank, local_world = _env_int("LOCAL_RANK", env), _env_int("LOCAL_WORLD_SIZE", env)
    own_client = client is None
    client = client or Client()
    try:
        node = _local_node(client.topology())
    finally:
        if own_client:
            client.close()
    devices = len(node.devices)
    familyd_rank = int(node.first_rank) + local_rank if local_rank < devices else -1
    started = not dist.is_initialized()
    used = _start(backend, _timeout(timeout), local_rank)
    if dist.get_world_size() != world_size or dist.get_rank() != rank:
        raise JobError("familyd.torch.init: torch.distributed has rank %d of %d but RANK=%d, "
                       "WORLD_SIZE=%d" % (dist.get_rank(), dist.get_world_size(), rank,
                                          world_size))
    claim: Claim = (familyd_rank, local_rank, local_world, str(node.name), devices)
    claims: List[Any] = [None] * world_size
    dist.all_gather_object(claims, claim)
    try:
        _check_fit(claims)
    except JobError:
        if started:           # every rank raises the same: leave torch.distributed as found
            dist.barrier()
            dist.destroy_process_group()
        raise
    return Job(rank=rank, world_size=world_size, local_rank=local_rank,
               local_world_size=local_world, familyd_rank=familyd_rank,
               familyd_ranks=[int(c[0]) for c in claims], node=str(node.name), backend=used,
               nodes=[str(c[3]) for c in claims])


def create_mesh(client: Client, job: Job, device_mesh: MeshSpec,
                expert_mesh: Optional[MeshSpec] = None, **options: Any) -> Any:
    """CreateMesh over the job's processes in torch's order (ranks=job.familyd_ranks: mesh
    position i is torch rank i); options as Client.create_mesh (tp_size=, ep_size=, ...).
    Returns the familyd.v1.Mesh. Every rank may call it: the same mesh has the same id."""
    mesh = client.create_mesh(device_mesh, expert_mesh, ranks=job.familyd_ranks, **options)
    _check_mesh(job, mesh)
    return mesh


def _check_mesh(job: Job, mesh: Any) -> None:
    if [int(r) for r in mesh.ranks] != list(job.familyd_ranks):
        raise JobError("familyd.torch: mesh %s has ranks %s, not this job's familyd ranks in "
                       "torch order %s (create it with familyd.torch.create_mesh)"
                       % (mesh.mesh_id, list(mesh.ranks), job.familyd_ranks))


def _check_views_fit(job: Job, mesh: Any) -> None:
    """JobError unless each view of the mesh has as many positions as the job has ranks."""
    for view in ("device_mesh", "expert_mesh"):
        dims = _view(mesh, view)
        total = 1
        for _, size in dims:
            total *= size
        if dims and total != job.world_size:
            raise JobError("familyd.torch: mesh %s's %s has %d positions but the job has %d "
                           "ranks" % (mesh.mesh_id, view, total, job.world_size))


def _view(mesh: Any, view: str) -> List[Tuple[str, int]]:
    return [(str(d.name), int(d.size)) for d in getattr(mesh, view)]


def axis_groups(dims: Sequence[Tuple[str, int]]) -> List[Tuple[str, List[List[int]]]]:
    """For a row-major view [(name, size), ...]: each axis, in view order, with its groups of
    mesh positions (the positions that differ only on that axis), ordered by first position."""
    total = 1
    for _, size in dims:
        total *= size
    out = []
    stride = total
    for name, size in dims:
        stride //= size
        groups = [[p + i * stride for i in range(size)]
                  for p in range(total) if (p // stride) % size == 0]
        out.append((name, groups))
    return out


def mesh_groups(mesh: Any) -> List[Tuple[str, List[List[int]]]]:
    """Every axis of the mesh with its groups of mesh positions: the device view's axes, then
    the expert view's as `expert.NAME` when NAME is also a device axis with other groups (the
    same groups: listed once)."""
    out = axis_groups(_view(mesh, "device_mesh"))
    known = dict(out)
    for name, groups in axis_groups(_view(mesh, "expert_mesh")):
        if name in known:
            if known[name] == groups:
                continue
            name = EXPERT_PREFIX + name
        out.append((name, groups))
    return out


def process_groups(job: Job, mesh: Any) -> Dict[str, Any]:
    """axis name -> this rank's torch.distributed ProcessGroup, for every axis of the device
    view and of the expert view (see mesh_groups for names). Collective: every rank of the job
    calls it with the same mesh, which must be laid over the job (create_mesh)."""
    _check_mesh(job, mesh)
    _check_views_fit(job, mesh)
    mine: Dict[str, Any] = {}
    for name, groups in mesh_groups(mesh):
        for ranks in groups:
            group = dist.new_group(ranks=ranks)
            if job.rank in ranks:
                mine[name] = group
    return mine


def _size(dims: Sequence[Tuple[str, int]], name: str) -> int:
    return dict(dims).get(name, 1)


def parallel_context(mesh: Any, groups: Mapping[str, Any]) -> ParallelContext:
    """The familyd.torch.modules ParallelContext of the mesh: tp, cp and pp sizes from the
    device view (pp_size from the mesh when it has no pp axis), ep from the expert view when
    there is one; the groups of those axes from process_groups(); the mesh's
    sequence_parallel and loss_parallel."""
    device = _view(mesh, "device_mesh")
    expert = _view(mesh, "expert_mesh")
    pp = _size(device, "pp")
    if pp == 1 and mesh.HasField("pp_size"):
        pp = int(mesh.pp_size)
    ep = _size(expert, "ep") if expert else _size(device, "ep")
    picked: Dict[str, Any] = {}
    for axis in ("tp", "cp", "pp", "ep"):
        group = groups.get(EXPERT_PREFIX + axis) if axis == "ep" else None
        group = group if group is not None else groups.get(axis)
        if group is not None:
            picked[axis] = group
    return ParallelContext(tp_size=_size(device, "tp"), ep_size=ep, cp_size=_size(device, "cp"),
                           pp_size=pp, groups=picked,
                           sequence_parallel=bool(mesh.sequence_parallel),
                           loss_parallel=bool(mesh.loss_parallel))


@dataclass
class JobMesh:
    """A familyd mesh laid over a torchrun job, with this rank's process groups: what
    familyd.torch.build_module takes as mesh=. .job, .mesh (the familyd.v1.Mesh), .groups (axis
    name -> ProcessGroup), .context (the modules' ParallelContext), .device_mesh (the torch
    DeviceMesh of the device view, familyd's axis names as mesh_dim_names) and .expert_mesh
    (the expert view's DeviceMesh, None when the mesh has no expert view)."""

    job: Job
    mesh: Any
    groups: Dict[str, Any]
    context: ParallelContext
    device_mesh: Any = None
    expert_mesh: Any = None

    @property
    def mesh_id(self) -> str:
        return str(self.mesh.mesh_id)


def _is_device_mesh(value: Any) -> bool:
    from torch.distributed.device_mesh import DeviceMesh
    return isinstance(value, DeviceMesh)


def _spec_of(job: Job, device_mesh: Any, what: str) -> List[Tuple[str, int]]:
    """The familyd view [(name, size), ...] that a torch DeviceMesh of the job stands for."""
    names = device_mesh.mesh_dim_names
    if not names:
        raise JobError("familyd.torch.job_mesh: the %s DeviceMesh has no mesh_dim_names: name "
                       "its dimensions as familyd's axes (init_device_mesh(..., "
                       "mesh_dim_names=(\"dp\", \"tp\")))" % what)
    if device_mesh.mesh.numel() != job.world_size:
        raise JobError("familyd.torch.job_mesh: the %s DeviceMesh has %d positions but the job "
                       "has %d ranks (pass the whole mesh, not a sub-mesh)"
                       % (what, device_mesh.mesh.numel(), job.world_size))
    return [(str(n), int(size)) for n, size in zip(names, device_mesh.mesh.shape)]


def check_device_mesh(job: Job, mesh: Any, device_mesh: Any, view: str = "device_mesh") -> None:
    """Raises JobError unless the torch DeviceMesh is the view ("device_mesh" or "expert_mesh")
    of the familyd mesh as familyd lays it over the job: the same axis names in the same order,
    the same sizes, and torch ranks 0..N-1 in row-major order (mesh position i is torch rank i)."""
    _check_mesh(job, mesh)
    want = _view(mesh, view)
    what = "expert" if view == "expert_mesh" else "device"
    got = _spec_of(job, device_mesh, what)
    if [n for n, _ in got] != [n for n, _ in want]:
        raise JobError("familyd.torch: the %s DeviceMesh's dimensions %s are not mesh %s's "
                       "axes %s" % (what, [n for n, _ in got], mesh.mesh_id,
                                    [n for n, _ in want]))
    if got != want:
        raise JobError("familyd.torch: the %s DeviceMesh's sizes %s are not mesh %s's %s"
                       % (what, dict(got), mesh.mesh_id, dict(want)))
    layout = torch.arange(job.world_size).reshape([size for _, size in want])
    ranks = device_mesh.mesh.to("cpu")
    if not torch.equal(ranks, layout):
        raise JobError("familyd.torch: the %s DeviceMesh lays torch ranks %s, but familyd lays "
                       "mesh %s over the job's torch ranks in row-major order %s" % (
                           what, ranks.tolist(), mesh.mesh_id, layout.tolist()))


def _groups_of(mesh: Any, meshes: Mapping[str, Any]) -> Dict[str, Any]:
    """axis name -> this rank's ProcessGroup, from each view's DeviceMesh, named as
    mesh_groups() names them (an expert axis with the device axis's groups is listed once)."""
    out: Dict[str, Any] = {}
    device = dict(axis_groups(_view(mesh, "device_mesh")))
    for name, _ in _view(mesh, "device_mesh"):
        out[name] = meshes["device_mesh"].get_group(name)
    for name, groups in axis_groups(_view(mesh, "expert_mesh")):
        if name in device:
            if device[name] == groups:
                continue
            name_key = EXPERT_PREFIX + name
        else:
            name_key = name
        out[name_key] = meshes["expert_mesh"].get_group(name)
    return out


def job_mesh(client: Client, job: Job, device_mesh: Union[MeshSpec, Any],
             expert_mesh: Optional[Union[MeshSpec, Any]] = None, **options: Any) -> JobMesh:
    """The familyd mesh of the job with a torch DeviceMesh per view and this rank's process
    groups: the JobMesh that build_module takes. device_mesh (and expert_mesh) is either a
    familyd mesh spec ({"dp": 2, "tp": 2}), for which familyd creates the mesh and a DeviceMesh
    laid as familyd lays it, or a DeviceMesh the caller made (init_device_mesh("cpu", (2, 2),
    mesh_dim_names=("dp", "tp"))), for which familyd creates the matching mesh and checks that
    the DeviceMesh lays the job's ranks as familyd does (JobError otherwise). Collective: every
    rank of the job calls it with the same arguments."""
    given: Dict[str, Any] = {}
    if _is_device_mesh(device_mesh):
        given["device_mesh"] = device_mesh
        device_mesh = _spec_of(job, device_mesh, "device")
    if expert_mesh is not None and _is_device_mesh(expert_mesh):
        given["expert_mesh"] = expert_mesh
        expert_mesh = _spec_of(job, expert_mesh, "expert")
    mesh = create_mesh(client, job, device_mesh, expert_mesh, **options)
    _check_views_fit(job, mesh)
    meshes: Dict[str, Any] = {}
    for view in ("device_mesh", "expert_mesh"):
        if not _view(mesh, view):
            continue
        if view in given:
            check_device_mesh(job, mesh, given[view], view)
            meshes[view] = given[view]
        else:
            meshes[view] = make_device_mesh(job, mesh, view)
    groups = _groups_of(mesh, meshes)
    return JobMesh(job=job, mesh=mesh, groups=groups, context=parallel_context(mesh, groups),
                   device_mesh=meshes.get("device_mesh"), expert_mesh=meshes.get("expert_mesh"))


def make_device_mesh(job: Job, mesh: Any, view: str = "device_mesh",
                     device_type: Optional[str] = None) -> Any:
    """A torch DeviceMesh of the view ("device_mesh" or "expert_mesh") over torch ranks, laid
    as familyd lays the mesh (row-major: position i is torch rank i), with the axis names as
    mesh_dim_names. device_type: "cuda" when the job runs nccl, else "cpu". Collective, like
    process_groups."""
    from torch.distributed.device_mesh import DeviceMesh
    _check_mesh(job, mesh)
    dims = _view(mesh, view)
    layout = torch.arange(job.world_size).reshape([size for _, size in dims])
    kind = device_type or ("cuda" if job.backend == "nccl" else "cpu")
    return DeviceMesh(kind, layout, mesh_dim_names=tuple(name for name, _ in dims))


# familyd 0.1's name of make_device_mesh (api names stay).
device_mesh = make_device_mesh
