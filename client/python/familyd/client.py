"""familyd.Client: the familyd.v1 gRPC API over the daemon's Unix socket, and Build, whose
materialised shards are numpy arrays (and torch tensors) viewing the daemon's shared memory."""

import mmap
import os
import re
import warnings
from typing import (Any, Dict, Iterable, Iterator, List, Mapping, NamedTuple, Optional, Sequence,
                    Tuple, Union)

import grpc
from google.protobuf.message import Message

from . import cuda as _cuda
from . import shard as _shard
from ._protos import Protos, default_protos

# A family's arguments or config values: int, float, str, bool, or lists of them.
Values = Mapping[str, Any]
# A boundary of validate(): see Client.validate.
BoundaryLike = Union[Mapping[str, Any], Tuple[Any, ...], List[Any], "Build", Message]
# A mesh's dimensions: {"dp": 2, "tp": 4} or [("dp", 2), ("tp", 4)], in row-major order.
MeshSpec = Union[Mapping[str, int], Iterable[Tuple[str, int]]]

DEFAULT_SOCKET = "/run/familyd/familyd.sock"

# A checkpoint given to build(): a deposit's token (ShardFdReply.checkpoint_token: 32 hex
# digits) or the path of a safetensors file or directory.
CheckpointLike = Union[str, "os.PathLike[str]"]
_TOKEN = re.compile(r"[0-9a-f]{32}")

# Layout dtype -> numpy dtype name. bfloat16 has no numpy dtype: its bits are uint16.
_NUMPY_DTYPES = {"float32": "float32", "float16": "float16", "bfloat16": "uint16"}
_DTYPE_SIZES = {"float32": 4, "float16": 2, "bfloat16": 2}


class FamilydError(Exception):
    """A call that ended with a gRPC status other than OK.

    .code: the grpc.StatusCode; .code_name ("NOT_FOUND"); .message: the status message;
    .reason and .metadata: from the google.rpc.ErrorInfo of the status details (None / {}).
    """

    def __init__(self, code: Any, message: str, reason: Optional[str] = None,
                 metadata: Optional[Mapping[str, str]] = None) -> None:
        self.code = code
        self.code_name = code.name if hasattr(code, "name") else str(code)
        self.message = message
        self.reason = reason
        self.metadata = dict(metadata or {})
        text = "%s: %s" % (self.code_name, message)
        if reason:
            text += " (%s)" % reason
        super().__init__(text)


class RankTensors(Dict[str, Any]):
    """One rank's parameters: name -> numpy array viewing the shard's memory (no copy).

    bfloat16 parameters are numpy uint16 arrays of the raw bits; .torch() gives real
    torch.bfloat16 tensors. .mmap is the mapping, .size its length, .slices the RankShard's
    ShardSlice messages, .dtypes name -> layout dtype, .mode the mapping mode ("read-only":
    the arrays are not writeable; "private": writes stay in this process; "shared": writes
    reach every process), .writable whether the arrays may be written.
    """

    def __init__(self, rank: int, mm: mmap.mmap, size: int, slices: List[Message],
                 dtypes: Dict[str, str], device_kind: str, device: int, mode: str) -> None:
        super().__init__()
        self.rank = rank
        self.mmap = mm
        self.size = size
        self.slices = slices
        self.dtypes = dtypes
        self.device_kind = device_kind
        self.device = device
        self.mode = mode
        self.writable = mode != "read-only"

    def torch(self) -> Dict[str, Any]:
        """name -> torch tensor over the same memory (torch.frombuffer; no copy). bfloat16 is
        torch.bfloat16. Only for "private" and "shared" mappings: torch 1.13 cannot mark a
        tensor read-only, and an in-place op on one over a read-only mapping kills the process
        (SIGSEGV), so a read-only rank raises ValueError. Raises ImportError without torch."""
        if self.mode == "read-only":
            raise ValueError("rank %d is mapped read-only, and torch cannot mark a tensor "
                             "read-only (an in-place op would crash the process): open the "
                             "build with mode='private' (copy-on-write, writes stay in this "
                             "process) or mode='shared' (a writable build)" % self.rank)
        import torch

        tdtypes = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
        out = {}
        with warnings.catch_warnings():
            # A read-only mapping: torch warns that its tensors must not be written.
            warnings.simplefilter("ignore", UserWarning)
            for s in self.slices:
                dtype = self.dtypes[s.parameter]
                shape = tuple(s.local_shape)
                size = _DTYPE_SIZES[dtype]
                count = s.byte_length // size
                if count == 0:
                    out[s.parameter] = torch.empty(shape, dtype=tdtypes[dtype])
                    continue
                t = torch.frombuffer(self.mmap, dtype=tdtypes[dtype], count=count,
                                     offset=s.byte_offset)
                out[s.parameter] = t.view(shape)
        return out


class DeviceRankTensors(Dict[str, Any]):
    """One rank's parameters in GPU memory: name -> cuda.DeviceArray (no copy; each has a
    __cuda_array_interface__). .torch() gives torch tensors on the GPU over the same memory
    (a CUDA build of torch needed: cuda.DeviceMemoryError otherwise); .numpy() copies to host
    memory. .shard is the imported cuda.DeviceShard (.pointer, .size: the allocation, rounded
    up to the GPU's granularity), .slices, .dtypes, .device_kind ("cuda"), .device (the CUDA
    ordinal), .writable (read-only is advisory for GPU shards)."""

    def __init__(self, rank: int, shard: "_cuda.DeviceShard", slices: List[Message],
                 dtypes: Dict[str, str], mode: str) -> None:
        super().__init__()
        self.rank = rank
        self.shard = shard
        self.size = shard.size
        self.slices = slices
        self.dtypes = dtypes
        self.device_kind = "cuda"
        self.device = shard.device
        self.mode = mode
        self.writable = shard.writable

    def torch(self) -> Dict[str, Any]:
        """name -> torch tensor on cuda:DEVICE: over the shard (no copy) for "read-only" and
        "shared"; for "private", copies in this process's own GPU memory (a device mapping has
        no copy-on-write)."""
        tensors = _cuda.torch_tensors(self.shard, self)
        if self.mode == "private":
            return {name: t.clone() for name, t in tensors.items()}
        return tensors

    def numpy(self) -> Dict[str, Any]:
        """name -> numpy array copied from the GPU (bfloat16 as uint16 bits)."""
        return {name: a.numpy() for name, a in self.items()}


