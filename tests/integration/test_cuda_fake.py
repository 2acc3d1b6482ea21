#!/usr/bin/python3
"""GPU shards end to end, without a GPU: the real familyd with the tests' fake CUDA driver
(FAMILYD_CUDA_DRIVER; tests/fake-cuda/fake-libcuda.c keeps the driver API's rules over host
memory), no --host-devices, so the node's devices are the fake's two GPUs.

What is checked, against a host-memory daemon (--host-devices 2) building the same family,
seed and mesh as the reference:
  - ranks go to the GPUs the topology assigns (rank r on cuda:r), Build/GetBuild say so
    (device_kind, local_device, allocation_bytes rounded up to the 2 MiB granularity);
  - the shard socket hands out the driver's exported descriptors with device kinds, devices
    and the allocation sizes;
  - a second process imports them through libfamilyd (tests/fake-cuda/shard-import-probe)
    and through the Python module, and the bytes equal the host reference bit for bit, for
    every init kind and dtype, whether the fill kernel (the fake runs launches on the CPU
    through the kernel's own element code) or host staging wrote them; padding is zero;
  - a driver that fails at cuMemCreate fails the Build clearly, keeps nothing (the fake
    counts live allocations), and the daemon serves on; GPUs without virtual memory
    management are refused before anything is reserved;
  - each GPU's budget (its memory less an eighth) is separate from --shm-budget;
  - GPU builds are never kept across restarts, and a record claiming a GPU shard is dropped.
"""

import os
import re
import shutil
import struct
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402
import shard_client as SC  # noqa: E402
import test_durability_util as U  # noqa: E402
from fake_manager import FakeManager  # noqa: E402

PYDIR = os.path.join(H.SOURCE_ROOT, "client", "python")
sys.path.insert(0, PYDIR)

FAKE = os.environ.get("FAKE_LIBCUDA") or H._default_build_file("tests", "fake-cuda",
                                                               "libfake-libcuda.so")
PROBE = os.environ.get("FAMILYD_SHARD_IMPORT_PROBE") or H._default_build_file(
    "tests", "fake-cuda", "shard-import-probe")
MiB = 1 << 20
GRANULARITY = 2 * MiB

EXTRA_YAML = """\
families:
  - name: gpucheck
    baseline: itest.GpuCheck
    default_variant: plain
    parallel_axis: tp
    variants:
      plain:
        constructor: itest.GpuCheckPlain
        accepts: [config, module, module_fqn, context]
    parameters:
      u:
        shape: [rows, 37]
        placements: {tp: shard(1)}
        init: {uniform: {low: -1, high: 1}}
      u2:
        shape: [rows, 3, 5]
        placements: {tp: shard(0)}
        init: {uniform: {low: lo, high: hi}}
      c:
        shape: [rows, 3]
        init: {constant: {value: 1.5}}
      o:
        shape: [7]
        init: ones
      z:
        shape: [2, 2]
      nrm:
        shape: [rows, 16]
        placements: {tp: shard(0)}
        init: {normal: {mean: 0.5, std: 2}}
  - name: gpubig
    baseline: itest.GpuBig
    default_variant: plain
    parallel_axis: tp
    variants:
      plain:
        constructor: itest.GpuBigPlain
        accepts: [config, context]
    parameters:
      w:
        shape: [n, 1024]
        placements: {tp: shard(0)}
        init: {constant: {value: 0.5}}
"""
CHECK_CONFIG = {"rows": 12, "lo": -0.25, "hi": 3.0}
TP2 = {"device_mesh": [{"name": "tp", "size": 2}]}

TMP = None
REG = None
P = None
G = None   # the fake's two GPUs, fill kernel
R = None   # the host reference: --host-devices 2


