"""build_module(): a family member built through familyd as a sharded torch nn.Module.

DESIGN. Two kinds of build, by what the process will do with the module:

- trainable=True (the default): a training handout. Each process asks for a build of its own
  (BuildRequest.private_build and writable) of its own rank only, which the daemon fills and
  hands to that process alone (no other process, not even of the same uid, can map it). The
  process maps it MAP_SHARED read-write: its parameters are the daemon's filled pages, so the
  first optimizer step writes into resident memory instead of copying every page as a
  copy-on-write mapping would, and the node holds each rank's parameters once.
- trainable=False: a frozen or evaluation module. Every process of the node asks for the same
  request (family, config, mesh, the module's fqn, its derived seed, and ALL of the node's
  ranks of the mesh), so the daemon answers them with one shared build, filled once (dp
  replicas share one segment); each process maps it copy-on-write and its parameters do not
  require gradients.

Each process then:

1. learns the member's `accepts` (GetFamily) and imports its constructor (registered classes
   first, familyd.torch.register), binding arguments as the original framework did: the
   member must accept `config` (direct) or `module` (replacement); the request's arguments
   must be in the constructor's signature; the runtime names (config, module, module_fqn,
   context) are passed when `accepts` lists them and the signature has them;
2. constructs it on the `meta` device (device="meta" when the signature takes `device`), so
   nothing is allocated or initialised;
3. maps its own rank's shard (shared read-write for a handout, copy-on-write for a frozen
   module) and binds every parameter to its slice, zero-copy, after checking the local shape and dtype
   against the layout. On a JobMesh (job_mesh()) each parameter is a DTensor over the mesh view's torch
   DeviceMesh (JobMesh.device_mesh, or .expert_mesh for a parameter laid on the expert view),
   whose local tensor is that slice and whose placements are the layout's: Shard(d) on the
   mesh dimensions that split it, Replicate() on the others. A layout DTensor cannot express
   (its local shape and offset would differ from familyd's slice) is refused with a sentence.
   A JobMesh made by hand without DeviceMeshes (a rank simulated in one process) binds plain
   local tensors, as mesh=None does.
   reset_parameters is never called: familyd's fill is the initialisation (it is
   layout-invariant: the same values on every mesh).

The module carries its provenance (build_info). Each module's seed is derive_seed(seed, fqn):
two identical blocks get different weights and different builds.
"""

import copy
import dataclasses
import hashlib
import importlib
import inspect
import os
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

import torch
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard

from familyd import shard as _shard
from familyd.client import Build, Client, FamilydError
from familyd.torch import module_init as _module_init
from familyd.torch.distributed import JobMesh
from familyd.torch.modules._common import ParallelContext

_ATTR = "_familyd_build_info"
# The activation layout the module applies (a proto3 JSON dict of familyd.v1.ActivationLayout):
# build_module records its build's; familyd.torch.set_activation_layout changes it.
ACTIVATION_ATTR = "_familyd_activation_layout"
_RUNTIME = ("config", "module", "module_fqn", "context")
_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_DTYPE_ALIASES = {"": "float32", "f32": "float32", "fp32": "float32", "bf16": "bfloat16",
                  "f16": "float16", "fp16": "float16"}
_registered: Dict[str, Any] = {}


class ModuleBuildError(RuntimeError):
    """build_module could not make the module (the message names it and, where one is at
    fault, the parameter). The build, if one was made, is released."""


@dataclass
class BuildInfo:
    """A module's familyd provenance: what build_info() returns.

    request: the familyd.v1.BuildRequest sent; member: the familyd.v1.ResolvedFamily (variant,
    constructor, arguments, axis_sizes); config: the config the module was constructed from
    (None for a replacement); origin: "direct" or "replacement"; layout: the familyd.v1.Layout
    (logical shapes, placements, dtypes); build_id; fqn; seed: the derived seed; mesh_id;
    rank: the familyd rank whose shard the parameters view; build: the familyd.client.Build
    (its mappings back the parameters); trainable: a training handout (this process's own
    writable build) or a frozen module's shared build."""

    request: Any
    member: Any
    config: Any
    origin: str
    layout: Any
    build_id: str
    fqn: str
    seed: int
    mesh_id: str
    rank: int
    build: Build
    local_shapes: Dict[str, Tuple[int, ...]]
    trainable: bool = True


