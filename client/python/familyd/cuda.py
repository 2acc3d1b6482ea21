"""GPU shards: a "cuda" descriptor from the shard socket, imported through the CUDA driver.

The driver is loaded at run time with ctypes ($FAMILYD_CUDA_DRIVER, else libcuda.so.1), as
familyd and libfamilyd load it; nothing here needs CUDA at import time. An import retains the
device's primary context (the one torch's CUDA runtime uses, so pointers are valid in torch),
makes it current on the calling thread, then cuMemImportFromShareableHandle, cuMemAddressReserve,
cuMemMap and cuMemSetAccess (read-only unless writable; read-write where the driver has no
read-only device mappings: .writable says which). GPU shards cannot be sealed and their
descriptors carry no access mode, so read-only is advisory.

Without a usable driver every entry point raises DeviceMemoryError saying that this client
cannot map device memory, and why.
"""

import ctypes
import os
import threading
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

_HANDLE_TYPE_POSIX_FD = 1
_LOCATION_DEVICE = 1
_ACCESS_READ = 1
_ACCESS_READWRITE = 3

# Layout dtype -> __cuda_array_interface__ typestr. bfloat16 has none: its bits are uint16.
TYPESTRS = {"float32": "<f4", "float16": "<f2", "bfloat16": "<u2"}
ITEMSIZES = {"float32": 4, "float16": 2, "bfloat16": 2}


class DeviceMemoryError(RuntimeError):
    """This client cannot map a GPU shard (no CUDA driver, a driver failure, a torch without
    CUDA); the message says which."""


