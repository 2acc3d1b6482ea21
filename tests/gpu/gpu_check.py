#!/usr/bin/env python3
"""familyd's GPU shards on a real GPU: the GPU check (tests/gpu/README.md).

Run by run.sh from a bundle (pack.sh) with the GPU machine's own Python (torch with CUDA,
grpcio). It starts familyd from the bundle, materialises 2 ranks of a mesh in GPU memory (one
daemon over two GPUs, or, on a machine with one GPU, two daemons of one cluster, each with
that GPU), imports the shards in this second process (the Python module: the driver,
__cuda_array_interface__, torch) and in a third (the C client, shard-import-probe), checks
every byte against a host-memory daemon's build of the same family, seed and mesh, for every
init kind and dtype, through the fill kernel and through host staging, and measures the fill
bandwidth against cudaMemset in the same run. Results: OUT/gpu-check.json and a summary.

--dry-run: the same against the tests' fake driver (run.sh sets it up), with smaller sizes;
torch checks are skipped when torch has no CUDA (Debian's), and so is cudaMemset.
"""

import argparse
import ctypes
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback

ARGS = None
BUNDLE = None
RESULTS = []
DAEMONS = []
CHECK_CONFIG = {"rows": 24, "lo": -0.25, "hi": 3.0}
DTYPES = ("float32", "bfloat16", "float16")


def log(msg):
    print("gpu-check: %s" % msg, flush=True)


def record(name, ok, detail="", **extra):
    """ok: True, False, or None for skipped."""
    RESULTS.append(dict(name=name, ok=ok, detail=detail, **extra))
    word = {True: "PASS", False: "FAIL", None: "SKIP"}[ok]
    log("%s %s%s" % (word, name, (": " + detail) if detail else ""))


def setup_python_path():
    sys.path.insert(0, os.path.join(BUNDLE, "python"))
    try:
        import google.protobuf  # noqa: F401
    except ImportError:
        os.environ["PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"] = "python"
        sys.path.append(os.path.join(BUNDLE, "python-fallback"))
        log("this Python has no protobuf: using the bundle's pure-Python one")


# ---- daemons ------------------------------------------------------------------------------

def free_port():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def child_env(extra=None):
    env = dict(os.environ)
    lib = os.environ.get("FAMILYD_GPU_LD_LIBRARY_PATH", os.path.join(BUNDLE, "lib"))
    env["LD_LIBRARY_PATH"] = lib + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH")
                                    else "")
    env.pop("PYTHONPATH", None)
    for k, v in (extra or {}).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = str(v)
    return env


def launcher():
    return os.environ.get("FAMILYD_GPU_LAUNCHER", "").split()