def register(path: str, cls: Any) -> None:
    """Makes `path` (a registry constructor's dotted path) construct with `cls` instead of
    importing it. cls=None removes the registration."""
    if not isinstance(path, str) or not path:
        raise ValueError("familyd.torch.register: path must be a non-empty dotted path")
    if cls is None:
        _registered.pop(path, None)
        return
    if not callable(cls):
        raise TypeError("familyd.torch.register: %r is not callable" % (cls,))
    _registered[path] = cls


def build_info(module: Any) -> Optional[BuildInfo]:
    """The BuildInfo of a module that build_module made; None for any other module."""
    info = getattr(module, _ATTR, None)
    return info if isinstance(info, BuildInfo) else None


def derive_seed(seed: int, fqn: str) -> int:
    """The seed of the module at `fqn` in a job seeded `seed`: the first 8 bytes of
    BLAKE2b(decimal seed, NUL, fqn), little-endian, an unsigned 64-bit integer."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2 ** 64:
        raise ValueError("familyd.torch: seed must be an integer in [0, 2**64), not %r" % (seed,))
    digest = hashlib.blake2b(b"%d\0%s" % (seed, fqn.encode()), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def _python_value(v: Any) -> Any:
    """A familyd.v1.Value as the Python value a Build's arguments take."""
    kind = v.WhichOneof("kind")
    if kind == "list_value":
        return [_python_value(x) for x in v.list_value.values]
    return getattr(v, kind) if kind else None


def _target(target: Any, arguments: Dict[str, Any], config: Any,
            where: str) -> Tuple[str, Dict[str, Any], Any]:
    """(family, arguments, config) of build_module's target: a family's name or baseline; a
    preserved request (a familyd.v1.BuildRequest, or the BuildInfo build_info() returns: its
    family and arguments, which keywords may not be added to); or a class, the family's public
    class, by its dotted path (the registry's `baseline`). A
    "config" among the arguments is the config ("config was supplied twice" with config=)."""
    if isinstance(target, BuildInfo):
        target = target.request
    descriptor = getattr(target, "DESCRIPTOR", None)
    if descriptor is not None and descriptor.full_name == "familyd.v1.BuildRequest":
        if arguments:
            raise ValueError("%s: request arguments cannot be combined with additional keywords"
                             % where)
        family = target.family
        arguments = {k: _python_value(v) for k, v in target.arguments.items()}
    elif isinstance(target, str):
        family = target
    elif isinstance(target, type):
        family = "%s.%s" % (target.__module__, target.__qualname__)
    else:
        raise TypeError("build_module: the target must be a family name, a preserved request "
                        "or a class, not %r" % (target,))
    if "config" in arguments:
        arguments = dict(arguments)
        if config is not None:
            raise ValueError("%s: config was supplied twice" % where)
        config = arguments.pop("config")
    return family, arguments, config


def _where(fqn: str, family: str) -> str:
    return "familyd.torch.build_module(%r, fqn=%r)" % (family, fqn)


def _config_values(config: Any) -> Dict[str, Any]:
    """The config's fields that Build can carry (int, float, str, bool and lists of them)."""
    if isinstance(config, Mapping):
        items: Iterable[Tuple[Any, Any]] = config.items()
    elif hasattr(config, "to_dict"):
        items = config.to_dict().items()
    else:
        items = vars(config).items()

    def sendable(v: Any) -> bool:
        if isinstance(v, (list, tuple)):
            return all(sendable(x) for x in v)
        return isinstance(v, (bool, int, float, str))

    return {str(k): v for k, v in items if sendable(v)}