class _MemLocation(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _MemAccessDesc(ctypes.Structure):
    _fields_ = [("location", _MemLocation), ("flags", ctypes.c_int)]


class _Driver:
    def __init__(self) -> None:
        path = os.environ.get("FAMILYD_CUDA_DRIVER") or "libcuda.so.1"
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            raise DeviceMemoryError("this client cannot map device memory: the CUDA driver "
                                    "(%s) is not installed" % path) from None
        u64, c_int, c_size = ctypes.c_ulonglong, ctypes.c_int, ctypes.c_size_t
        p = ctypes.POINTER
        sigs = {
            "cuInit": [ctypes.c_uint],
            "cuGetErrorString": [c_int, p(ctypes.c_char_p)],
            "cuDeviceGet": [p(c_int), c_int],
            "cuDevicePrimaryCtxRetain": [p(ctypes.c_void_p), c_int],
            "cuDevicePrimaryCtxRelease_v2": [c_int],
            "cuCtxSetCurrent": [ctypes.c_void_p],
            "cuMemImportFromShareableHandle": [p(u64), ctypes.c_void_p, c_int],
            "cuMemRelease": [u64],
            "cuMemAddressReserve": [p(u64), c_size, c_size, u64, u64],
            "cuMemAddressFree": [u64, c_size],
            "cuMemMap": [u64, c_size, c_size, u64, u64],
            "cuMemUnmap": [u64, c_size],
            "cuMemSetAccess": [u64, c_size, p(_MemAccessDesc), c_size],
            "cuMemcpyDtoH_v2": [ctypes.c_void_p, u64, c_size],
        }
        self.fn: Dict[str, Any] = {}
        for name, args in sigs.items():
            try:
                f = getattr(lib, name)
            except AttributeError:
                raise DeviceMemoryError("this client cannot map device memory: the CUDA driver "
                                        "lacks %s" % name) from None
            f.argtypes = args
            f.restype = c_int
            self.fn[name] = f
        self.lib = lib
        r = self.fn["cuInit"](0)
        if r != 0:
            raise DeviceMemoryError("this client cannot map device memory: cuInit failed: %s "
                                    "(CUresult %d)" % (self.text(r), r))

    def text(self, r: int) -> str:
        s = ctypes.c_char_p()
        if self.fn["cuGetErrorString"](r, ctypes.byref(s)) != 0 or not s.value:
            return "unknown CUDA error"
        return s.value.decode("utf-8", "replace")

    def call(self, name: str, device: int, *args: Any) -> None:
        r = self.fn[name](*args)
        if r != 0:
            raise DeviceMemoryError("%s on cuda:%d failed: %s (CUresult %d)"
                                    % (name, device, self.text(r), r))


_driver: Optional[_Driver] = None
_driver_error: Optional[DeviceMemoryError] = None
_driver_lock = threading.Lock()


def driver() -> _Driver:
    """The loaded driver; DeviceMemoryError (the same one every time) when there is none."""
    global _driver, _driver_error
    with _driver_lock:
        if _driver is None and _driver_error is None:
            try:
                _driver = _Driver()
            except DeviceMemoryError as e:
                _driver_error = e
        if _driver_error is not None or _driver is None:
            raise DeviceMemoryError(str(_driver_error))
        return _driver


def available() -> Tuple[bool, str]:
    """(True, "") when this process can import GPU shards, else (False, why)."""
    try:
        driver()
        return True, ""
    except DeviceMemoryError as e:
        return False, str(e)


class DeviceShard:
    """A GPU shard mapped into this process: .pointer (a CUdeviceptr in the device's primary
    context), .size (the allocation's bytes), .device (the CUDA ordinal), .writable.

    The caller's descriptor is not kept (close it at once). close() unmaps and releases; the
    memory itself lives while any process maps it."""

    def __init__(self, fd: int, size: int, device: int, writable: bool = False) -> None:
        d = driver()
        self.device = int(device)
        self.size = int(size)
        self.pointer = 0
        self.writable = bool(writable)
        self._ctx: Optional[ctypes.c_void_p] = None
        self._dev = ctypes.c_int()
        self._handle: Optional[ctypes.c_ulonglong] = None
        self._reserved = False
        self._mapped = False
        try:
            d.call("cuDeviceGet", self.device, ctypes.byref(self._dev), self.device)
            ctx = ctypes.c_void_p()
            d.call("cuDevicePrimaryCtxRetain", self.device, ctypes.byref(ctx), self._dev)
            self._ctx = ctx
            d.call("cuCtxSetCurrent", self.device, self._ctx)
            handle = ctypes.c_ulonglong()
            d.call("cuMemImportFromShareableHandle", self.device, ctypes.byref(handle),
                   ctypes.c_void_p(int(fd)), _HANDLE_TYPE_POSIX_FD)
            self._handle = handle
            ptr = ctypes.c_ulonglong()
            d.call("cuMemAddressReserve", self.device, ctypes.byref(ptr), self.size, 0, 0, 0)
            self.pointer = ptr.value
            self._reserved = True
            d.call("cuMemMap", self.device, self.pointer, self.size, 0, self._handle, 0)
            self._mapped = True
            desc = _MemAccessDesc(_MemLocation(_LOCATION_DEVICE, self.device),
                                  _ACCESS_READWRITE if self.writable else _ACCESS_READ)
            r = d.fn["cuMemSetAccess"](self.pointer, self.size, ctypes.byref(desc), 1)
            if r != 0 and not self.writable:
                # No read-only device mappings on this driver: read-write, and said so.
                desc.flags = _ACCESS_READWRITE
                r = d.fn["cuMemSetAccess"](self.pointer, self.size, ctypes.byref(desc), 1)
                self.writable = r == 0
            if r != 0:
                raise DeviceMemoryError("cuMemSetAccess on cuda:%d failed: %s (CUresult %d)"
                                        % (self.device, d.text(r), r))
        except BaseException:
            self.close()
            raise

    def read(self, offset: int = 0, n: Optional[int] = None) -> bytes:
        """n bytes at offset, copied to host memory (cuMemcpyDtoH), as bytes."""
        n = self.size - offset if n is None else int(n)
        if offset < 0 or n < 0 or offset + n > self.size:
            raise ValueError("bytes [%d, %d) are outside the shard's %d" % (offset, offset + n,
                                                                            self.size))
        buf = ctypes.create_string_buffer(n)
        d = driver()
        d.call("cuCtxSetCurrent", self.device, self._ctx)
        d.call("cuMemcpyDtoH_v2", self.device, buf, self.pointer + offset, n)
        return buf.raw

    def close(self) -> None:
        """Unmaps the shard and releases the import and the context (once)."""
        d = _driver
        if d is None:
            return
        if self._ctx is not None:
            d.fn["cuCtxSetCurrent"](self._ctx)
        if self._mapped:
            d.fn["cuMemUnmap"](self.pointer, self.size)
            self._mapped = False
        if self._reserved:
            d.fn["cuMemAddressFree"](self.pointer, self.size)
            self._reserved = False
        if self._handle is not None:
            d.fn["cuMemRelease"](self._handle)
            self._handle = None
        if self._ctx is not None:
            d.fn["cuDevicePrimaryCtxRelease_v2"](self._dev)
            self._ctx = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]:
        """The whole shard as bytes (version 3): torch.as_tensor(shard, device="cuda:N")."""
        return {"shape": (self.size,), "typestr": "|u1", "data": (self.pointer, not self.writable),
                "version": 3, "strides": None}