class EnvDaemon(H.Daemon):
    """A Daemon whose process gets extra environment variables (None: unset)."""

    def __init__(self, env=None, **kw):
        kw.setdefault("registry", REG)
        kw.setdefault("protos", P)
        super().__init__(**kw)
        self.env = dict(env or {})
        self.state_file = os.path.join(self.tmpdir, "fake-cuda-%d.state" % id(self))
        self.env.setdefault("FAKE_CUDA_STATE_FILE", self.state_file)

    def spawn(self):
        saved = {k: os.environ.get(k) for k in self.env}
        for k, v in self.env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        try:
            return super().spawn()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def fake(self, what):
        """The fake driver's count of what the daemon holds (allocations, launches, ...)."""
        try:
            with open(self.state_file) as f:
                text = f.read()
        except OSError:
            return 0
        m = re.search(r"\b%s=(\d+)" % what, text)
        return int(m.group(1)) if m else 0


class ManagedGpuDaemon(EnvDaemon):
    """familyd under the fake service manager (NOTIFY_SOCKET: the fd store mode)."""

    def __init__(self, manager, env, **kw):
        super().__init__(env, host_devices=None, **kw)
        self.manager = manager
        self.shard_socket = os.path.join(self.tmpdir, "shard.sock")

    def spawn(self):
        with open(self.stdout_path, "ab") as out, open(self.stderr_path, "ab") as err:
            self.proc = self.manager.spawn(self.argv(), env=self.env, stdout=out, stderr=err,
                                           stdin=subprocess.DEVNULL)
        return self.proc


def gpu_env(**kw):
    env = {"FAMILYD_CUDA_DRIVER": FAKE, "FAKE_CUDA_DEVICES": "2"}
    env.update({k: (None if v is None else str(v)) for k, v in kw.items()})
    return env


def setUpModule():
    global TMP, REG, P, G, R
    if not os.path.exists(FAKE) or not os.path.exists(PROBE):
        raise unittest.SkipTest("the fake libcuda or the import probe was not built")
    P = H.Protos()
    TMP = H.short_tmpdir("fd-cuda-")
    REG = os.path.join(TMP, "registry")
    os.makedirs(REG)
    shutil.copy(os.path.join(H.CONFORMANCE, "registry", "families.yaml"),
                os.path.join(REG, "families.yaml"))
    with open(os.path.join(REG, "zz-gpu.yaml"), "w") as f:
        f.write(EXTRA_YAML)
    # This process imports GPU shards too (the Python module): the same fake driver.
    os.environ["FAMILYD_CUDA_DRIVER"] = FAKE
    os.environ["FAKE_CUDA_DEVICES"] = "2"
    # --build-grace-ms 0: a build the tests release is gone at once, and its GPU memory with it.
    G = EnvDaemon(gpu_env(), host_devices=None, extra_args=["--build-grace-ms", "0"])
    R = EnvDaemon({}, host_devices=2, extra_args=["--build-grace-ms", "0"])
    G.start()
    try:
        R.start()
    except BaseException:
        G.kill()
        G.cleanup()
        raise


def check_sanitizers(d):
    err = d.stderr()
    for marker in ("runtime error:", "Sanitizer"):
        if marker in err:
            raise AssertionError("familyd stderr has a sanitizer report:\n%s"
                                 % "\n".join(err.splitlines()[-40:]))


def tearDownModule():
    try:
        for d in (G, R):
            if d is not None:
                d.stop()
                check_sanitizers(d)
        # Every shard went back to the fake driver when the daemon stopped.
        if G is not None:
            assert G.fake("allocations") == 0, open(G.state_file).read()
            assert G.fake("contexts") == 0, open(G.state_file).read()
    finally:
        for d in (G, R):
            if d is not None:
                d.cleanup()
        if TMP:
            shutil.rmtree(TMP, ignore_errors=True)


def roundup(n, g=GRANULARITY):
    return (n + g - 1) // g * g