class Daemon:
    def __init__(self, name, args=(), env=None):
        self.name = name
        self.dir = tempfile.mkdtemp(prefix="fd-gpu-%s-" % name, dir="/tmp")
        self.socket = os.path.join(self.dir, "familyd.sock")
        self.args = list(args)
        self.env = env or {}
        self.proc = None
        self.client = None
        self.log_path = os.path.join(ARGS.out, "familyd-%s.log" % name)

    def start(self, timeout=60):
        import familyd

        argv = launcher() + [os.path.join(BUNDLE, "bin", "familyd"), "--socket", self.socket,
                             "--registry", os.path.join(BUNDLE, "registry"),
                             "--node-name", self.name] + self.args
        self.logf = open(self.log_path, "wb")
        self.proc = subprocess.Popen(argv, stdout=self.logf, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=child_env(self.env))
        DAEMONS.append(self)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("familyd %s exited with %d:\n%s" % (
                    self.name, self.proc.returncode, self.output()[-3000:]))
            if os.path.exists(self.socket):
                try:
                    c = familyd.Client(self.socket, timeout=5)
                    c.topology()
                    self.client = c
                    return self
                except Exception:
                    pass
            time.sleep(0.1)
        raise RuntimeError("familyd %s not serving within %d s:\n%s" % (
            self.name, timeout, self.output()[-3000:]))

    def output(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def stop(self):
        if self.client:
            self.client.close()
            self.client = None
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        rc = self.proc.returncode if self.proc else None
        shutil.rmtree(self.dir, ignore_errors=True)
        return rc


def gpu_count():
    """CUDA GPUs this process sees, through the driver familyd loads too."""
    path = os.environ.get("FAMILYD_CUDA_DRIVER") or "libcuda.so.1"
    lib = ctypes.CDLL(path)
    if lib.cuInit(0) != 0:
        raise RuntimeError("cuInit failed")
    n = ctypes.c_int()
    if lib.cuDeviceGetCount(ctypes.byref(n)) != 0:
        raise RuntimeError("cuDeviceGetCount failed")
    version = ctypes.c_int()
    if hasattr(lib, "cuDriverGetVersion") and lib.cuDriverGetVersion(ctypes.byref(version)) == 0:
        log("CUDA driver API version %d.%d" % (version.value // 1000, version.value % 1000 // 10))
    return n.value


class GpuSide:
    """Where the 2 GPU ranks live: one daemon over 2 GPUs, or 2 daemons over 1 GPU."""

    def __init__(self, tag, env=None):
        self.tag = tag
        self.env = env or {}
        self.daemons = []

    def start(self, n_gpus):
        if n_gpus >= 2:
            self.daemons = [Daemon("%s" % self.tag, env=self.env).start()]
        else:
            pa, pb = free_port(), free_port()
            a = Daemon("%s-a" % self.tag, ["--node-rank", "0", "--listen", "127.0.0.1:%d" % pa,
                                           "--heartbeat-ms", "200"], self.env).start()
            b = Daemon("%s-b" % self.tag, ["--node-rank", "1", "--listen", "127.0.0.1:%d" % pb,
                                           "--peers", "127.0.0.1:%d" % pa,
                                           "--heartbeat-ms", "200"], self.env).start()
            self.daemons = [a, b]
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                views = [d.client.topology() for d in self.daemons]
                if all(v.world_size == 2 and all(n.state == "up" for n in v.nodes)
                       for v in views):
                    break
                time.sleep(0.1)
            else:
                raise RuntimeError("the two daemons did not agree on a world of 2 ranks")
        return self

    def mesh_ids(self):
        ids = [d.client.create_mesh({"tp": 2}, ranks=[0, 1]).mesh_id for d in self.daemons]
        assert len(set(ids)) == 1, ids
        return ids[0]

    def build(self, family, config, dtype, seed, map_shards=True):
        """rank -> (Build object, its RankShard message) over every daemon of this side."""
        mesh_id = self.mesh_ids()
        builds = []
        for d in self.daemons:
            builds.append(d.client.build(family, config=config, mesh_id=mesh_id, dtype=dtype,
                                         seed=seed, map_shards=map_shards))
        return builds

    def stop(self):
        for d in self.daemons:
            d.stop()


# ---- checks -------------------------------------------------------------------------------

def host_reference(ref, family, config, dtype, seed):
    """rank -> bytes of the host daemon's build (its shard's size_bytes)."""
    from familyd import shard as fshard
    import mmap

    mesh_id = ref.client.create_mesh({"tp": 2}, ranks=[0, 1]).mesh_id
    b = ref.client.build(family, config=config, mesh_id=mesh_id, dtype=dtype, seed=seed,
                         map_shards=False)
    out = {}
    local = [s for s in b.message.shards if s.token]
    handles = fshard.fetch(b.shard_socket, [s.token for s in local], protos=ref.client.protos)
    for s, h in zip(local, handles):
        mm = mmap.mmap(h.fd, h.size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        out[s.rank] = bytes(mm[:s.size_bytes])
        mm.close()
        h.close()
    b.release()
    return out


def torch_cuda():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def check_build(side, ref_bytes, dtype, label):
    """The GPU side's build through the Python module against the host bytes."""
    import familyd

    torch = torch_cuda()
    builds = side.build("gpucheck", CHECK_CONFIG, dtype, 7)
    bad = []
    seen = []
    try:
        for b in builds:
            for rank, rt in b.ranks.items():
                seen.append(rank)
                msg = [s for s in b.message.shards if s.rank == rank][0]
                if not isinstance(rt, familyd.DeviceRankTensors) or msg.device_kind != "cuda":
                    bad.append("rank %d is not in GPU memory (%s)" % (rank, msg.device_kind))
                    continue
                whole = rt.shard.read(0, rt.shard.size)
                if whole[:msg.size_bytes] != ref_bytes[rank]:
                    bad.append("rank %d: bytes differ from host memory" % rank)
                if whole[msg.size_bytes:].count(0) != rt.shard.size - msg.size_bytes:
                    bad.append("rank %d: allocation padding not zero" % rank)
                if torch is not None:
                    try:
                        tensors = rt.torch()
                    except Exception as e:
                        bad.append("rank %d: torch: %s: %s" % (rank, type(e).__name__, e))
                        continue
                    ref = torch.frombuffer(bytearray(ref_bytes[rank]),
                                           dtype=torch.uint8).to("cuda:%d" % rt.device)
                    for sl in rt.slices:
                        t = tensors[sl.parameter]
                        if sl.byte_length == 0:
                            continue
                        if t.data_ptr() != rt.shard.pointer + sl.byte_offset:
                            bad.append("rank %d %s: torch copied" % (rank, sl.parameter))
                        got = t.contiguous().view(-1).view(torch.uint8)
                        want = ref[sl.byte_offset:sl.byte_offset + sl.byte_length]
                        if not torch.equal(got, want):
                            bad.append("rank %d %s: torch sees other bytes" % (rank, sl.parameter))
        if sorted(seen) != [0, 1]:
            bad.append("ranks mapped: %s" % sorted(seen))
    finally:
        for b in builds:
            b.release()
            b.close()
    record("%s %s bit-exact (Python module%s)" % (label, dtype, ", torch" if torch else ""),
           not bad, "; ".join(bad))


def check_c_probe(side, ref_bytes, dtype):
    """The C client in a third process: libfamilyd + the driver, cuMemcpyDtoH, files."""
    builds = side.build("gpucheck", CHECK_CONFIG, dtype, 7, map_shards=False)
    bad = []
    try:
        for d, b in zip(side.daemons, builds):
            outdir = tempfile.mkdtemp(prefix="probe-", dir=ARGS.out)
            p = subprocess.run(launcher() + [os.path.join(BUNDLE, "bin", "shard-import-probe"),
                                             d.socket, b.id, outdir],
                               capture_output=True, text=True, timeout=120, env=child_env())
            if p.returncode != 0:
                bad.append("probe: %s %s" % (p.stdout.strip(), p.stderr.strip()[-500:]))
                continue
            for line in p.stdout.splitlines():
                m = re.match(r"rank (\d+) kind (\S+) device (\d+) size (\d+) allocation (\d+)", line)
                if not m:
                    continue
                rank, kind, size = int(m.group(1)), m.group(2), int(m.group(4))
                with open(os.path.join(outdir, "rank-%d.bin" % rank), "rb") as f:
                    data = f.read()
                if kind != "cuda" or data[:size] != ref_bytes[rank]:
                    bad.append("rank %d (%s): bytes differ" % (rank, kind))
                log("probe: %s" % line)
            shutil.rmtree(outdir, ignore_errors=True)
    finally:
        for b in builds:
            b.release()
    record("C client %s bit-exact (shard-import-probe)" % dtype, not bad, "; ".join(bad))


def fill_log(side):
    text = "".join(d.output() for d in side.daemons)
    m = re.search(r"cuda:\d+ holds shards \(([^)]*)\)", text)
    return m.group(1) if m else "(no CUDA line in the log)"


def timed_build(side, n_rows, seed):
    """(seconds, GPU bytes) of one Build of gpubw on the first daemon (its local ranks)."""
    d = side.daemons[0]
    mesh_id = side.mesh_ids()
    t0 = time.monotonic()
    b = d.client.build("gpubw", config={"n": n_rows}, mesh_id=mesh_id, dtype="float32",
                       seed=1, map_shards=False)
    dt = time.monotonic() - t0
    nbytes = sum(s.size_bytes for s in b.message.shards if s.token)
    b.release()
    return dt, nbytes


def memset_bandwidth(nbytes):
    """cudaMemset of nbytes on cuda:0 (CUDA runtime, as torch loaded it; else the driver's
    cuMemsetD8), best of 3: GB/s, or None without torch on CUDA."""
    torch = torch_cuda()
    if torch is None:
        return None, "torch has no CUDA"
    buf = torch.empty(nbytes, dtype=torch.uint8, device="cuda:0")
    torch.cuda.synchronize()
    ptr = buf.data_ptr()
    how, fn, sync = None, None, None
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"):
        try:
            rt = ctypes.CDLL(name)
            fn = lambda: rt.cudaMemset(ctypes.c_void_p(ptr), 0, ctypes.c_size_t(nbytes))  # noqa
            sync = rt.cudaDeviceSynchronize
            how = "cudaMemset (%s)" % name
            break
        except OSError:
            continue
    if fn is None:
        drv = ctypes.CDLL(os.environ.get("FAMILYD_CUDA_DRIVER") or "libcuda.so.1")
        fn = lambda: drv.cuMemsetD8_v2(ctypes.c_ulonglong(ptr), 0, ctypes.c_size_t(nbytes))  # noqa
        sync = torch.cuda.synchronize
        how = "cuMemsetD8 (driver)"
    best = None
    for _ in range(3):
        t0 = time.monotonic()
        r = fn()
        sync()
        dt = time.monotonic() - t0
        if r not in (0, None):
            return None, "%s failed: %r" % (how, r)
        best = dt if best is None else min(best, dt)
    del buf
    return nbytes / best / 1e9, how


def main():
    global ARGS, BUNDLE
    ap = argparse.ArgumentParser()
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--size-mib", type=int, default=None,
                    help="bytes per rank for the bandwidth builds (default 2048; dry run 8)")
    ARGS = ap.parse_args()
    BUNDLE = os.path.abspath(ARGS.bundle)
    size_mib = ARGS.size_mib or (8 if ARGS.dry_run else 2048)
    setup_python_path()
    t_start = time.monotonic()

    log("python %s on %s; dry run: %s" % (platform.python_version(), platform.node(),
                                          ARGS.dry_run))
    torch = None
    try:
        import torch as _t
        torch = _t
        log("torch %s, CUDA available: %s" % (torch.__version__, torch.cuda.is_available()))
        if torch.cuda.is_available():
            torch.cuda.init()
            log("torch sees %d GPU(s): %s" % (torch.cuda.device_count(),
                                              torch.cuda.get_device_name(0)))
    except ImportError:
        log("no torch in this Python")
    if shutil.which("nvidia-smi") and not ARGS.dry_run:
        p = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                            "--format=csv,noheader"], capture_output=True, text=True)
        log("nvidia-smi: %s" % p.stdout.strip())

    n_gpus = gpu_count()
    log("GPUs through the driver: %d" % n_gpus)
    if n_gpus < 1:
        record("a GPU is present", False, "the driver reports none")
        return finish(t_start)

    ref = Daemon("host-ref", ["--host-devices", "2"]).start()
    kernel = GpuSide("gpu").start(n_gpus)
    staged = GpuSide("gpu-staged", {"FAMILYD_CUDA_FILL": "host"}).start(n_gpus)

    topo = [d.client.topology() for d in kernel.daemons]
    kinds = sorted({dev.kind for t in topo for n in t.nodes for dev in n.devices})
    record("topology lists the GPUs", kinds == ["cuda"] and topo[0].world_size == 2,
           "kinds %s, world size %d, %d daemon(s)" % (kinds, topo[0].world_size,
                                                       len(kernel.daemons)))
    how = fill_log(kernel)
    record("the fill kernel loads", "fill kernel" in how, how)
    record("host staging when asked", "FAMILYD_CUDA_FILL=host" in fill_log(staged),
           fill_log(staged))

    refs = {dt: host_reference(ref, "gpucheck", CHECK_CONFIG, dt, 7) for dt in DTYPES}
    for dt in DTYPES:
        check_build(kernel, refs[dt], dt, "kernel")
        check_build(staged, refs[dt], dt, "staging")
    check_c_probe(kernel, refs["float32"], "float32")
    check_c_probe(kernel, refs["bfloat16"], "bfloat16")

    # Fill bandwidth: one Build of a rank of size_mib MiB (uniform, float32), kernel and
    # staging, against cudaMemset of the same bytes; host memory for scale.
    rows = size_mib * 256
    timed_build(kernel, 256, 2)    # warm: first launch, first allocation
    t_k, nbytes = timed_build(kernel, rows, 3)
    t_s, _ = timed_build(staged, rows, 3)
    t_h, _ = timed_build_host(ref, rows)
    memset, how = memset_bandwidth(nbytes)
    bw = {
        "bytes_per_build": nbytes,
        "build_kernel_gbs": nbytes / t_k / 1e9,
        "build_staging_gbs": nbytes / t_s / 1e9,
        "build_host_memory_gbs": nbytes / t_h / 1e9,
        "memset_gbs": memset,
        "memset_how": how,
    }
    record("fill bandwidth measured", True,
           "Build of %d MiB uniform float32: kernel %.1f GB/s, staging %.1f GB/s, host memory "
           "%.1f GB/s; %s" % (nbytes >> 20, bw["build_kernel_gbs"], bw["build_staging_gbs"],
                              bw["build_host_memory_gbs"],
                              ("%s %.1f GB/s" % (how, memset)) if memset else
                              "cudaMemset skipped: %s" % how),
           bandwidth=bw)

    for side in (kernel, staged):
        side.stop()
    rc = ref.stop()
    for d in DAEMONS:
        if d.proc.returncode not in (0, None):
            record("familyd %s exits cleanly" % d.name, False, "status %s" % d.proc.returncode)
    record("daemons stopped cleanly", rc == 0 and all(d.proc.returncode == 0 for d in DAEMONS),
           "")
    return finish(t_start)


def timed_build_host(ref, rows):
    mesh_id = ref.client.create_mesh({"tp": 2}, ranks=[0, 1]).mesh_id
    t0 = time.monotonic()
    b = ref.client.build("gpubw", config={"n": rows}, mesh_id=mesh_id, dtype="float32", seed=3,
                         ranks=[0], map_shards=False)
    dt = time.monotonic() - t0
    nbytes = sum(s.size_bytes for s in b.message.shards if s.token)
    b.release()
    return dt, nbytes


def finish(t_start):
    elapsed = time.monotonic() - t_start
    failed = [r for r in RESULTS if r["ok"] is False]
    summary = {"dry_run": ARGS.dry_run, "seconds": round(elapsed, 1), "passed": not failed,
               "results": RESULTS}
    with open(os.path.join(ARGS.out, "gpu-check.json"), "w") as f:
        json.dump(summary, f, indent=2)
    log("%d checks, %d failed, %.1f s; %s" % (len(RESULTS), len(failed), elapsed,
                                              os.path.join(ARGS.out, "gpu-check.json")))
    return 0 if not failed else 1


if __name__ == "__main__":
    try:
        status = main()
    except Exception:
        traceback.print_exc()
        record("the check ran to its end", False, traceback.format_exc().splitlines()[-1])
        for d in DAEMONS:
            log("familyd %s log tail:\n%s" % (d.name, d.output()[-2000:]))
        status = finish(time.monotonic()) if ARGS else 1
    finally:
        for d in DAEMONS:
            try:
                d.stop()
            except Exception:
                pass
    sys.exit(status)