def _source_module(module: Any, fqn: str) -> Dict[str, Any]:
    """The SourceModule of a replacement: the existing module's parameters, logical shapes
    (a familyd-built module's from its layout)."""
    info = build_info(module)
    logical = {p.name: list(p.shape) for p in info.layout.parameters} if info else {}
    params = [{"name": name, "shape": logical.get(name, list(p.shape))}
              for name, p in module.named_parameters()]
    return {"fqn": fqn, "parameters": params}


def _deposit_module(client: Client, module: Any, where: str) -> str:
    """Deposits module's parameters (whole: a DTensor's full_tensor(), a collective) as one
    safetensors file in a memfd, each under its name in the module: the deposit's token."""
    try:
        from safetensors.torch import save as save_safetensors
    except ImportError:
        raise ModuleBuildError("%s: copy_weights needs the safetensors package (pip install "
                               "safetensors)" % where) from None
    tensors = {}
    for name, p in module.named_parameters():
        t = p.full_tensor() if isinstance(p, DTensor) else p
        tensors[name] = t.detach().cpu().contiguous().clone()
    data = save_safetensors(tensors)
    fd = os.memfd_create("familyd-copy-weights", os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        return _shard.deposit(client.default_shard_socket(),
                              [("copy-weights.safetensors", fd)], timeout=client.timeout,
                              protos=client.protos)
    finally:
        os.close(fd)


def _taken_config(module: Any) -> Any:
    """The config of an existing module, as a replacement takes it: its .config, else the
    config familyd built it from; None when it has neither."""
    config = getattr(module, "config", None)
    if config is None:
        info = build_info(module)
        config = info.config if info is not None else None
    return config


def _constructor(path: str, where: str) -> Any:
    if path in _registered:
        return _registered[path]
    module_path, _, name = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module_path), name)
    except (ImportError, AttributeError, ValueError) as e:
        raise ModuleBuildError("%s: cannot import the member's constructor %r: %s (register a "
                               "class with familyd.torch.register(%r, cls))"
                               % (where, path, e, path)) from None


def _accepts(client: Client, member: Any, where: str) -> Tuple[List[str], List[str]]:
    """The member's `accepts`, and its parameters whose init is `module`."""
    family = client.get_family(member.family)
    for v in family.variants:
        if v.name == member.variant:
            if v.constructor != member.constructor:
                break
            params = v.parameters if len(v.parameters) else family.parameters
            return list(v.accepts), [p.name for p in params if p.init == "module"]
    raise ModuleBuildError("%s: member %r changed in the registry while building (reloaded?); "
                           "build again" % (where, member.variant))


def bind_arguments(member: Any, constructor: Any, accepts: Iterable[str], arguments: Mapping[str, Any],
                   runtime: Mapping[str, Any], replacement: bool) -> Dict[str, Any]:
    """The keyword arguments of the constructor, as the original framework bound them (texts of
    docs/semantics.md, Build step 5): TypeError for a member that does not accept its origin
    or the request's arguments, or whose signature the arguments do not fit."""
    signature = inspect.signature(constructor)
    params = signature.parameters
    required = "module" if replacement else "config"
    if required not in params:
        raise TypeError("member %r must explicitly accept %s" % (member.variant, required))
    kwargs = dict(arguments)
    unknown = sorted(set(kwargs) - set(params))
    if unknown:
        raise TypeError("member %r does not accept %s" % (member.variant, unknown))
    accepted = set(accepts)
    kwargs.update({name: value for name, value in runtime.items()
                   if name in params and name in accepted})
    if "device" in params:
        kwargs["device"] = torch.device("meta")
    signature.bind(**kwargs)
    return kwargs


def _construct(member: Any, constructor: Any, kwargs: Dict[str, Any], where: str) -> Any:
    try:
        result = constructor(**kwargs)
    except NotImplementedError as e:
        raise NotImplementedError("%s: %s" % (where, e)) from None
    if not isinstance(result, torch.nn.Module):
        raise TypeError("%s: a family constructor must return nn.Module (member %r returned %s)"
                        % (where, member.variant, type(result).__name__))
    return result