class Base(unittest.TestCase):
    def ok(self, res):
        self.assertEqual(res.code, "OK", "%r" % res)
        return res.reply

    def mesh(self, d, mesh=TP2):
        return self.ok(d.client.call("familyd.v1.MeshService/CreateMesh", mesh=mesh)).mesh_id

    def build(self, d, family="gpucheck", config=None, dtype="float32", seed=7, mesh=TP2,
              materialize=True, writable=False):
        mesh_id = self.mesh(d, mesh) if mesh else ""
        mat = {"dtype": dtype, "seed": seed} if materialize else None
        req = U.build_request(d.protos, family=family,
                              config=CHECK_CONFIG if config is None else config,
                              mesh_id=mesh_id, materialize=mat, writable=writable)
        return d.client.call("familyd.v1.FamilyService/Build", req)

    def built(self, d, **kw):
        return self.ok(self.build(d, **kw)).build

    def release(self, d, build):
        self.ok(d.client.call("familyd.v1.FamilyService/ReleaseBuild", build_id=build.build_id))

    def host_bytes(self, build):
        """rank -> the host reference's bytes (the shard's size_bytes), through the socket."""
        out = {}
        with SC.ShardClient(build.shard_socket, P) as sc:
            local = [s for s in build.shards if s.token]
            reply, fds = sc.request([s.token for s in local])
            self.assertEqual(reply.code, 0, reply.message)
            for s, fd in zip(local, fds):
                with open(fd, "rb", closefd=True) as f:
                    out[s.rank] = f.read(s.size_bytes)
        return out

    def probe(self, d, build, *options):
        """The C client in a second process: rank -> (line fields, whole allocation bytes)."""
        out = os.path.join(d.tmpdir, "probe-%s" % build.build_id)
        os.makedirs(out, exist_ok=True)
        p = subprocess.run([PROBE, d.socket, build.build_id, out] + list(options),
                           capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, FAMILYD_CUDA_DRIVER=FAKE))
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertIn("result ok", p.stdout)
        ranks = {}
        for line in p.stdout.splitlines():
            if not line.startswith("rank "):
                continue
            w = line.split()
            fields = dict(zip(w[0::2], w[1::2]))
            with open(os.path.join(out, "rank-%s.bin" % fields["rank"]), "rb") as f:
                ranks[int(fields["rank"])] = (fields, f.read())
        return ranks