class DeviceArray:
    """One parameter's slice in a GPU shard: no copy, a __cuda_array_interface__ (version 3) for
    CuPy, Numba or torch.as_tensor. bfloat16 is exposed as its uint16 bits ('<u2').
    .numpy() copies it to host memory (bfloat16 as uint16), for checks and CPU-only code."""

    def __init__(self, shard: DeviceShard, offset: int, nbytes: int, shape: Sequence[int],
                 dtype: str) -> None:
        self.shard = shard      # keeps the mapping alive
        self.offset = offset
        self.nbytes = nbytes
        self.shape = tuple(shape)
        self.dtype = dtype

    @property
    def pointer(self) -> int:
        """The CUdeviceptr of the parameter's first byte."""
        return self.shard.pointer + self.offset

    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]:
        return {"shape": self.shape, "typestr": TYPESTRS[self.dtype],
                "data": (self.pointer, not self.shard.writable), "version": 3, "strides": None}

    def numpy(self) -> Any:
        """A numpy array copied from the GPU (bfloat16 as its uint16 bits)."""
        import numpy as np

        raw = self.shard.read(self.offset, self.nbytes)
        host = {"float32": "float32", "float16": "float16", "bfloat16": "uint16"}[self.dtype]
        return np.frombuffer(raw, dtype=host).reshape(self.shape)

    def __repr__(self) -> str:
        return "DeviceArray(cuda:%d, %s, %s)" % (self.shard.device, self.dtype, self.shape)


def torch_tensors(shard: DeviceShard, arrays: Mapping[str, "DeviceArray"]) -> Dict[str, Any]:
    """name -> torch tensor on the shard's GPU, over the same memory (no copy): one uint8
    tensor over the shard through __cuda_array_interface__, then a view per parameter.
    DeviceMemoryError when this torch has no CUDA."""
    import torch

    if not torch.cuda.is_available():
        raise DeviceMemoryError("this client cannot map device memory into torch: torch %s has "
                                "no CUDA (a GPU shard needs a CUDA build of torch; .numpy() "
                                "copies to host memory)" % torch.__version__)
    tdtypes = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
    whole = torch.as_tensor(shard, device="cuda:%d" % shard.device)
    out: Dict[str, Any] = {}
    for name, a in arrays.items():

        if a.nbytes == 0:
            out[name] = torch.empty(a.shape, dtype=tdtypes[a.dtype],
                                    device="cuda:%d" % shard.device)
            continue
        out[name] = whole[a.offset:a.offset + a.nbytes].view(tdtypes[a.dtype]).view(a.shape)
    return out