def _rank_tensors(build: Build, rank: int) -> Dict[str, Any]:
    """name -> this rank's tensor over its private mapping (empty slices: empty tensors)."""
    if rank in build.ranks:
        return build.ranks[rank].torch()
    for s in build.message.shards:     # a rank whose slices are all empty has no mapping
        if s.rank == rank:
            return {sl.parameter: torch.empty(tuple(sl.local_shape),
                                              dtype=_TORCH_DTYPES[build.dtype_of(sl.parameter)])
                    for sl in s.slices}
    raise ModuleBuildError("build %s has no shard of rank %d" % (build.id, rank))


def _slice_offsets(build: Build, rank: int) -> Dict[str, Tuple[int, ...]]:
    """name -> the global offset of the rank's slice of each parameter."""
    for s in build.message.shards:
        if s.rank == rank:
            return {sl.parameter: tuple(int(x) for x in sl.global_offset) for sl in s.slices}
    raise ModuleBuildError("build %s has no shard of rank %d" % (build.id, rank))


def dtensor_placements(parameter: Any, mesh_dim_names: Iterable[str]) -> List[Placement]:
    """The DTensor placements of a familyd.v1.ParameterLayout on a DeviceMesh with these
    dimension names: Shard(d) where the layout shards over the dimension, else Replicate(). A
    placement over an axis the mesh view lacks splits nothing (the axis has size 1 there) and
    has no DTensor dimension."""
    names = list(mesh_dim_names)
    shards = {x.axis: int(x.dim) for x in parameter.placements if x.kind == "shard"}
    return [Shard(shards[n]) if n in shards else Replicate() for n in names]