class BuildAndHandout(Base):
    def test_ranks_on_the_topologys_gpus(self):
        topo = self.ok(G.client.call("familyd.v1.MeshService/GetTopology"))
        devs = topo.nodes[0].devices
        self.assertEqual([(x.kind, x.local_index) for x in devs], [("cuda", 0), ("cuda", 1)])

        b = self.built(G)
        self.assertEqual([(s.rank, s.device_kind, s.local_device) for s in b.shards],
                         [(0, "cuda", 0), (1, "cuda", 1)])
        for s in b.shards:
            self.assertTrue(s.token)
            self.assertGreater(s.size_bytes, 0)
            # The GPU's allocation granularity shows: 2 MiB for a shard of a few hundred bytes.
            self.assertEqual(s.allocation_bytes, roundup(s.size_bytes))
        got = self.ok(G.client.call("familyd.v1.FamilyService/GetBuild", build_id=b.build_id))
        self.assertEqual(list(got.shards), list(b.shards))
        self.assertIn("bytes in GPU memory", G.stderr())
        # GPU bytes are not host bytes: --shm-budget's count does not move.
        status = self.ok(G.client.call("familyd.v1.AdminService/GetStatus"))
        self.assertEqual(status.shm_bytes_in_use, 0)
        self.assertEqual(G.fake("allocations"), 2)
        self.release(G, b)
        self.assertEqual(G.fake("allocations"), 0)

        # The host daemon's ranks of the same build are host memory, no rounding.
        h = self.built(R)
        self.assertEqual([(s.device_kind, s.allocation_bytes) for s in h.shards],
                         [("host", s.size_bytes) for s in h.shards])
        self.release(R, h)

    def test_socket_hands_out_the_drivers_descriptors(self):
        b = self.built(G, writable=True)   # writable descriptors: a writable build's only
        try:
            for writable in (False, True):
                with SC.ShardClient(b.shard_socket, P) as sc:
                    reply, fds = sc.request([s.token for s in b.shards], writable=writable)
                    try:
                        self.assertEqual(reply.code, 0, reply.message)
                        self.assertEqual(list(reply.device_kinds), ["cuda", "cuda"])
                        self.assertEqual(list(reply.devices), [0, 1])
                        self.assertEqual(list(reply.sizes),
                                         [s.allocation_bytes for s in b.shards])
                        for dev, fd in enumerate(fds):
                            # The fake's exported allocation, not a memfd of familyd's own.
                            self.assertEqual(os.readlink("/proc/self/fd/%d" % fd),
                                             "/memfd:fake-cuda-dev%d (deleted)" % dev)
                            self.assertEqual(os.fstat(fd).st_size, reply.sizes[dev])
                    finally:
                        for fd in fds:
                            os.close(fd)
        finally:
            self.release(G, b)

    def test_c_client_private_copies_into_its_own_allocation(self):
        b = self.built(G, dtype="bfloat16", seed=13)
        want = {rank: data for rank, (_, data) in self.probe(G, b).items()}
        before = G.fake("allocations")
        got = self.probe(G, b, "--private")
        self.assertEqual(sorted(got), [0, 1])
        for rank, (fields, data) in got.items():
            # Its own allocation (read-write, at another address), the same bytes.
            self.assertEqual(fields["writable"], "1")
            self.assertEqual(data, want[rank], "rank %d: the private copy differs" % rank)
        # The copies went with the probe; the daemon's allocations stayed.
        self.assertEqual(G.fake("allocations"), before)
        self.release(G, b)

    def test_c_client_imports_bit_exact(self):
        for dtype in ("float32", "bfloat16", "float16"):
            with self.subTest(dtype=dtype):
                b = self.built(G, dtype=dtype, seed=11)
                ref = self.built(R, dtype=dtype, seed=11)
                want = self.host_bytes(ref)
                self.release(R, ref)
                # --release: the daemon lets go before anything is read; mappings stay valid.
                got = self.probe(G, b, "--release")
                self.assertEqual(sorted(got), [0, 1])
                for rank, (fields, data) in got.items():
                    s = b.shards[rank]
                    self.assertEqual((fields["kind"], fields["device"]), ("cuda", str(rank)))
                    self.assertEqual(int(fields["allocation"]), s.allocation_bytes)
                    self.assertEqual(int(fields["pointer"], 16) % GRANULARITY, 0)
                    self.assertEqual(fields["writable"], "0")
                    self.assertEqual(len(data), s.allocation_bytes)
                    self.assertEqual(data[:s.size_bytes], want[rank],
                                     "rank %d differs from the host reference" % rank)
                    self.assertEqual(data[s.size_bytes:].count(0), len(data) - s.size_bytes,
                                     "the allocation's padding is not zero")
                res = G.client.call("familyd.v1.FamilyService/GetBuild", build_id=b.build_id)
                self.assertEqual(res.code, "NOT_FOUND")
        self.assertEqual(G.fake("allocations"), 0)

    def test_c_client_without_a_driver(self):
        b = self.built(G)
        try:
            out = os.path.join(G.tmpdir, "probe-nodriver")
            os.makedirs(out, exist_ok=True)
            p = subprocess.run([PROBE, G.socket, b.build_id, out], capture_output=True,
                               text=True, timeout=60,
                               env=dict(os.environ, FAMILYD_CUDA_DRIVER="/nonexistent/libcuda.so.1"))
            self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
            self.assertIn("error import: No such file or directory (FAILED_PRECONDITION: this "
                          "client cannot map device memory: the CUDA driver "
                          "(/nonexistent/libcuda.so.1) is not installed)", p.stdout)
        finally:
            self.release(G, b)

    def test_python_module_imports_bit_exact(self):
        import familyd

        client = familyd.Client(G.socket)
        host = familyd.Client(R.socket)
        try:
            m = client.create_mesh({"tp": 2})
            hm = host.create_mesh({"tp": 2})
            self.assertEqual(m.mesh_id, hm.mesh_id)
            b = client.build("gpucheck", config=CHECK_CONFIG, mesh_id=m.mesh_id, dtype="bf16",
                             seed=3)
            h = host.build("gpucheck", config=CHECK_CONFIG, mesh_id=hm.mesh_id, dtype="bf16",
                           seed=3)
            with b, h:
                self.assertEqual(sorted(b.ranks), [0, 1])
                for rank, rt in b.ranks.items():
                    self.assertIsInstance(rt, familyd.DeviceRankTensors)
                    self.assertEqual((rt.device_kind, rt.device), ("cuda", rank))
                    self.assertEqual(rt.size, b.message.shards[rank].allocation_bytes)
                    self.assertFalse(rt.writable)
                    for name, arr in h.ranks[rank].items():
                        dev = rt[name]
                        cai = dev.__cuda_array_interface__
                        self.assertEqual(cai["version"], 3)
                        self.assertEqual(cai["typestr"], "<u2")   # bfloat16 bits
                        self.assertEqual(cai["shape"], arr.shape)
                        self.assertEqual(cai["data"], (rt.shard.pointer + dev.offset, True))
                        self.assertEqual(dev.numpy().tobytes(), arr.tobytes(),
                                         "rank %d %s differs" % (rank, name))
                # Raw handles: a GPU shard is not mmap()ed as if it were host memory.
                handles = client.fetch_shards(b.message)
                try:
                    self.assertEqual(sorted((r, h.device_kind, h.device)
                                            for r, h in handles.items()),
                                     [(0, "cuda", 0), (1, "cuda", 1)])
                    with self.assertRaises(ValueError) as cm:
                        handles[0].map()
                    self.assertIn("import it with familyd.cuda.DeviceShard", str(cm.exception))
                finally:
                    for h in handles.values():
                        h.close()
                # Debian's torch has no CUDA: the module says it cannot map device memory.
                try:
                    import torch
                except ImportError:
                    torch = None
                if torch is not None and not torch.cuda.is_available():
                    with self.assertRaises(familyd.DeviceMemoryError) as cm:
                        b.ranks[0].torch()
                    self.assertIn("cannot map device memory into torch", str(cm.exception))
                    self.assertIn("has no CUDA", str(cm.exception))
        finally:
            client.close()
            host.close()

    def test_python_module_without_a_driver(self):
        """A client process without the driver says so, and the build is released."""
        mesh_id = self.mesh(G)
        script = (
            "import os, sys; sys.path.insert(0, %r)\n"
            "import familyd\n"
            "c = familyd.Client(%r)\n"
            "try:\n"
            "    c.build('gpucheck', config=%r, mesh_id=%r)\n"
            "except familyd.DeviceMemoryError as e:\n"
            "    print('refused:', e)\n"
            "print('held by me:', sum(os.getpid() in [r.pid for r in b.references]\n"
            "                         for b in c.list_builds()))\n"
        ) % (PYDIR, G.socket, CHECK_CONFIG, mesh_id)
        env = dict(os.environ, FAMILYD_CUDA_DRIVER="/nonexistent/libcuda.so.1")
        p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           env=env, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("refused: this client cannot map device memory: the CUDA driver "
                      "(/nonexistent/libcuda.so.1) is not installed", p.stdout)
        # The build it made is released: this process holds no reference to any build (the
        # daemon frees it after its grace period, as nothing else holds it).
        self.assertIn("held by me: 0", p.stdout)