class Build:
    """A build: .id, .message (the familyd.v1.Build), .shard_socket, .layout (name ->
    familyd.v1.ParameterLayout), and .ranks: rank -> RankTensors (host memory) or
    DeviceRankTensors (GPU memory) for every rank materialised on this node (ranks of other
    nodes and empty ranks are absent). A GPU shard this client cannot map (no CUDA driver)
    raises cuda.DeviceMemoryError, which says so.

    .mode is the mapping mode of .ranks (shard.MODES: "read-only", "private", "shared").

    release() drops this process's reference to the build (the daemon frees a build nothing
    holds after its grace period); the arrays stay valid while they are referenced (the
    mappings keep the memory). close() drops this object's mappings. As a context manager it
    releases and closes on exit.
    """

    def __init__(self, client: "Client", message: Message, mode: str = "read-only",
                 map_shards: bool = True, lazy: bool = False) -> None:
        self.client = client
        self.message = message
        self.id = message.build_id
        self.shard_socket = message.shard_socket or client.default_shard_socket()
        self.mode = _shard.check_mode(mode)
        self.lazy = lazy      # host shards mapped without populating (shard.ShardHandle.map)
        self.writable = mode == "shared"
        self.shared = False   # Build answered a live build (BuildResponse.shared)
        self.layout: Dict[str, Message] = {}
        if message.info and message.info.layout:
            for p in message.info.layout.parameters:
                self.layout[p.name] = p
        self.ranks: Dict[int, Union[RankTensors, DeviceRankTensors]] = {}
        self.released = False
        if map_shards:
            self._map()

    def dtype_of(self, name: str) -> str:
        """The layout dtype of parameter name ("float32" when the layout names none)."""
        p = self.layout.get(name)
        return str(p.dtype) if p is not None and p.dtype else "float32"

    def _map(self) -> None:
        local = [s for s in self.message.shards if s.token]
        for start in range(0, len(local), _shard.MAX_TOKENS):
            chunk = local[start:start + _shard.MAX_TOKENS]
            handles = _shard.fetch(self.shard_socket, [s.token for s in chunk],
                                   self.mode == "shared", timeout=self.client.timeout,
                                   protos=self.client.protos)
            try:
                for s, h in zip(chunk, handles):
                    if h.size == 0:
                        continue
                    if h.device_kind == "cuda":
                        self._map_device(s, h)
                        continue
                    if h.device_kind != "host":
                        continue
                    import numpy as np   # host ranks only: GPU ranks need no numpy

                    mm = h.map(self.mode, lazy=self.lazy)
                    dtypes = {sl.parameter: self.dtype_of(sl.parameter) for sl in s.slices}
                    rt = RankTensors(s.rank, mm, h.size, list(s.slices), dtypes, h.device_kind,
                                     h.device, self.mode)
                    for sl in s.slices:
                        dtype = dtypes[sl.parameter]
                        if dtype not in _NUMPY_DTYPES:
                            raise ValueError("parameter %r: unknown dtype %r" % (sl.parameter, dtype))
                        if sl.byte_offset + sl.byte_length > h.size:
                            raise ValueError("parameter %r: slice outside the shard" % sl.parameter)
                        count = sl.byte_length // _DTYPE_SIZES[dtype]
                        shape = tuple(sl.local_shape)
                        if count == 0:
                            arr = np.zeros(shape, dtype=_NUMPY_DTYPES[dtype])
                        else:
                            arr = np.frombuffer(mm, dtype=_NUMPY_DTYPES[dtype], count=count,
                                                offset=sl.byte_offset).reshape(shape)
                        arr.flags.writeable = self.mode != "read-only"
                        rt[sl.parameter] = arr
                    self.ranks[s.rank] = rt
            finally:
                for h in handles:
                    h.close()   # the mappings keep the memory

    def _map_device(self, s: Message, h: _shard.ShardHandle) -> None:
        shard = _cuda.DeviceShard(h.fd, h.size, h.device, self.mode == "shared")
        dtypes = {sl.parameter: self.dtype_of(sl.parameter) for sl in s.slices}
        rt = DeviceRankTensors(s.rank, shard, list(s.slices), dtypes, self.mode)
        for sl in s.slices:
            dtype = dtypes[sl.parameter]
            if dtype not in _cuda.TYPESTRS:
                raise ValueError("parameter %r: unknown dtype %r" % (sl.parameter, dtype))
            if sl.byte_offset + sl.byte_length > h.size:
                raise ValueError("parameter %r: slice outside the shard" % sl.parameter)
            rt[sl.parameter] = _cuda.DeviceArray(shard, sl.byte_offset, sl.byte_length,
                                                 sl.local_shape, dtype)
        self.ranks[s.rank] = rt

    def torch(self, rank: int) -> Dict[str, Any]:
        """self.ranks[rank].torch()."""
        return self.ranks[rank].torch()

    def release(self, force: bool = False) -> bool:
        """ReleaseBuild: drops this process's reference (force: frees the build whatever
        holds it); the mappings here stay valid. Returns whether the daemon freed the build."""
        freed = False
        if not self.released:
            freed = self.client.release_build(self.id, force=force)
            self.released = True
        return freed

    def pin(self) -> None:
        """PinBuild: the build outlives every process holding it."""
        self.message = self.client.pin_build(self.id)

    def unpin(self) -> None:
        """UnpinBuild."""
        self.message = self.client.unpin_build(self.id)

    def close(self) -> None:
        """Drops the arrays and closes the mappings that nothing else references."""
        ranks, self.ranks = self.ranks, {}
        for rt in ranks.values():
            if isinstance(rt, DeviceRankTensors):
                # Unmapped when the last DeviceArray or torch tensor over it goes.
                rt.clear()
                continue
            mm = rt.mmap
            rt.clear()
            try:
                mm.close()
            except BufferError:
                pass   # an array still views it: it closes when the last view goes

    def __enter__(self) -> "Build":
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.release()
        finally:
            self.close()

    def __repr__(self) -> str:
        return "Build(%r, ranks=%s)" % (self.id, sorted(self.ranks))


