"""The shard socket client (proto/familyd/v1/shard.proto), in pure Python.

Each frame is a 4-byte little-endian length and that many bytes (at most 65,536) of a
serialized message. The client sends familyd.v1.ShardFdRequest{tokens, writable} (at most 253
tokens) and reads one familyd.v1.ShardFdReply{code, message, sizes, device_kinds, devices}; on
success one descriptor per token rides as SCM_RIGHTS with the first bytes of the reply.

A checkpoint deposit goes the other way (deposit_checkpoint()): the client opens the checkpoint's
files itself, read-only, with its own rights, and sends ShardFdRequest{checkpoint_files: base
names} with one descriptor per name riding as SCM_RIGHTS on the frame's first bytes; the daemon
answers ShardFdReply{checkpoint_token} (no descriptors), which BuildRequest.checkpoint names.
The daemon never opens a checkpoint file itself: it reads only what its caller could.
"""

import array
import ctypes
import ctypes.util
import errno
import mmap
import os
import socket
import stat
import struct
import threading
import time
from typing import Iterable, List, Optional, Sequence, Tuple, Union

from ._protos import Protos, default_protos

MAX_TOKENS = 253
MAX_FRAME = 65536
# At most this many files in one deposit (the descriptors of one SCM_RIGHTS message).
MAX_CHECKPOINT_FILES = 253
CHECKPOINT_SUFFIX = ".safetensors"
INDEX_SUFFIX = ".index.json"

_STATUS_NAMES = ["OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
                 "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
                 "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL",
                 "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"]


def status_name(code: int) -> str:
    """The gRPC status name of a status number ("UNKNOWN_STATUS" when there is none)."""
    return _STATUS_NAMES[code] if 0 <= code < len(_STATUS_NAMES) else "UNKNOWN_STATUS"


class ShardError(Exception):
    """The daemon refused the request: .code (gRPC status number), .code_name, .message."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__("%s: %s" % (status_name(code), message))
        self.code = code
        self.code_name = status_name(code)
        self.message = message


# How a trainer maps a shard: the daemon's bytes read-only; a private copy-on-write view it may
# train on; or the writable bytes of a build made writable, shared by every process mapping it.
MODES = ("read-only", "private", "shared")


def check_mode(mode: str) -> str:
    """mode if it is one of MODES, else ValueError naming them."""
    if mode not in MODES:
        raise ValueError("unknown mapping mode %r: use one of %s" % (mode, ", ".join(MODES)))
    return mode


# Populating a mapping: a fresh one has no page table entries, so its first read faults once per
# page, one thread at a time. populate() asks the kernel for all of them up front, split over a
# few threads (ctypes calls madvise() without the GIL): MADV_POPULATE_READ (Linux 5.14+), or
# _WRITE for a shared writable mapping (a private one is never written: that would copy it);
# an older kernel gets one byte per page read instead.
MADV_HUGEPAGE = 14
MADV_POPULATE_READ = 22
MADV_POPULATE_WRITE = 23
MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)   # Linux
POPULATE_MAX_THREADS = 4
POPULATE_BYTES_PER_THREAD = 64 << 20
_PIECE = 2 << 20  # ranges are whole 2 MiB pieces: a huge page never straddles two

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.madvise.restype = ctypes.c_int


class _PyBuffer(ctypes.Structure):
    """CPython's Py_buffer, enough of it to read the address of a (read-only) mapping."""
    _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.py_object), ("len", ctypes.c_ssize_t),
                ("itemsize", ctypes.c_ssize_t), ("readonly", ctypes.c_int),
                ("ndim", ctypes.c_int), ("format", ctypes.c_char_p),
                ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                ("suboffsets", ctypes.c_void_p), ("internal", ctypes.c_void_p)]


def _address(mm: mmap.mmap) -> int:
    """The address of mm's first byte (works for read-only mappings, unlike from_buffer)."""
    view = _PyBuffer()
    get = ctypes.pythonapi.PyObject_GetBuffer
    get.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
    release = ctypes.pythonapi.PyBuffer_Release
    release.argtypes = [ctypes.POINTER(_PyBuffer)]
    if get(mm, ctypes.byref(view), 0) != 0:
        raise ValueError("cannot read the mapping's address")
    try:
        return int(view.buf or 0)
    finally:
        release(ctypes.byref(view))


def _populate_range(mm: mmap.mmap, addr: int, start: int, length: int, advice: int) -> None:
    while True:
        if _libc.madvise(addr + start, length, advice) == 0:
            return
        err = ctypes.get_errno()
        if err in (errno.EINTR, errno.EAGAIN):
            continue
        if err != errno.EINVAL:
            raise OSError(err, "madvise(MADV_POPULATE_*): " + os.strerror(err))
        break
    # A kernel without MADV_POPULATE_*: a read per page faults it in.
    bytes(memoryview(mm)[start:start + length:mmap.PAGESIZE])