class FillPaths(Base):
    """The fill kernel and host staging write the same bytes as host memory does."""

    def test_kernel_and_staging_are_bit_exact(self):
        k = EnvDaemon(gpu_env(FAKE_CUDA_NO_KERNELS=1), host_devices=None)
        with k:
            self.assertIn("filled through host memory: cuModuleLoadData: no kernel image is "
                          "available for execution on the device", k.stderr())
            self.assertIn("filled by the fill kernel", G.stderr())
            for dtype in ("float32", "float16"):
                before = G.fake("launches")
                viak = self.built(G, dtype=dtype, seed=99)
                # u, u2, c, o, z by the kernel, on each of the two ranks; nrm (normal) staged.
                self.assertEqual(G.fake("launches") - before, 10)
                staged = self.built(k, dtype=dtype, seed=99)
                self.assertEqual(k.fake("launches"), 0)
                ref = self.built(R, dtype=dtype, seed=99)
                want = self.host_bytes(ref)
                for d, b in ((G, viak), (k, staged)):
                    got = self.probe(d, b)
                    for rank in (0, 1):
                        self.assertEqual(got[rank][1][:b.shards[rank].size_bytes], want[rank],
                                         "%s rank %d" % (d is G and "kernel" or "staging", rank))
                    self.release(d, b)
                self.release(R, ref)