def _as_dtensor(tensor: torch.Tensor, parameter: Any, mesh: JobMesh,
                offset: Tuple[int, ...], where: str, requires_grad: bool) -> torch.Tensor:
    """The rank's slice of a parameter as a DTensor parameter over its mesh view, zero-copy."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    device_mesh = mesh.expert_mesh if parameter.mesh_view == "expert" else mesh.device_mesh
    if device_mesh is None:
        raise ModuleBuildError("%s: parameter %r is laid out on the %s view, which the JobMesh "
                               "has no DeviceMesh of" % (where, parameter.name,
                                                         parameter.mesh_view))
    placements = dtensor_placements(parameter, device_mesh.mesh_dim_names)
    shape = tuple(int(d) for d in parameter.shape)
    local_shape, global_offset = compute_local_shape_and_global_offset(
        shape, device_mesh, placements)
    if tuple(local_shape) != tuple(tensor.shape) or \
            (tensor.numel() and tuple(global_offset) != tuple(offset)):
        raise ModuleBuildError(
            "%s: parameter %r: DTensor cannot express its layout: familyd's shard of this rank "
            "is %s at %s of %s, a DTensor with placements %s would hold %s at %s"
            % (where, parameter.name, list(tensor.shape), list(offset), list(shape),
               placements, list(local_shape), list(global_offset)))
    stride = torch.empty(shape, device="meta").stride()
    return _dtensor_parameter(tensor, device_mesh, placements, shape, stride, requires_grad)


def _dtensor_parameter(local: torch.Tensor, device_mesh: Any, placements: List[Placement],
                       shape: Tuple[int, ...], stride: Tuple[int, ...],
                       requires_grad: bool) -> torch.Tensor:
    """nn.Parameter(DTensor.from_local(local, device_mesh, placements, run_check=False,
    shape=shape, stride=stride), requires_grad), made without the two steps that import
    torch._dynamo: DTensor.__init__ is wrapped in torch._disable_dynamo, whose first call
    imports it (about 0.7 s of CPU in every process, more than the rest of a build on the
    client side), and both from_local (its autograd Function) and nn.Parameter (detach())
    construct a DTensor that way. The result is the same object: a leaf DTensor over `local`
    (no copy) with the spec from_local gives it, marked as a Parameter the way nn.Parameter
    marks a tensor subclass (`_is_param`). A torch without these internals takes the public
    path."""
    try:
        from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
        spec = DTensorSpec(device_mesh, tuple(placements),
                           tensor_meta=TensorMeta(torch.Size(shape), tuple(stride), local.dtype))
        param = DTensor.__new__(DTensor, local.view_as(local), spec, requires_grad=False)
    except (ImportError, TypeError, AttributeError):
        return torch.nn.Parameter(
            DTensor.from_local(local, device_mesh, placements, run_check=False,
                               shape=torch.Size(shape), stride=stride),
            requires_grad=requires_grad)
    param.requires_grad_(requires_grad)
    param._is_param = True
    return param


def _bind_parameters(module: torch.nn.Module, tensors: Mapping[str, Any], build: Build,
                     overridden: Iterable[str], where: str,
                     mesh: Optional[JobMesh] = None, rank: int = 0,
                     trainable: bool = True) -> Dict[str, Tuple[int, ...]]:
    """Replaces every parameter of the module by its shard tensor (a DTensor on a JobMesh);
    checks names, local shapes and dtypes first (all of them, before changing anything)."""
    own = dict(module.named_parameters())
    extra = sorted(set(own) - set(tensors))
    if extra:
        raise ModuleBuildError("%s: parameter %r of the constructed module is not in the build's "
                               "layout (%s)" % (where, extra[0], ", ".join(sorted(tensors))))
    overridden = set(overridden)
    for name, tensor in tensors.items():
        if name not in own:
            raise ModuleBuildError("%s: the build's parameter %r is not a parameter of the "
                                   "constructed %s" % (where, name, type(module).__name__))
        p = own[name]
        if tuple(p.shape) != tuple(tensor.shape):
            raise ModuleBuildError("%s: parameter %r: the module's shape %s is not the shard's "
                                   "local shape %s" % (where, name, list(p.shape),
                                                       list(tensor.shape)))
        if p.dtype != tensor.dtype and name not in overridden:
            raise ModuleBuildError("%s: parameter %r: the module's dtype %s is not the layout's "
                                   "%s" % (where, name, p.dtype, build.dtype_of(name)))
    grads = {name: own[name].requires_grad and trainable for name in tensors}
    if mesh is not None and mesh.device_mesh is not None:
        layouts = {p.name: p for p in build.message.info.layout.parameters}
        offsets = _slice_offsets(build, rank)
        bound = {name: _as_dtensor(t, layouts[name], mesh, offsets.get(name, ()), where,
                                   grads[name])
                 for name, t in tensors.items()}
    else:
        bound = {name: torch.nn.Parameter(t, requires_grad=grads[name])
                 for name, t in tensors.items()}
    for name, param in bound.items():
        owner_name, _, leaf = name.rpartition(".")
        owner = module.get_submodule(owner_name) if owner_name else module
        setattr(owner, leaf, param)
    return {name: tuple(t.shape) for name, t in tensors.items()}


def _placement(mesh: Optional[JobMesh], fqn: str) -> Tuple[str, int, List[int], Any]:
    """(mesh_id, this process's familyd rank, the node's ranks to materialise, context)."""
    if mesh is None:
        return "", 0, [0], ParallelContext()
    if not isinstance(mesh, JobMesh):
        raise TypeError("familyd.torch.build_module(fqn=%r): mesh must be a familyd.torch.JobMesh "
                        "(familyd.torch.job_mesh), not %s" % (fqn, type(mesh).__name__))
    return mesh.mesh_id, mesh.job.familyd_rank, mesh.job.local_familyd_ranks(), mesh.context


def build_module(client: Client, family: Any, config: Any = None,
                 mesh: Optional[JobMesh] = None, module: Optional[torch.nn.Module] = None,
                 fqn: str = "", seed: int = 0, dtype: str = "float32",
                 parameter_dtypes: Optional[Mapping[str, str]] = None,
                 copy_weights: bool = False, trainable: bool = True,
                 checkpoint: Any = None, checkpoint_prefix: str = "",
                 checkpoint_names: str = "", **arguments: Any) -> torch.nn.Module:
    """The member of `family` for this job, as an nn.Module over this rank's shards.

    family: the family's name or baseline; a preserved request (build_info(m).request, or the
    BuildInfo itself: its family and arguments again, with no further keywords); or the
    family's public class (its dotted path is the registry's baseline). A "config" among
    a preserved request's arguments is taken as the config ("config was supplied twice" when
    config= is given too). BuildInfo.config is a deep copy of the config, taken at the build.

    config: the model config (a dict, or an object with attributes: a transformers config);
    module: instead of config, an existing module to replace (config taken from it); its
    replacement's weights are the registry's init, or with copy_weights=True exactly the
    module's values, resharded: this process writes the module's parameters (whole) into a
    memfd as safetensors and deposits it, and the member is built from it by parameter name
    (checkpoint_names "parameters"). mesh: a JobMesh (job_mesh()); None builds the whole module
    in this process (rank 0, every axis 1). fqn: the module's path in the model (its seed, its
    build, and the names in errors). seed: the job's seed (each module gets derive_seed(seed,
    fqn)). dtype, parameter_dtypes: as Client.build. trainable: True (default) makes a training
    handout, this process's own writable build of its own rank, mapped shared read-write (no
    copy-on-write on the first optimizer step, never mapped by another process); False a frozen
    module: one build shared by the node's processes, mapped copy-on-write, its parameters with
    requires_grad=False. checkpoint: the weights instead of the registry's init, from a
    safetensors checkpoint: the path of a .safetensors file or of a directory of them (with its
    model.safetensors.index.json), deposited by this client once and its token reused
    (Client.checkpoint_token), or a deposit's token; checkpoint_prefix: the module's place in
    the checkpoint, the registry's `{prefix}` ("model.layers.0.mlp"); checkpoint_names:
    "registry" (default) or "parameters" (tensors named "{prefix}.<parameter>", as
    Client.build). The daemon reads the files once per node into the shards, resharded to the
    mesh. arguments: the family's
    selectors and arguments. Raises FamilydError
    for a refused Build, ModuleBuildError / TypeError / NotImplementedError (a member this
    package does not implement) otherwise; on any failure this process's reference to the
    build is released."""
    family, arguments, config = _target(family, arguments, config,
                                        _where(fqn, family if isinstance(family, str)
                                               else "the target"))
    where = _where(fqn, family)
    if (config is None) == (module is None):
        raise ValueError("%s: provide exactly one of config or module" % where)
    if copy_weights:
        if module is None or checkpoint is not None:
            raise ValueError("%s: copy_weights needs module= (the source of a replacement) and "
                             "no checkpoint" % where)
        # The source's values, resharded by the daemon: its parameters as a checkpoint of
        # their own names, in a memfd this process fills and deposits.
        checkpoint = _deposit_module(client, module, where)
        checkpoint_prefix, checkpoint_names = "", "parameters"
    taken = _taken_config(module) if module is not None else None
    if (checkpoint_prefix or checkpoint_names) and checkpoint is None:
        raise ValueError("%s: checkpoint_prefix or checkpoint_names without a checkpoint"
                         % where)
    mesh_id, rank, ranks, context = _placement(mesh, fqn)
    derived = derive_seed(seed, fqn)
    # One deposit per client and checkpoint: the request and the Build name the same token.
    token = client.checkpoint_token(checkpoint) if checkpoint is not None else None
    request_kw: Dict[str, Any] = dict(
        config=_config_values(config) if config is not None else None,
        mesh_id=mesh_id or None, dtype=dtype, seed=derived,
        ranks=[rank] if trainable else ranks, arguments=arguments,
        module=_source_module(module, fqn) if module is not None else None,
        module_fqn=fqn or None, parameter_dtypes=parameter_dtypes,
        source_config=_config_values(taken) if taken is not None else None,
        private_build=trainable, checkpoint=token,
        checkpoint_prefix=checkpoint_prefix if token is not None else "",
        checkpoint_names=checkpoint_names if token is not None else "")
    request = client.build_request(family, writable=trainable, **request_kw)
    made_config = config if module is None else taken
    member_of = _MemberOf(client, made_config, module, fqn, context, where, dtype, derived)
    try:
        build = _first_build(client, family, request_kw, trainable, member_of, where)
    except FamilydError as e:
        # The cached deposit of a path was dropped by the daemon (120 s unused): once more.
        if e.reason != "CHECKPOINT_TOKEN" or token is None or token == checkpoint:
            raise
        request_kw["checkpoint"] = client.checkpoint_token(checkpoint, fresh=True)
        request = client.build_request(family, writable=trainable, **request_kw)
        build = _first_build(client, family, request_kw, trainable, member_of, where)
    try:
        result, shapes = _make(member_of, build, rank, parameter_dtypes or {}, mesh, trainable)
    except BaseException:
        build.close()
        try:
            build.release()
        except Exception:
            pass
        raise
    info = build.message.info
    setattr(result, _ATTR, BuildInfo(
        request=request, member=info.resolved,
        config=copy.deepcopy(config if module is None else taken),
        origin=info.origin or ("replacement" if module is not None else "direct"),
        layout=info.layout, build_id=build.id, fqn=fqn, seed=derived, mesh_id=mesh_id, rank=rank,
        build=build, local_shapes=shapes, trainable=trainable))
    if info.layout.HasField("activations"):
        # The module applies the layout it was constructed with: validate_model sends it, so a
        # later change is refused (ACTIVATION_LAYOUT_CONFLICT) without the trainer saying so.
        from google.protobuf import json_format
        setattr(result, ACTIVATION_ATTR, json_format.MessageToDict(info.layout.activations))
    return result


@dataclass
class _Member:
    """A built member's constructor and its bound keyword arguments."""
    member: Any
    constructor: Any
    kwargs: Dict[str, Any]
    where: str
    module_init: List[str]   # its parameters of init: module