class ValidateResult(NamedTuple):
    """What Client.validate() returns: .ok (bool) and .violations (a list of familyd.v1.Violation:
    .fqns, .reason such as "AXIS_SIZE_MISMATCH", .message). Unpacks as (ok, violations); true
    exactly when ok."""

    ok: bool
    violations: List[Message]

    def __bool__(self) -> bool:
        return bool(self.ok)


class Client:
    """Client(socket=None, timeout=30.0, protos=None, shard_socket=None).

    socket: the daemon's API socket; default $FAMILYD_SOCKET, else /run/familyd/familyd.sock.
    timeout: seconds per call (None: no deadline), also for the shard socket.
    shard_socket: the daemon's shard socket for checkpoint deposits (a Build's shards are
    fetched where its reply says); default $FAMILYD_SHARD_SOCKET, else shard.sock beside the
    API socket (the daemon's default).
    """

    def __init__(self, socket: Optional[str] = None, timeout: Optional[float] = 30.0,
                 protos: Optional[Protos] = None, shard_socket: Optional[str] = None) -> None:
        self.socket = socket or os.environ.get("FAMILYD_SOCKET") or DEFAULT_SOCKET
        self.shard_socket = shard_socket or os.environ.get("FAMILYD_SHARD_SOCKET") or None
        self._daemon_shard_socket: Optional[str] = None
        self.timeout = timeout
        self.protos = protos or default_protos()
        self.channel = grpc.insecure_channel("unix:" + self.socket)
        # Checkpoint deposits of this client: (shard socket, absolute path) -> (the files'
        # identities, token). See checkpoint_token().
        self._deposits: Dict[Tuple[str, str], Tuple[Any, str]] = {}

    def close(self) -> None:
        """Closes the channel."""
        self.channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def default_shard_socket(self) -> str:
        """The shard socket given to the client (shard_socket=, $FAMILYD_SHARD_SOCKET), else
        the daemon's own (GetStatus.shard_socket, asked once), else shard.sock beside the API
        socket (a daemon that does not say)."""
        if self.shard_socket:
            return self.shard_socket
        if self._daemon_shard_socket is None:
            status = self.call("familyd.v1.AdminService/GetStatus",
                               self.protos.cls("familyd.v1.GetStatusRequest")())
            self._daemon_shard_socket = status.shard_socket or os.path.join(
                os.path.dirname(self.socket) or ".", "shard.sock")
        return self._daemon_shard_socket

    # -- checkpoints ---------------------------------------------------------------------

    def deposit_checkpoint(self, path: CheckpointLike, shard_socket: Optional[str] = None) -> str:
        """Deposits the safetensors checkpoint at path on the shard socket (default:
        default_shard_socket()) and returns its token for build(checkpoint=TOKEN).

        This process opens the files itself, read-only, with its own rights, and hands the
        daemon the descriptors (the daemon never opens a checkpoint): a file is deposited alone;
        a directory as its `*.index.json` (if it has one) and every regular `*.safetensors`
        file in it, sorted (shard.checkpoint_files()). The token serves Builds of this uid only
        and is dropped 120 s after the deposit or the last Build that named it. Raises
        FileNotFoundError / PermissionError (OSError, naming the file) for a path that is
        missing or unreadable, shard.CheckpointError (a ValueError) for a directory without
        safetensors files, with two indexes or with more than 253 files, shard.ShardError when
        the daemon refuses the deposit (RESOURCE_EXHAUSTED: a uid holds at most 64)."""
        return _shard.deposit_checkpoint(shard_socket or self.default_shard_socket(), path,
                                         timeout=self.timeout, protos=self.protos)

    @staticmethod
    def _identity(path: str) -> Any:
        """What a cached deposit of path stands for: each file's name, device, inode, size,
        modification and change times."""
        directory, names = _shard.checkpoint_files(path)
        out = []
        for name in names:
            st = os.stat(os.path.join(directory, name))
            out.append((name, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns,
                        st.st_ctime_ns))
        return tuple(out)

    def checkpoint_token(self, checkpoint: CheckpointLike, shard_socket: Optional[str] = None,
                         fresh: bool = False) -> str:
        """The token of a checkpoint given as build() takes it: a token (32 lowercase hex
        digits, not the name of an existing file) as it is; a path deposited once per client
        (deposit_checkpoint), its token kept and reused while the files are the same ones
        (name, device, inode, size, modification and change times); a changed or replaced
        file, or fresh=True, deposits again. A uid holds at most 64 deposits at a time, so callers that
        build many modules from one checkpoint should share a client."""
        if isinstance(checkpoint, str) and _TOKEN.fullmatch(checkpoint) \
                and not os.path.exists(checkpoint):
            return checkpoint
        path = os.path.abspath(os.fspath(checkpoint))
        sock = shard_socket or self.default_shard_socket()
        identity = self._identity(path)
        cached = self._deposits.get((sock, path))
        if cached is not None and cached[0] == identity and not fresh:
            return cached[1]
        token = self.deposit_checkpoint(path, sock)
        self._deposits[(sock, path)] = (identity, token)
        return token

    def _forget_token(self, token: str) -> bool:
        """Drops a cached deposit whose token the daemon no longer knows; whether one was."""
        for key, (_, t) in list(self._deposits.items()):
            if t == token:
                del self._deposits[key]
                return True
        return False

    # -- calls ---------------------------------------------------------------------------

    def call(self, rpc: str, request: Message) -> Any:
        """A unary call: rpc 'familyd.v1.FamilyService/Build', request a message of its type."""
        path, _, resp_cls = self.protos.method(rpc)
        fn = self.channel.unary_unary(path, request_serializer=lambda m: m.SerializeToString(),
                                      response_deserializer=resp_cls.FromString)
        try:
            return fn(request, timeout=self.timeout)
        except grpc.RpcError as e:
            raise self._error(e) from None

    def _error(self, e: Any) -> FamilydError:
        reason, metadata = None, {}
        for k, v in (e.trailing_metadata() or ()):
            if k != "grpc-status-details-bin":
                continue
            try:
                st = self.protos.cls("google.rpc.Status").FromString(v)
                for any_ in st.details:
                    if any_.type_url.endswith("/google.rpc.ErrorInfo"):
                        info = self.protos.cls("google.rpc.ErrorInfo").FromString(any_.value)
                        reason, metadata = info.reason, dict(info.metadata)
                        break
            except Exception:
                pass
        return FamilydError(e.code(), e.details() or "", reason, metadata)

    def _context(self, mesh_id: Optional[str] = None, tp_size: Optional[int] = None,
                 cp_size: Optional[int] = None, ep_size: Optional[int] = None,
                 pp_size: Optional[int] = None, active: Iterable[str] = (),
                 sequence_parallel: bool = False, loss_parallel: bool = False) -> Message:
        jc = self.protos.cls("familyd.v1.JobContext")()
        for name, v in (("tp_size", tp_size), ("cp_size", cp_size), ("ep_size", ep_size),
                        ("pp_size", pp_size)):
            if v is not None:
                setattr(jc, name, int(v))
        for axis in active:
            if axis not in ("tp", "cp", "ep", "pp"):
                raise ValueError("unknown axis %r (tp, cp, ep, pp)" % (axis,))
            setattr(jc, axis, True)
        if mesh_id:
            jc.mesh_id = mesh_id
        jc.sequence_parallel = bool(sequence_parallel)
        jc.loss_parallel = bool(loss_parallel)
        return jc

    def list_families(self) -> List[Message]:
        """ListFamilies: the familyd.v1.FamilySummary of every family in the registry."""
        return list(self.call("familyd.v1.FamilyService/ListFamilies",
                              self.protos.cls("familyd.v1.ListFamiliesRequest")()).families)

    def get_family(self, family: str) -> Message:
        """GetFamily: the familyd.v1.Family (variants with their constructor and accepts)."""
        return self.call("familyd.v1.FamilyService/GetFamily",
                         self.protos.cls("familyd.v1.GetFamilyRequest")(family=family))

    def resolve(self, family: str, arguments: Optional[Values] = None,
                mesh_id: Optional[str] = None, tp_size: Optional[int] = None,
                cp_size: Optional[int] = None, ep_size: Optional[int] = None,
                pp_size: Optional[int] = None, active: Iterable[str] = (),
                sequence_parallel: bool = False, loss_parallel: bool = False) -> Message:
        """Resolve: the familyd.v1.ResolvedFamily (family, variant, constructor, ...)."""
        req = self.protos.cls("familyd.v1.ResolveRequest")(family=family)
        for k, v in (arguments or {}).items():
            req.arguments[k].CopyFrom(self.protos.value(v))
        req.context.CopyFrom(self._context(mesh_id, tp_size, cp_size, ep_size, pp_size, active,
                                           sequence_parallel, loss_parallel))
        return self.call("familyd.v1.FamilyService/Resolve", req).resolved

    def create_mesh(self, device_mesh: MeshSpec, expert_mesh: Optional[MeshSpec] = None,
                    ranks: Optional[Iterable[int]] = None, tp_size: Optional[int] = None,
                    cp_size: Optional[int] = None, ep_size: Optional[int] = None,
                    pp_size: Optional[int] = None, sequence_parallel: bool = False,
                    loss_parallel: bool = False) -> Message:
        """CreateMesh: device_mesh / expert_mesh as {"dp": 2, "tp": 4} (row-major order) or a
        list of (name, size); returns the familyd.v1.Mesh as stored (.mesh_id, .ranks)."""
        Mesh = self.protos.cls("familyd.v1.Mesh")
        m = Mesh()

        def dims(spec: MeshSpec) -> List[Message]:
            items = spec.items() if hasattr(spec, "items") else spec
            return [self.protos.cls("familyd.v1.MeshDim")(name=n, size=int(s)) for n, s in items]

        m.device_mesh.extend(dims(device_mesh))
        if expert_mesh:
            m.expert_mesh.extend(dims(expert_mesh))
        if ranks is not None:
            m.ranks.extend(int(r) for r in ranks)
        for name, v in (("tp_size", tp_size), ("cp_size", cp_size), ("ep_size", ep_size),
                        ("pp_size", pp_size)):
            if v is not None:
                setattr(m, name, int(v))
        m.sequence_parallel = bool(sequence_parallel)
        m.loss_parallel = bool(loss_parallel)
        req = self.protos.cls("familyd.v1.CreateMeshRequest")(mesh=m)
        return self.call("familyd.v1.MeshService/CreateMesh", req)

    def get_mesh(self, mesh_id: str) -> Message:
        """GetMesh: the familyd.v1.Mesh as stored (.device_mesh, .expert_mesh, .ranks)."""
        return self.call("familyd.v1.MeshService/GetMesh",
                         self.protos.cls("familyd.v1.GetMeshRequest")(mesh_id=mesh_id))

    def delete_mesh(self, mesh_id: str) -> None:
        """DeleteMesh."""
        self.call("familyd.v1.MeshService/DeleteMesh",
                  self.protos.cls("familyd.v1.DeleteMeshRequest")(mesh_id=mesh_id))

    # -- Topology ------------------------------------------------------------------------

    def topology(self) -> Message:
        """GetTopology: the familyd.v1.Topology this daemon sees (.version, .world_size,
        .local_node, .nodes with .name, .state "up" | "suspect" | "down", .first_rank,
        .devices)."""
        return self.call("familyd.v1.MeshService/GetTopology",
                         self.protos.cls("familyd.v1.GetTopologyRequest")())

    def watch_topology(self, timeout: Optional[float] = None) -> Iterator[Message]:
        """WatchTopology as a generator: the current familyd.v1.Topology, then the whole
        topology again after each change, for as long as the caller iterates.

        timeout: seconds for the whole watch (None: no deadline; the client's per-call timeout
        does not apply). Closing the generator (close(), break out of a for loop, garbage
        collection) cancels the stream. The daemon going away, shutting down, or the deadline
        raises FamilydError (UNAVAILABLE, CANCELLED, DEADLINE_EXCEEDED)."""
        path, _, resp_cls = self.protos.method("familyd.v1.MeshService/WatchTopology")
        fn = self.channel.unary_stream(path, request_serializer=lambda m: m.SerializeToString(),
                                       response_deserializer=resp_cls.FromString)
        call = fn(self.protos.cls("familyd.v1.WatchTopologyRequest")(), timeout=timeout)
        try:
            for topology in call:
                yield topology
        except grpc.RpcError as e:
            raise self._error(e) from None
        finally:
            call.cancel()

    def watch_build(self, build_id: Optional[str] = None, progress_tag: Optional[str] = None,
                    timeout: Optional[float] = None) -> Iterator[Message]:
        """WatchBuild as a generator: the familyd.v1.BuildProgress of a materialising build,
        named by its id or by the progress_tag its Build carried (exactly one), as it fills,
        then its final state (.state DONE or FAILED); the generator ends with the stream.
        A build is known from the start of its fill until 60 s after its end: before,
        FamilydError NOT_FOUND BUILD_NOT_FOUND (ask again). Closing the generator cancels the
        stream; the build goes on."""
        path, _, resp_cls = self.protos.method("familyd.v1.FamilyService/WatchBuild")
        fn = self.channel.unary_stream(path, request_serializer=lambda m: m.SerializeToString(),
                                       response_deserializer=resp_cls.FromString)
        req = self.protos.cls("familyd.v1.WatchBuildRequest")(build_id=build_id or "",
                                                               progress_tag=progress_tag or "")
        call = fn(req, timeout=timeout)
        try:
            for progress in call:
                yield progress
        except grpc.RpcError as e:
            raise self._error(e) from None
        finally:
            call.cancel()

    def forget_node(self, node: str) -> Message:
        """ForgetNode: drops a down node and its ranks from the topology of every daemon;
        returns the new familyd.v1.Topology. FamilydError FAILED_PRECONDITION for a node that
        is up or suspect or is this daemon's own, NOT_FOUND for an unknown one."""
        req = self.protos.cls("familyd.v1.ForgetNodeRequest")(node=node)
        return self.call("familyd.v1.MeshService/ForgetNode", req).topology

    def build_request(self, family: str, config: Optional[Values] = None,
                      mesh_id: Optional[str] = None, materialize: bool = True,
                      dtype: Optional[str] = "float32", seed: Optional[int] = None,
                      ranks: Optional[Iterable[int]] = None, arguments: Optional[Values] = None,
                      module: Union[Message, Mapping[str, Any], None] = None,
                      module_fqn: Optional[str] = None,
                      context: Optional[Mapping[str, Any]] = None,
                      parameter_dtypes: Optional[Mapping[str, str]] = None,
                      private_build: bool = False, writable: bool = False,
                      source_config: Optional[Values] = None,
                      share: Optional[str] = None,
                      progress_tag: Optional[str] = None,
                      checkpoint: Optional[CheckpointLike] = None,
                      checkpoint_prefix: str = "", checkpoint_names: str = "") -> Message:
        """The familyd.v1.BuildRequest that build() sends (see there). A checkpoint path is
        deposited here (checkpoint_token(): once per client and files)."""
        req = self.protos.cls("familyd.v1.BuildRequest")(family=family)
        if checkpoint is not None:
            req.checkpoint.token = self.checkpoint_token(checkpoint)
            req.checkpoint.prefix = checkpoint_prefix or ""
            req.checkpoint.names = checkpoint_names or ""
        elif checkpoint_prefix or checkpoint_names:
            raise ValueError("checkpoint_prefix or checkpoint_names without a checkpoint")
        if share:
            req.share = share
        if progress_tag:
            req.progress_tag = progress_tag
        for k, v in (parameter_dtypes or {}).items():
            req.parameter_dtypes[k] = v
        req.private_build = bool(private_build)
        req.writable = bool(writable)
        for k, v in (arguments or {}).items():
            req.arguments[k].CopyFrom(self.protos.value(v))
        if config is not None:
            req.config.SetInParent()
            for k, v in config.items():
                req.config.fields[k].CopyFrom(self.protos.value(v))
        if module is not None:
            if isinstance(module, dict):
                req.module.fqn = module.get("fqn", "")
                for p in module.get("parameters", ()):
                    sp = req.module.parameters.add()
                    sp.name = p["name"]
                    sp.shape.extend(int(d) for d in p.get("shape", ()))
                    sp.dtype = p.get("dtype", "")
            else:
                req.module.CopyFrom(module)
        if source_config is not None:
            req.source_config.SetInParent()
            for k, v in source_config.items():
                req.source_config.fields[k].CopyFrom(self.protos.value(v))
        if module_fqn:
            req.module_fqn = module_fqn
        if mesh_id:
            req.mesh_id = mesh_id
        if context:
            req.context.CopyFrom(self._context(**context))
        if materialize:
            req.materialize.enabled = True
            if dtype:
                req.materialize.dtype = dtype
            if seed is not None:
                req.materialize.seed = int(seed)
            if ranks is not None:
                req.materialize.ranks.extend(int(r) for r in ranks)
        return req

    def build(self, family: str, config: Optional[Values] = None, mesh_id: Optional[str] = None,
              materialize: bool = True, dtype: Optional[str] = "float32",
              seed: Optional[int] = None, ranks: Optional[Iterable[int]] = None,
              arguments: Optional[Values] = None,
              module: Union[Message, Mapping[str, Any], None] = None,
              module_fqn: Optional[str] = None, context: Optional[Mapping[str, Any]] = None,
              mode: Optional[str] = None, writable: bool = False, map_shards: bool = True,
              parameter_dtypes: Optional[Mapping[str, str]] = None,
              private_build: bool = False,
              source_config: Optional[Values] = None,
              share: Optional[str] = None, progress_tag: Optional[str] = None,
              lazy: bool = False, checkpoint: Optional[CheckpointLike] = None,
              checkpoint_prefix: str = "", checkpoint_names: str = "") -> Build:
        """Build and map: a Build whose .ranks hold numpy views of this node's shards.

        config: {field: int | float | str | bool} (BuildRequest.config); module: a
        familyd.v1.SourceModule or {"fqn": ..., "parameters": [{"name", "shape", "dtype"}]}
        instead of config; source_config: with module, the source module's config
        (BuildRequest.source_config), whose fields give the replacement's inits their numbers
        where the source's shapes bind none (without it such an init is zeros); arguments:
        selectors and arguments of the family; context: keyword
        arguments of the job context (tp_size=..., active=("ep",), ...). dtype: float32,
        bfloat16, float16 (or the daemon's aliases); parameter_dtypes: {name: dtype} over the
        registry's dtype and dtype. mode: how the shards are mapped (shard.MODES):
        "read-only" (default; numpy arrays not writeable, no .torch()), "private"
        (copy-on-write: train on it, writes stay in this process) or "shared" (the build is
        made writable, BuildRequest.writable, and writes reach every process mapping it);
        writable=True is the old spelling of mode="shared". A live build with the same request
        (and mode's writability) is shared: this process then holds a reference to it;
        private_build=True asks for a build of its own. share: who may map the shards,
        "owner" (default: this uid's processes and admins) or "group" (every process that can
        reach the shard socket; BuildRequest.share). progress_tag: a name of the caller's
        choosing that watch_build() follows the fill by (the id comes only with the answer).
        map_shards=False: the Build without mappings (.message, .layout; fetch_shards() later).
        Host shards are mapped populated (every page resident before the first read, filled
        in on a few threads); lazy=True maps them without touching any page, for a caller
        that reads little of them.
        GPU shards are imported through the CUDA driver (familyd.cuda); a client that cannot
        map device memory gets cuda.DeviceMemoryError and the build is released.

        checkpoint: fill the parameters from a safetensors checkpoint instead of their inits
        (BuildRequest.checkpoint; needs materialize): a token of deposit_checkpoint(), or the
        path of a .safetensors file or of a directory of them (with its index), deposited by
        this client once (checkpoint_token(); a path whose cached token the daemon has dropped
        is deposited again and the Build asked once more). checkpoint_prefix: the member's
        place in the model, the registry's `{prefix}` ("model.layers.0.mlp").
        checkpoint_names: how its tensors are named (CheckpointRef.names): "registry" (default:
        the registry's checkpoint names) or "parameters" (the member's parameter names after the
        prefix, each tensor in its parameter's logical shape: what save_checkpoint writes).
        """
        mode = _shard.check_mode(mode or ("shared" if writable else "read-only"))
        kw: Dict[str, Any] = dict(
            private_build=private_build, writable=mode == "shared",
            source_config=source_config, share=share, progress_tag=progress_tag,
            checkpoint=checkpoint, checkpoint_prefix=checkpoint_prefix,
            checkpoint_names=checkpoint_names)
        req = self.build_request(family, config, mesh_id, materialize, dtype, seed, ranks,
                                 arguments, module, module_fqn, context, parameter_dtypes, **kw)
        try:
            resp = self.call("familyd.v1.FamilyService/Build", req)
        except FamilydError as e:
            # A cached deposit the daemon dropped (120 s unused): deposit the path again.
            if not (e.reason == "CHECKPOINT_TOKEN" and checkpoint is not None
                    and req.checkpoint.token != checkpoint
                    and self._forget_token(req.checkpoint.token)):
                raise
            req = self.build_request(family, config, mesh_id, materialize, dtype, seed, ranks,
                                     arguments, module, module_fqn, context, parameter_dtypes,
                                     **kw)
            resp = self.call("familyd.v1.FamilyService/Build", req)
        b = Build(self, resp.build, mode=mode, map_shards=False, lazy=lazy)
        b.shared = resp.shared
        if not map_shards:
            return b
        try:
            b._map()
        except BaseException:
            b.close()
            try:
                b.release()
            except Exception:
                pass
            raise
        return b

    def open_build(self, build_id: str, mode: Optional[str] = None,
                   writable: bool = False, lazy: bool = False) -> Build:
        """An existing build (GetBuild), its local shards mapped like build()'s in mode
        (default "read-only"; writable=True: "shared"), populated unless lazy. It takes no
        reference: the process that built it, or a pin, keeps it."""
        mode = _shard.check_mode(mode or ("shared" if writable else "read-only"))
        return Build(self, self.get_build(build_id), mode=mode, lazy=lazy)

    def get_build(self, build_id: str) -> Message:
        """GetBuild: the familyd.v1.Build."""
        return self.call("familyd.v1.FamilyService/GetBuild",
                         self.protos.cls("familyd.v1.GetBuildRequest")(build_id=build_id))

    def list_builds(self) -> List[Message]:
        """ListBuilds: the familyd.v1.Build of every live build."""
        return list(self.call("familyd.v1.FamilyService/ListBuilds",
                              self.protos.cls("familyd.v1.ListBuildsRequest")()).builds)

    def release_build(self, build_id: str, force: bool = False) -> bool:
        """ReleaseBuild: drops this process's reference (FamilydError FAILED_PRECONDITION
        NOT_HELD when it holds none); force=True frees the build whatever holds it. Returns
        whether the build was freed by this call."""
        req = self.protos.cls("familyd.v1.ReleaseBuildRequest")(build_id=build_id,
                                                                 force=bool(force))
        return bool(self.call("familyd.v1.FamilyService/ReleaseBuild", req).freed)

    def pin_build(self, build_id: str) -> Message:
        """PinBuild: the familyd.v1.Build, now pinned (it outlives every process holding it)."""
        return self.call("familyd.v1.FamilyService/PinBuild",
                         self.protos.cls("familyd.v1.PinBuildRequest")(build_id=build_id))

    def unpin_build(self, build_id: str) -> Message:
        """UnpinBuild: the familyd.v1.Build, no longer pinned."""
        return self.call("familyd.v1.FamilyService/UnpinBuild",
                         self.protos.cls("familyd.v1.UnpinBuildRequest")(build_id=build_id))

    def publish_build(self, build_id: str) -> Message:
        """PublishBuild: a writable build of a member with init: module, its module's values
        written and its shards unmapped, becomes the node's read-only build of its request
        (sealed against writes). Answers the familyd.v1.Build."""
        return self.call("familyd.v1.FamilyService/PublishBuild",
                         self.protos.cls("familyd.v1.PublishBuildRequest")(build_id=build_id))

    # -- Validate ------------------------------------------------------------------------

    _CONTEXT_KWARGS = ("mesh_id", "tp_size", "cp_size", "ep_size", "pp_size", "active",
                       "sequence_parallel", "loss_parallel")

    def _message(self, full_name: str, value: Any) -> Message:
        """value as a message of full_name: the message itself, or a dict in proto3 JSON form
        (lowerCamelCase or proto field names)."""
        cls = self.protos.cls(full_name)
        if isinstance(value, cls):
            return value
        if hasattr(value, "DESCRIPTOR") and value.DESCRIPTOR.full_name == full_name:
            return cls.FromString(value.SerializeToString())
        if isinstance(value, dict):
            from google.protobuf import json_format

            return json_format.ParseDict(value, cls())
        raise TypeError("expected a %s or a dict, not %r" % (full_name, type(value).__name__))

    def _boundary(self, b: BoundaryLike) -> Message:
        """One ModelBoundary from a message, a Build, a (fqns, build[, applied_layout]) tuple or
        a dict {"fqns", "build_id" or "build", "applied_layout"}."""
        Boundary = self.protos.cls("familyd.v1.ModelBoundary")
        if isinstance(b, Boundary) or (hasattr(b, "DESCRIPTOR")
                                       and b.DESCRIPTOR.full_name == "familyd.v1.ModelBoundary"):
            return self._message("familyd.v1.ModelBoundary", b)
        fqns: Any = ()
        build: Any = None
        layout: Any = None
        if isinstance(b, Build) or hasattr(b, "build_id"):
            build = b
        elif isinstance(b, (tuple, list)):
            if not 2 <= len(b) <= 3:
                raise ValueError("a boundary tuple is (fqns, build[, applied_layout])")
            fqns, build = b[0], b[1]
            layout = b[2] if len(b) == 3 else None
        elif isinstance(b, dict):
            known = {"fqns", "build", "build_id", "buildId", "applied_layout", "appliedLayout"}
            unknown = set(b) - known
            if unknown:
                raise ValueError("unknown boundary keys %s (%s)" % (sorted(unknown), sorted(known)))
            fqns = b.get("fqns", ())
            build = b.get("build", b.get("build_id", b.get("buildId")))
            layout = b.get("applied_layout", b.get("appliedLayout"))
        else:
            raise TypeError("a boundary is a dict, a (fqns, build) tuple, a Build or a "
                            "familyd.v1.ModelBoundary, not %r" % type(b).__name__)
        if isinstance(fqns, str):
            fqns = (fqns,)
        m = Boundary()
        m.fqns.extend(fqns)
        if isinstance(build, Build):
            m.build_id = build.id
        elif hasattr(build, "build_id"):      # a familyd.v1.Build message
            m.build_id = build.build_id
        elif build is not None:
            m.build_id = str(build)
        if layout is not None:
            m.applied_layout.CopyFrom(self._message("familyd.v1.Layout", layout))
        return m

    def validate_request(self, boundaries: Iterable[BoundaryLike],
                         context: Union[Mapping[str, Any], Message, None] = None,
                         shared_parameters: Optional[Iterable[Any]] = None) -> Message:
        """The familyd.v1.ValidateRequest that validate() sends (see there)."""
        req = self.protos.cls("familyd.v1.ValidateRequest")()
        for b in boundaries:
            req.boundaries.add().CopyFrom(self._boundary(b))
        if context is not None:
            if isinstance(context, dict) and set(context) <= set(self._CONTEXT_KWARGS):
                req.context.CopyFrom(self._context(**context))
            else:
                req.context.CopyFrom(self._message("familyd.v1.JobContext", context))

        def build_id(build: Any) -> str:
            if isinstance(build, Build):
                return str(build.id)
            if hasattr(build, "build_id"):      # a familyd.v1.Build message
                return str(build.build_id)
            return "" if build is None else str(build)

        def use(u: Any) -> Message:
            if hasattr(u, "DESCRIPTOR"):
                return self._message("familyd.v1.SharedParameterUse", u)
            if isinstance(u, (tuple, list)):
                if len(u) != 3:
                    raise ValueError("a shared parameter use tuple is (fqn, build, parameter)")
                fqn, build, parameter = u
            elif isinstance(u, dict):
                known = {"fqn", "build", "build_id", "buildId", "parameter"}
                unknown = set(u) - known
                if unknown:
                    raise ValueError("unknown shared parameter use keys %s (%s)"
                                     % (sorted(unknown), sorted(known)))
                fqn, parameter = u.get("fqn", ""), u.get("parameter", "")
                build = u.get("build", u.get("build_id", u.get("buildId")))
            else:
                raise TypeError("a shared parameter use is a dict, a (fqn, build, parameter) "
                                "tuple or a familyd.v1.SharedParameterUse, not %r"
                                % type(u).__name__)
            return self.protos.cls("familyd.v1.SharedParameterUse")(
                fqn=str(fqn), build_id=build_id(build), parameter=str(parameter))

        for shared in shared_parameters or ():
            if hasattr(shared, "DESCRIPTOR"):
                req.shared_parameters.add().CopyFrom(
                    self._message("familyd.v1.SharedParameter", shared))
            elif isinstance(shared, (str, bytes, dict)):
                raise TypeError("a shared parameter is a list of uses or a "
                                "familyd.v1.SharedParameter, not %r" % type(shared).__name__)
            else:
                m = req.shared_parameters.add()
                for u in shared:
                    m.uses.add().CopyFrom(use(u))
        return req

    def validate(self, boundaries: Iterable[BoundaryLike],
                 context: Union[Mapping[str, Any], Message, None] = None,
                 shared_parameters: Optional[Iterable[Any]] = None) -> ValidateResult:
        """Validate: the trainer's model against its job; a ValidateResult (ok, violations).

        boundaries: one per built instance, in model order, each a dict {"fqns": [...],
        "build_id": "bld-..." (or "build": a Build), "applied_layout": a familyd.v1.Layout or
        its proto3 JSON dict (optional)}, a tuple (fqns, build[, applied_layout]), a Build
        alone (no fqns), or a familyd.v1.ModelBoundary. context: keyword arguments of the job
        context as for build() (mesh_id=..., ep_size=4, active=("ep",)), a proto3 JSON dict
        ({"epSize": 4}) or a familyd.v1.JobContext. shared_parameters: the parameters the
        model ties across builds, each a list of its uses (at least two; each later use is
        compared with the first), a use being a dict {"fqn": "head.weight", "build_id":
        "bld-..." (or "build": a Build), "parameter": "weight"}, a (fqn, build, parameter)
        tuple or a familyd.v1.SharedParameterUse; or a familyd.v1.SharedParameter. A model
        with violations is not an error: .ok is False and .violations lists them all;
        FamilydError is for refused calls (a malformed shared parameter among them).
        """
        resp = self.call("familyd.v1.FamilyService/Validate",
                         self.validate_request(boundaries, context, shared_parameters))
        return ValidateResult(bool(resp.ok), list(resp.violations))

    def fetch_shards(self, build: Message, writable: bool = False,
                     ranks: Optional[Sequence[int]] = None) -> Dict[int, _shard.ShardHandle]:
        """Raw descriptors: rank -> shard.ShardHandle for a familyd.v1.Build's local shards
        (optionally only ranks). The caller closes them."""
        local = [s for s in build.shards if s.token and (ranks is None or s.rank in ranks)]
        out: Dict[int, _shard.ShardHandle] = {}
        for start in range(0, len(local), _shard.MAX_TOKENS):
            chunk = local[start:start + _shard.MAX_TOKENS]
            handles = _shard.fetch(build.shard_socket or self.default_shard_socket(),

                                   [s.token for s in chunk], writable, timeout=self.timeout,
                                   protos=self.protos)
            for s, h in zip(chunk, handles):
                out[s.rank] = h
        return out


__all__ = ["Client", "Build", "DeviceRankTensors", "RankTensors", "FamilydError",
           "ValidateResult"]