class Failures(Base):
    def test_alloc_failure_keeps_nothing(self):
        # The first allocation succeeds (rank 0 is made and filled), the second fails.
        d = EnvDaemon(gpu_env(FAKE_CUDA_FAIL_ALLOC=999, FAKE_CUDA_FAIL_ALLOC_AFTER=1),
                      host_devices=None)
        with d:
            res = self.build(d)
            self.assertEqual(res.code, "UNAVAILABLE", res)
            self.assertEqual(res.message, "the CUDA driver failed on cuda:1: cuMemCreate: fake "
                                          "CUDA error (CUresult 999); nothing was kept")
            _, infos = d.client.error_details(res)
            self.assertEqual([i.reason for i in infos], ["CUDA"])
            self.assertEqual(d.fake("allocations"), 0)
            self.assertEqual(list(self.ok(d.client.call("familyd.v1.FamilyService/ListBuilds")).builds),
                             [])
            status = self.ok(d.client.call("familyd.v1.AdminService/GetStatus"))
            self.assertEqual(status.builds, 0)
            # Still serving: health, and a Build that materialises nothing.
            self.assertEqual(d.client.health().reply.status, 1)
            b = self.built(d, materialize=False)
            self.assertEqual([s.device_kind for s in b.shards], ["cuda", "cuda"])
            self.assertEqual([s.token for s in b.shards], ["", ""])
            self.assertIn("cuMemCreate on cuda:1 failed", d.stderr())

    def test_gpus_without_vmm_are_refused_up_front(self):
        d = EnvDaemon(gpu_env(FAKE_CUDA_NO_VMM=1), host_devices=None)
        with d:
            self.assertIn("cuda:0 cannot hold shards: the GPU does not support virtual memory "
                          "management", d.stderr())
            res = self.build(d)
            self.assertEqual(res.code, "FAILED_PRECONDITION", res)
            self.assertEqual(res.message, "cannot hold shards on cuda:0: the GPU does not "
                                          "support virtual memory management")
            self.assertEqual(d.fake("allocations"), 0)
            self.assertEqual(list(self.ok(d.client.call("familyd.v1.FamilyService/ListBuilds")).builds),
                             [])

    def test_gpu_budget_is_separate(self):
        # 16 MiB GPUs: a budget of 14 MiB each. --shm-budget 4096 would refuse any host shard.
        d = EnvDaemon(gpu_env(FAKE_CUDA_MEMORY=16 * MiB), host_devices=None,
                      extra_args=["--shm-budget", "4096", "--build-grace-ms", "0"])
        with d:
            big = {"n": 2560}     # 5 MiB per rank: a 6 MiB allocation on each GPU
            b1 = self.built(d, family="gpubig", config=big)
            self.assertEqual([s.allocation_bytes for s in b1.shards], [6 * MiB, 6 * MiB])
            b2 = self.built(d, family="gpubig", config=big)
            res = self.build(d, family="gpubig", config=big)
            self.assertEqual(res.code, "RESOURCE_EXHAUSTED", res)
            self.assertEqual(res.message, "GPU memory budget exceeded on cuda:0: build needs "
                                          "6291456 bytes, 12582912 of 14680064 in use")
            self.assertEqual(d.fake("allocations"), 4)
            self.release(d, b1)
            b3 = self.built(d, family="gpubig", config=big)
            self.release(d, b2)
            self.release(d, b3)
            self.assertEqual(d.fake("allocations"), 0)

    def test_builds_in_their_grace_period_give_gpu_memory_way(self):
        # The default grace period: a released GPU build holds its memory until a Build
        # needs it, then goes (oldest first), as host builds do for --shm-budget.
        d = EnvDaemon(gpu_env(FAKE_CUDA_MEMORY=16 * MiB), host_devices=None)
        with d:
            big = {"n": 2560}     # a 6 MiB allocation on each GPU: two builds fit, not three
            b1 = self.built(d, family="gpubig", config=big)
            b2 = self.built(d, family="gpubig", config=big)
            self.release(d, b1)                  # this process's reference: b1 in its grace
            got = self.ok(d.client.call("familyd.v1.FamilyService/GetBuild",
                                        build_id=b1.build_id))
            self.assertGreater(got.grace_deadline_unix_ms, 0)
            self.assertEqual(d.fake("allocations"), 4)
            b3 = self.built(d, family="gpubig", config=big)
            res = d.client.call("familyd.v1.FamilyService/GetBuild", build_id=b1.build_id)
            self.assertEqual(res.code, "NOT_FOUND", res)
            self.assertEqual(d.fake("allocations"), 4)
            # Held builds do not give way: the fourth is refused.
            res = self.build(d, family="gpubig", config=big)
            self.assertEqual(res.code, "RESOURCE_EXHAUSTED", res)
            for b in (b2, b3):
                self.ok(d.client.call("familyd.v1.FamilyService/ReleaseBuild",
                                      build_id=b.build_id, force=True))
            self.assertEqual(d.fake("allocations"), 0)