@dataclass
class _MemberOf:
    """What build_module constructs a member from, for any of its builds."""
    client: Client
    config: Any
    module: Any
    fqn: str
    context: Any
    where: str
    dtype: str
    seed: int

    def __call__(self, build: Build) -> _Member:
        member = build.message.info.resolved
        where = "%s: member %r (%s)" % (self.where, member.variant, member.constructor)
        constructor = _constructor(member.constructor, where)
        accepts, module_init = _accepts(self.client, member, where)
        arguments = {k: self.client.protos.py(v) for k, v in member.arguments.items()}
        runtime = {"config": self.config, "module": self.module, "module_fqn": self.fqn,
                   "context": _with_flags(self.context, member)}
        try:
            kwargs = bind_arguments(member, constructor, accepts, arguments, runtime,
                                    replacement=self.module is not None)
        except TypeError as e:
            raise TypeError("%s: %s" % (where, e)) from None
        if "dtype" in inspect.signature(constructor).parameters:
            kwargs["dtype"] = _TORCH_DTYPES[_DTYPE_ALIASES.get(self.dtype, self.dtype)]
        return _Member(member, constructor, kwargs, where, module_init)

    def values(self, build: Build) -> Tuple[List[str], Dict[str, torch.Tensor]]:
        """The names of build's init: module parameters and the module's full values."""
        m = self(build)
        if not m.module_init:
            return [], {}
        return m.module_init, _module_init.module_values(m.constructor, m.kwargs, self.seed)