def populate(mm: mmap.mmap, mode: str = "read-only") -> None:
    """Makes every page of mm (a mapping made in mode, MODES) resident in this process's page
    tables, on up to POPULATE_MAX_THREADS threads of at least POPULATE_BYTES_PER_THREAD each
    and no more than the CPUs. OSError when the kernel refuses (EFAULT: not mapped)."""
    size = len(mm)
    if size == 0:
        return
    advice = MADV_POPULATE_WRITE if check_mode(mode) == "shared" else MADV_POPULATE_READ
    addr = _address(mm)
    n = max(1, min(size // POPULATE_BYTES_PER_THREAD, POPULATE_MAX_THREADS, os.cpu_count() or 1))
    per = max((size // n + _PIECE - 1) // _PIECE * _PIECE, mmap.PAGESIZE)
    ranges = [(i * per, min(per, size - i * per)) for i in range(n) if i * per < size]
    errors: List[BaseException] = []

    def run(start: int, length: int) -> None:
        try:
            _populate_range(mm, addr, start, length, advice)
        except BaseException as e:  # noqa: B902 - handed to the caller's thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=r, daemon=True) for r in ranges[1:]]
    for t in threads:
        t.start()
    run(*ranges[0])
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


class ShardHandle:
    """One descriptor from the shard socket: fd (owned; close() it), size, device kind/index.

    A "host" shard is a memfd: map() it. A "cuda" shard is a CUDA POSIX file descriptor of a
    GPU allocation (size: the allocation's, rounded to its granularity): import it with
    familyd.cuda.DeviceShard(h.fd, h.size, h.device)."""

    def __init__(self, fd: int, size: int, device_kind: str, device: int,
                 writable: bool) -> None:
        self.fd = fd
        self.size = size
        self.device_kind = device_kind
        self.device = device
        self.writable = writable

    def map(self, mode: Optional[str] = None, lazy: bool = False) -> mmap.mmap:
        """An mmap.mmap of the whole shard in a mapping mode (MODES): "read-only" (MAP_SHARED,
        PROT_READ), "private" (MAP_PRIVATE, PROT_READ | PROT_WRITE: copy-on-write, writes stay
        in this process) or "shared" (MAP_SHARED, PROT_READ | PROT_WRITE: needs a descriptor
        fetched writable, of a build made writable). Default: "shared" when fetched writable,
        else "read-only". The mapping keeps the memory alive after close() and after
        ReleaseBuild.

        Populated (populate()) unless lazy: a trainer reads all of its parameters at once, and
        a populated mapping's first read runs at memory speed instead of faulting page by page.
        lazy=True maps without touching anything, for callers that read little of a shard."""
        mode = check_mode(mode or ("shared" if self.writable else "read-only"))
        if mode == "shared" and not self.writable:
            raise ValueError("a shared mapping needs a descriptor fetched writable")
        if self.size == 0:
            raise ValueError("an empty shard cannot be mapped")
        if self.device_kind != "host":
            raise ValueError("a %s shard is not host memory: import it with "
                             "familyd.cuda.DeviceShard" % self.device_kind)
        prot = mmap.PROT_READ | (0 if mode == "read-only" else mmap.PROT_WRITE)
        flags = mmap.MAP_PRIVATE if mode == "private" else mmap.MAP_SHARED
        try:
            mm = mmap.mmap(self.fd, self.size, flags=flags, prot=prot)
        except OSError as e:
            # A private mapping of a hugetlb shard reserves a huge page for each possible
            # copy; where the pool has none left, map without the reservation (reads need
            # none; a write finding no free huge page is SIGBUS), as libfamilyd does.
            if e.errno != errno.ENOMEM or mode != "private":
                raise
            mm = mmap.mmap(self.fd, self.size, flags=flags | MAP_NORESERVE, prot=prot)
        # Huge folios of a memfd under shmem THP `advise` map huge only where asked for.
        _libc.madvise(_address(mm), self.size, MADV_HUGEPAGE)
        if not lazy:
            try:
                populate(mm, mode)
            except BaseException:
                mm.close()
                raise
        return mm

    def close(self) -> None:
        """Closes the descriptor (a mapping made from it stays valid)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "ShardHandle":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def _recv_exact(sock: socket.socket, n: int, fds: List[int], deadline: Optional[float]) -> bytes:
    """n bytes; SCM_RIGHTS descriptors of any chunk go to fds."""
    buf = bytearray()
    cmsg_space = socket.CMSG_SPACE(MAX_TOKENS * array.array("i").itemsize)
    while len(buf) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("shard socket: no complete reply in time")
            sock.settimeout(left)
        data, ancdata, flags, _ = sock.recvmsg(n - len(buf), cmsg_space,
                                               getattr(socket, "MSG_CMSG_CLOEXEC", 0))
        for level, typ, cdata in ancdata:
            if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
                a = array.array("i")
                a.frombytes(cdata[:len(cdata) - (len(cdata) % a.itemsize)])
                fds.extend(a)
        if flags & getattr(socket, "MSG_CTRUNC", 0x8):
            raise ConnectionError("shard socket: control data truncated")
        if not data:
            raise ConnectionError("shard socket: connection closed before the reply")
        buf += data
    return bytes(buf)


def fetch(socket_path: str, tokens: Iterable[str], writable: bool = False,
          timeout: Optional[float] = 30.0, protos: Optional[Protos] = None) -> List[ShardHandle]:
    """Trade tokens for descriptors: a list of ShardHandle in token order.

    Raises ShardError when the daemon answers a status other than OK (all or nothing: no
    descriptor then), OSError when the socket cannot be reached, TimeoutError past timeout
    (None: wait forever), ValueError for a malformed reply. No descriptor leaks on failure.
    """
    protos = protos or default_protos()
    tokens = list(tokens)
    if not 1 <= len(tokens) <= MAX_TOKENS:
        raise ValueError("between 1 and %d tokens, not %d" % (MAX_TOKENS, len(tokens)))
    req = protos.cls("familyd.v1.ShardFdRequest")(tokens=tokens, writable=bool(writable))
    payload = req.SerializeToString()
    if len(payload) > MAX_FRAME:
        raise ValueError("request of %d bytes exceeds the %d-byte frame limit" % (len(payload), MAX_FRAME))

    deadline = None if timeout is None else time.monotonic() + timeout
    fds: List[int] = []
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(socket_path)
        sock.sendall(struct.pack("<I", len(payload)) + payload)
        (length,) = struct.unpack("<I", _recv_exact(sock, 4, fds, deadline))
        if length > MAX_FRAME:
            raise ValueError("shard socket: reply frame of %d bytes" % length)
        reply = protos.cls("familyd.v1.ShardFdReply").FromString(_recv_exact(sock, length, fds, deadline))
        if reply.code != 0:
            raise ShardError(reply.code, reply.message)
        if len(fds) != len(tokens) or len(reply.sizes) != len(tokens):
            raise ValueError("shard socket: %d descriptors and %d sizes for %d tokens"
                             % (len(fds), len(reply.sizes), len(tokens)))
        handles: List[ShardHandle] = []
        for i, fd in enumerate(fds):

            kind = reply.device_kinds[i] if i < len(reply.device_kinds) else "host"
            dev = reply.devices[i] if i < len(reply.devices) else 0
            handles.append(ShardHandle(fd, reply.sizes[i], kind, dev, bool(writable)))
        fds = []
        return handles
    finally:
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass
        sock.close()


# -- checkpoint deposits -----------------------------------------------------------------------

PathLike = Union[str, "os.PathLike[str]"]


class CheckpointError(ValueError):
    """A checkpoint path that cannot be deposited as it is (no safetensors files, two indexes,
    too many files, not a file or directory): the message says which and where. A path that
    does not exist or cannot be read raises OSError (FileNotFoundError, PermissionError)
    naming it instead."""


def checkpoint_files(path: PathLike) -> Tuple[str, List[str]]:
    """(directory, base names) of what a deposit of path sends (docs/checkpoints.md):

    - a regular file (or a symbolic link to one): just it;
    - a directory: its index, the one `*.index.json` regular file if there is one
      (model.safetensors.index.json), then every regular `*.safetensors` file in it, sorted
      by name (symbolic links to files followed: the Hugging Face cache's layout).

    Nothing is parsed here: the daemon checks the index against the files. Raises
    FileNotFoundError / PermissionError (OSError) for a path that is missing or cannot be
    listed, CheckpointError for a directory without safetensors files or with more than one
    index, more than MAX_CHECKPOINT_FILES files, or a path that is neither a file nor a
    directory."""
    path = os.fspath(path)
    st = os.stat(path)      # FileNotFoundError / PermissionError name the path
    if stat.S_ISREG(st.st_mode):
        directory, name = os.path.split(os.path.abspath(path))
        return directory, [name]
    if not stat.S_ISDIR(st.st_mode):
        raise CheckpointError("checkpoint %s is neither a regular file nor a directory" % path)
    indexes: List[str] = []
    tensors: List[str] = []
    for name in sorted(os.listdir(path)):
        if not (name.endswith(CHECKPOINT_SUFFIX) or name.endswith(INDEX_SUFFIX)):
            continue
        try:
            regular = stat.S_ISREG(os.stat(os.path.join(path, name)).st_mode)
        except FileNotFoundError:
            continue        # a dangling link, or gone since the listing: not a file of it
        if not regular:
            continue
        (indexes if name.endswith(INDEX_SUFFIX) else tensors).append(name)
    if not tensors:
        raise CheckpointError("checkpoint directory %s has no %s files" % (path, CHECKPOINT_SUFFIX))
    if len(indexes) > 1:
        raise CheckpointError("checkpoint directory %s has %d index files (%s): keep one"
                              % (path, len(indexes), ", ".join(indexes)))
    names = indexes + tensors
    if len(names) > MAX_CHECKPOINT_FILES:
        raise CheckpointError("checkpoint directory %s has %d files to deposit, more than the %d "
                              "one deposit carries" % (path, len(names), MAX_CHECKPOINT_FILES))
    return os.path.abspath(path), names


def open_checkpoint(path: PathLike) -> List[Tuple[str, int]]:
    """[(base name, descriptor)] of checkpoint_files(path), each opened O_RDONLY | O_CLOEXEC by
    this process with its own rights (and checked to be a regular file once open). The caller
    closes the descriptors; on an error none is left open. OSError (PermissionError: not
    readable) names the file."""
    directory, names = checkpoint_files(path)
    opened: List[Tuple[str, int]] = []
    try:
        for name in names:
            full = os.path.join(directory, name)
            # O_NONBLOCK: a FIFO put in a file's place between the listing and the open must not
            # block the open; it is cleared again for the regular file the daemon reads.
            fd = os.open(full, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
            opened.append((name, fd))
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise CheckpointError("checkpoint file %s is not a regular file" % full)
            os.set_blocking(fd, True)
        return opened
    except BaseException:
        for _, fd in opened:
            os.close(fd)
        raise


def deposit(socket_path: str, files: Sequence[Tuple[str, int]],
            timeout: Optional[float] = 30.0, protos: Optional[Protos] = None) -> str:
    """Deposits open checkpoint files on the shard socket: one frame ShardFdRequest
    {checkpoint_files: names} whose first bytes carry the descriptors (same order) as
    SCM_RIGHTS; returns ShardFdReply.checkpoint_token. The descriptors stay the caller's (the
    daemon holds its own copies). Raises ShardError when the daemon refuses (INVALID_ARGUMENT,
    RESOURCE_EXHAUSTED: 64 deposits per uid), ValueError for no files, too many, a name with
    "/" or a frame over the limit, OSError / TimeoutError as fetch()."""
    protos = protos or default_protos()
    files = list(files)
    if not 1 <= len(files) <= MAX_CHECKPOINT_FILES:
        raise ValueError("between 1 and %d checkpoint files, not %d"
                         % (MAX_CHECKPOINT_FILES, len(files)))
    for name, _ in files:
        if not name or "/" in name:
            raise ValueError("checkpoint file name %r is not a base name" % name)
    req = protos.cls("familyd.v1.ShardFdRequest")()
    req.checkpoint_files.extend(name for name, _ in files)
    payload = req.SerializeToString()
    if len(payload) > MAX_FRAME:
        raise ValueError("deposit of %d bytes exceeds the %d-byte frame limit"
                         % (len(payload), MAX_FRAME))
    frame = struct.pack("<I", len(payload)) + payload
    rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd for _, fd in files]))]

    deadline = None if timeout is None else time.monotonic() + timeout
    received: List[int] = []
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(socket_path)
        # One sendmsg: the descriptors ride with the frame's first bytes; what a short send left
        # follows without them.
        sent = sock.sendmsg([frame], rights)
        if sent < len(frame):
            sock.sendall(frame[sent:])
        (length,) = struct.unpack("<I", _recv_exact(sock, 4, received, deadline))
        if length > MAX_FRAME:
            raise ValueError("shard socket: reply frame of %d bytes" % length)
        reply = protos.cls("familyd.v1.ShardFdReply").FromString(
            _recv_exact(sock, length, received, deadline))
        if reply.code != 0:
            raise ShardError(reply.code, reply.message)
        if received:
            raise ValueError("shard socket: %d descriptors in a deposit's reply" % len(received))
        if not reply.checkpoint_token:
            raise ValueError("shard socket: a deposit's reply without a checkpoint token")
        return str(reply.checkpoint_token)
    finally:
        for fd in received:
            try:
                os.close(fd)
            except OSError:
                pass
        sock.close()


def deposit_checkpoint(socket_path: str, path: PathLike, timeout: Optional[float] = 30.0,
                       protos: Optional[Protos] = None) -> str:
    """Opens the checkpoint at path (open_checkpoint: a safetensors file, or a directory's index
    and .safetensors files) and deposits it (deposit()); its checkpoint token. The descriptors
    are closed here once the daemon answered."""
    files = open_checkpoint(path)
    try:
        return deposit(socket_path, files, timeout=timeout, protos=protos)
    finally:
        for _, fd in files:
            os.close(fd)