class Restarts(Base):
    def test_gpu_builds_are_not_kept(self):
        state = U.tmpfs_dir("fd-cuda-state-")
        if state is None:
            self.skipTest("no tmpfs for --state-dir")
        tmp = H.short_tmpdir("fd-cuda-restart-")
        try:
            args = ["--state-dir", state]
            d1 = EnvDaemon(gpu_env(), host_devices=None, tmpdir=tmp, extra_args=args)
            with d1:
                b = self.built(d1)
                self.assertIn("Build %s holds shards in GPU memory, which are not kept across "
                              "restarts" % b.build_id, d1.stderr())
                self.assertEqual(sorted(os.listdir(state)), [
                    "meta-" + b.info.layout.mesh_id])   # the mesh is kept, the build is not
            d2 = EnvDaemon(gpu_env(), host_devices=None, tmpdir=tmp, extra_args=args)
            with d2:
                res = d2.client.call("familyd.v1.FamilyService/GetBuild", build_id=b.build_id)
                self.assertEqual(res.code, "NOT_FOUND")
                self.assertIn("Re-adopted 0 builds and 1 mesh", d2.stderr())
        finally:
            shutil.rmtree(state, ignore_errors=True)
            shutil.rmtree(tmp, ignore_errors=True)

    def test_gpu_builds_take_no_fd_store_room(self):
        """Under a service manager a GPU build stores nothing: with --fdstore-max 2 a host
        build of 2 shards (3 descriptors) could not be made, GPU builds can; a restart with the
        store brings back the mesh only."""
        tmp = H.short_tmpdir("fd-cuda-store-")
        m = FakeManager(tmp)
        try:
            d1 = ManagedGpuDaemon(m, gpu_env(), tmpdir=tmp, extra_args=["--fdstore-max", "2"])
            d1.start()
            try:
                m.wait_for("READY", "1")
                b = self.built(d1)
                again = self.built(d1)
                mesh_id = b.info.layout.mesh_id
                self.assertEqual(sorted(n for n in m.fdstore if n.startswith(("shard-", "meta"))),
                                 ["meta-" + mesh_id])
                self.assertIn("Build %s holds shards in GPU memory, which are not kept across "
                              "restarts (fd-store mode keeps host shards only)." % b.build_id,
                              d1.stderr())
                self.release(d1, again)
            finally:
                d1.client.close()
                d1.client = None
                d1.kill()    # a crash: the store is all that is left
            mark = m.mark()
            d2 = ManagedGpuDaemon(m, gpu_env(), tmpdir=tmp, extra_args=["--fdstore-max", "2"])
            with d2:
                m.wait_for("READY", "1", after=mark)
                res = d2.client.call("familyd.v1.FamilyService/GetBuild", build_id=b.build_id)
                self.assertEqual(res.code, "NOT_FOUND")
                meshes = self.ok(d2.client.call("familyd.v1.MeshService/ListMeshes")).meshes
                self.assertEqual([x.mesh_id for x in meshes], [mesh_id])
        finally:
            m.close()
            shutil.rmtree(tmp, ignore_errors=True)

    def test_record_naming_a_gpu_shard_is_dropped(self):
        """Re-adoption never takes a descriptor for a memfd it is not: a (forged) record that
        says a rank lives in GPU memory is dropped with its segments."""
        state = U.tmpfs_dir("fd-cuda-state-")
        if state is None:
            self.skipTest("no tmpfs for --state-dir")
        tmp = H.short_tmpdir("fd-cuda-forge-")
        try:
            args = ["--state-dir", state]
            d1 = EnvDaemon({}, host_devices=2, tmpdir=tmp, extra_args=args)
            with d1:
                b = self.built(d1)
            path = os.path.join(state, "meta-" + b.build_id)
            with open(path, "rb") as f:
                data = bytearray(f.read())
            with open(path, "wb") as f:
                f.write(forge_gpu_record(data))
            d2 = EnvDaemon({}, host_devices=2, tmpdir=tmp, extra_args=args)
            with d2:
                self.assertIn("Dropping the state record meta-%s: rank 0 is in GPU memory "
                              "(cuda), which is never kept across restarts." % b.build_id,
                              d2.stderr())
                res = d2.client.call("familyd.v1.FamilyService/GetBuild", build_id=b.build_id)
                self.assertEqual(res.code, "NOT_FOUND")
                self.assertFalse([n for n in os.listdir(state) if n.startswith("shard-")])
        finally:
            shutil.rmtree(state, ignore_errors=True)
            shutil.rmtree(tmp, ignore_errors=True)


def crc32c(data):
    crc = 0xffffffff
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82f63b78 if crc & 1 else crc >> 1
    return crc ^ 0xffffffff


def forge_gpu_record(data):
    """A build record (daemon/codec/codec-record.h) whose ranks say device_kind "cuda", its
    checksum right."""
    body = bytes(data[32:])
    out = b""
    pos = 0
    while pos < len(body):
        tag, length = struct.unpack_from("<II", body, pos)
        section = body[pos + 8:pos + 8 + length]
        if tag == 1:   # SECTION_BUILD: a familyd.v1.Build
            build = P.cls("familyd.v1.Build").FromString(section)
            for s in build.shards:
                s.device_kind = "cuda"
            section = build.SerializeToString()
        out += struct.pack("<II", tag, len(section)) + section
        pos += 8 + length
    header = bytearray(data[:32])
    header[16:24] = struct.pack("<Q", len(out))
    header[24:28] = struct.pack("<I", crc32c(bytes(header[:24]) + out))
    return bytes(header) + out


if __name__ == "__main__":
    unittest.main(verbosity=2)