def _first_build(client: Client, family: str, request_kw: Dict[str, Any], trainable: bool,
                 member_of: _MemberOf, where: str) -> Build:
    """The Build of build_module: a training handout, or the node's shared build; one of a
    member with init: module parameters is filled by its node's filler first (module_init)."""
    if trainable:
        return client.build(family, mode="shared", **request_kw)
    try:
        return client.build(family, mode="private", **request_kw)
    except FamilydError as e:
        if e.reason != "MODULE_INIT_PENDING":
            raise
    if not _module_init.is_filler():
        return _module_init.wait_published(client, family, request_kw, where)
    filled = _module_init.fill_and_publish(client, family, request_kw, member_of.values, where)
    try:
        return _module_init.wait_published(client, family, request_kw, where)
    finally:
        filled.release()


def _make(member_of: _MemberOf, build: Build, rank: int, parameter_dtypes: Mapping[str, str],
          mesh: Optional[JobMesh],
          trainable: bool) -> Tuple[torch.nn.Module, Dict[str, Tuple[int, ...]]]:
    m = member_of(build)
    result = _construct(m.member, m.constructor, m.kwargs, m.where)
    if trainable and m.module_init:
        # This process's own handout: the module's values go straight into its rank.
        values = _module_init.module_values(m.constructor, m.kwargs, member_of.seed)
        _module_init.write_rank(build, rank, m.module_init, values, m.where)
    tensors = _rank_tensors(build, rank)
    shapes = _bind_parameters(result, tensors, build, parameter_dtypes, m.where, mesh, rank,
                              trainable)
    _materialize_buffers(result, m.member, m.constructor, m.kwargs, m.where)
    # Its values are final (the registry's init, a checkpoint, or the module's own, once per
    # node): a trainer's reset after materialisation must leave them (docs/torch.md).
    result._hp_reset_after_materialization = False
    return result, shapes


def _with_flags(context: Any, member: Any) -> Any:
    """The member's context with the job's sequence_parallel and loss_parallel as Resolve
    answered them (the mesh's: its word wins over anything the trainer's context says)."""
    sp, lp = bool(member.sequence_parallel), bool(member.loss_parallel)
    if isinstance(context, ParallelContext):
        return dataclasses.replace(context, sequence_parallel=sp, loss_parallel=lp)
    if isinstance(context, dict):
        return dict(context, sequence_parallel=sp, loss_parallel=lp)
    return context


def _materialize_buffers(result: torch.nn.Module, member: Any, constructor: Any,
                         kwargs: Dict[str, Any], where: str) -> None:
    """Buffers the member made on `meta` (it was constructed there) get their values: the
    member is constructed once more on the parameters' device, and its buffers are taken; the
    rest of that twin is dropped. Members without buffers on meta cost nothing."""
    missing = [name for name, b in result.named_buffers() if b.is_meta]
    if not missing:
        return
    params = [p for p in result.parameters() if not p.is_meta]
    device = params[0].device if params else torch.device("cpu")
    twin_kwargs = dict(kwargs)
    if "device" in twin_kwargs:
        twin_kwargs["device"] = device
    with torch.device(device):
        twin = _construct(member, constructor, twin_kwargs, where)
    made = dict(twin.named_buffers())
    for name in missing:
        owner_name, _, leaf = name.rpartition(".")
        owner = result.get_submodule(owner_name) if owner_name else result
        value = made.get(name)
        if value is None or value.is_meta:
            raise ModuleBuildError("%s: buffer %r stays on meta: the member makes it only on "
                                   "the device it is given" % (where, name))
        owner._buffers[leaf] = value.to(device)


def release(model: torch.nn.Module, force: bool = False) -> List[str]:
    """Releases this process's reference to the build of every module of `model` that
    build_module made (each once); returns their build ids. The parameters stay valid."""
    done: List[str] = []
    for m in model.modules():
        info = build_info(m)
        if info is not None and info.build_id not in done:
            info.build.release(force=force)
            done.append(info.build_id)
    return done


__all__ = ["BuildInfo", "ModuleBuildError", "bind_arguments", "build_info", "build_module",
           "derive_seed", "dtensor_placements", "register", "release"]
