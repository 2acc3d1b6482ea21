#!/usr/bin/python3
"""Replicas share bytes within a build (docs/sharing.md, "Replicas").

On a dp=2,tp=2 mesh a family with tp-sharded and replicated parameters has two distinct
shards: ranks (dp=1, tp=t) hold the same slices as (dp=0, tp=t). Such a build fills two
segments, not four; each rank keeps its own token and descriptor, the replicas' descriptors
are of their primary's memory (same inode), and MAP_PRIVATE writes stay the writer's.
GetStatus (fills_started, bytes_filled, shm_bytes_in_use), --shm-budget and the Build log line
count the bytes once. A writable build keeps a segment per rank; GPU ranks never share.
Restarts keep replicated builds: --state-dir and the fd store hold the primaries' segments
only, the record says which rank each replica shares, ReleaseBuild --force lets all of it go.

Daemons (real familyd, grpcio, the shard socket by hand):
  D  the registry below, --host-devices 4, one node
  B  the same with --shm-budget just over half of four ranks' bytes
  G  the fake CUDA driver's four GPUs (skipped when it was not built)
  K  --state-dir on a tmpfs, and under the fake service manager (fd store), restarted
"""

import mmap
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402
import shard_client as SC  # noqa: E402
import test_durability_util as U  # noqa: E402
from fake_manager import FakeManager  # noqa: E402

FAMILY = "replica_block"
REGISTRY_YAML = """\
name: replica_block
baseline: itest.replicas.Block
default_variant: plain
parallel_axis: tp
variants:
  plain:
    constructor: itest.replicas.Plain
    accepts: [config, module, module_fqn, context]
parameters:
  norm_weight:
    shape: [hidden_size]
    init: {normal: {mean: 1, std: 0.25}}
  wq:
    shape: [hidden_size, hidden_size]
    placements: {tp: shard(0)}
    init: {uniform: {low: -1, high: 1}}
  wo:
    shape: [hidden_size, hidden_size]
    placements: {tp: shard(1)}
    init: {normal: {std: 0.5}}
"""
CONFIG = {"hidden_size": 64}
SEED = 77
DP_TP = {"deviceMesh": [{"name": "dp", "size": "2"}, {"name": "tp", "size": "2"}],
         "ranks": ["0", "1", "2", "3"]}
TP = {"deviceMesh": [{"name": "tp", "size": "2"}], "ranks": ["0", "1"]}
FAKE = os.environ.get("FAKE_LIBCUDA") or H._default_build_file("tests", "fake-cuda",
                                                               "libfake-libcuda.so")

P = None
D = None
TMP = None
REG = None


def setUpModule():
    global P, D, TMP, REG
    P = H.Protos()
    TMP = H.short_tmpdir("fd-replicas-")
    REG = os.path.join(TMP, "registry")
    os.makedirs(REG)
    with open(os.path.join(REG, "replicas.yaml"), "w") as f:
        f.write(REGISTRY_YAML)
    D = H.Daemon(registry=REG, host_devices=4, node_name="itest-replicas", protos=P)
    D.start()


def check_sanitizers(d):
    err = d.stderr()
    for marker in ("runtime error:", "Sanitizer"):
        if marker in err:
            raise AssertionError("familyd stderr has a sanitizer report:\n" + err[-4000:])


def tearDownModule():
    try:
        if D is not None:
            D.stop()
            check_sanitizers(D)
    finally:
        if D is not None:
            D.cleanup()
        if TMP:
            shutil.rmtree(TMP, ignore_errors=True)


def request(mesh_id, seed=SEED, writable=False, materialize=True):
    req = P.cls("familyd.v1.BuildRequest")(family=FAMILY, mesh_id=mesh_id, writable=writable)
    req.config.SetInParent()
    for k, v in CONFIG.items():
        req.config.fields[k].CopyFrom(P.value(v))
    if materialize:
        req.materialize.enabled = True
        req.materialize.seed = seed
        # Each Build its own build: the counters move for this one alone.
        req.private_build = True
    return req


def crc32c(data):
    crc = 0xffffffff
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82f63b78 if crc & 1 else crc >> 1
    return crc ^ 0xffffffff


def identity(fd):
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


class Base(unittest.TestCase):
    daemon = None

    @property
    def d(self):
        return self.daemon or D

    def call(self, rpc, request=None, **kw):
        return self.d.client.call(rpc, request, **kw)

    def ok(self, res):
        self.assertEqual(res.code, "OK", "%r" % res)
        return res.reply

    def status(self):
        return self.ok(self.call("familyd.v1.AdminService/GetStatus"))

    def mesh(self, mesh):
        return self.ok(self.call("familyd.v1.MeshService/CreateMesh", {"mesh": mesh})).mesh_id

    def release(self, build_id, d=None):
        d = d or self.d
        if d.client is not None:  # a daemon stopped already let it go
            d.client.call("familyd.v1.FamilyService/ReleaseBuild", build_id=build_id,
                          force=True)

    def built(self, mesh, **kw):
        b = self.ok(self.call("familyd.v1.FamilyService/Build",
                              request(self.mesh(mesh), **kw))).build
        self.addCleanup(self.release, b.build_id, self.d)
        return b

    def fetch(self, b, writable=False):
        reply, fds = U.fetch(self.d, b, writable)
        self.assertEqual(reply.code, U.STATUS_OK, reply.message)
        for fd in fds.values():
            self.addCleanup(os.close, fd)
        return fds

    def wait_log(self, pattern, timeout=10.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = re.search(pattern, self.d.stderr())
            if m:
                return m
            time.sleep(0.05)
        self.fail("no log line matches %r in:\n%s" % (pattern, self.d.stderr()[-3000:]))

    def sizes(self):
        """Each rank's shard size on DP_TP (a layout-only Build): all four ranks' bytes, and
        the two distinct shards' (half of them)."""
        b = self.ok(self.call("familyd.v1.FamilyService/Build",
                              request(self.mesh(DP_TP), materialize=False))).build
        self.release(b.build_id)
        sizes = [s.size_bytes for s in b.shards]
        self.assertEqual(len(sizes), 4)
        return sum(sizes), sizes[0] + sizes[1]


class TestReplicas(Base):
    def test_dp_tp_build_fills_half_and_shares_memory(self):
        four, half = self.sizes()
        self.assertEqual(2 * half, four)
        before = self.status()
        b = self.built(DP_TP)
        after = self.status()

        # Two segments filled and held, four tokens.
        self.assertEqual(len(b.shards), 4)
        self.assertTrue(all(s.token for s in b.shards))
        self.assertEqual(len({s.token for s in b.shards}), 4)
        self.assertEqual(after.fills_started - before.fills_started, 2)
        self.assertEqual(after.bytes_filled - before.bytes_filled, half)
        self.assertEqual(after.shm_bytes_in_use - before.shm_bytes_in_use, half)
        # Each rank still shows its own shard's size.
        for s in b.shards:
            self.assertEqual(s.allocation_bytes, s.size_bytes, s.rank)
        self.assertEqual([list(x.SerializeToString() for x in s.slices) for s in b.shards[2:]],
                         [list(x.SerializeToString() for x in s.slices) for s in b.shards[:2]])
        self.wait_log(r"Build %s created: %s as plain, 4 ranks, %d bytes of shards held "
                      r"\(4 ranks in 2 segments: replicas share\)\." % (b.build_id, FAMILY, half))

        # The bytes: rank (dp, tp) holds what rank tp of a tp=2 build holds (values are a
        # function of the parameter, its logical index and the seed).
        got = U.read_shards(self, D, b)
        ref = U.read_shards(self, D, self.built(TP))
        self.assertEqual(sorted(got), [0, 1, 2, 3])
        for r in range(4):
            self.assertEqual(got[r], ref[r % 2], "rank %d" % r)
        self.assertNotEqual(got[0], got[1])

        # Each handout names its own rank's device and size, replicas' too.
        reply, extra = U.fetch(D, b)
        for fd in extra.values():
            os.close(fd)
        self.assertEqual(reply.code, U.STATUS_OK, reply.message)
        self.assertEqual(list(reply.devices), [s.local_device for s in b.shards])
        self.assertEqual(list(reply.devices), [0, 1, 2, 3])
        self.assertEqual(list(reply.sizes), [s.size_bytes for s in b.shards])

        # Replicas' descriptors are of the same memory; the distinct shards are not.
        fds = self.fetch(b)
        ids = {r: identity(fd) for r, fd in fds.items()}
        self.assertEqual(ids[0], ids[2])
        self.assertEqual(ids[1], ids[3])
        self.assertNotEqual(ids[0], ids[1])

        # A trainer's private (copy-on-write) writes stay its own.
        size = b.shards[2].size_bytes
        mine = mmap.mmap(fds[2], size, flags=mmap.MAP_PRIVATE,
                         prot=mmap.PROT_READ | mmap.PROT_WRITE)
        other = SC.map_readonly(fds[0], size)
        theirs = mmap.mmap(fds[0], size, flags=mmap.MAP_PRIVATE,
                           prot=mmap.PROT_READ | mmap.PROT_WRITE)
        try:
            mine[0:size] = b"\xa5" * size
            self.assertEqual(bytes(mine), b"\xa5" * size)
            self.assertEqual(bytes(other), got[0])
            self.assertEqual(bytes(theirs), got[0])
            theirs[0:4] = b"\x01\x02\x03\x04"
            self.assertEqual(bytes(mine[0:4]), b"\xa5" * 4)
        finally:
            for m in (mine, other, theirs):
                m.close()
        self.assertEqual(U.read_shards(self, D, b), got)

    def test_writable_build_keeps_a_segment_per_rank(self):
        four, half = self.sizes()
        before = self.status()
        b = self.built(DP_TP, writable=True)
        after = self.status()
        self.assertEqual(after.fills_started - before.fills_started, 4)
        self.assertEqual(after.bytes_filled - before.bytes_filled, four)
        self.assertEqual(after.shm_bytes_in_use - before.shm_bytes_in_use, four)
        m = self.wait_log(r"Build %s created: [^\n]*" % b.build_id)
        self.assertNotIn("replicas share", m.group(0))

        fds = self.fetch(b, writable=True)
        self.assertEqual(len({identity(fd) for fd in fds.values()}), 4)
        # Its bytes are every user's: a write through rank 2 stays out of rank 0's shard.
        got = U.read_shards(self, D, b)
        self.assertEqual(got[0], got[2])
        size = b.shards[2].size_bytes
        w = SC.map_writable(fds[2], size)
        try:
            w[0:4] = b"\x01\x02\x03\x04"
        finally:
            w.close()
        now = U.read_shards(self, D, b)
        self.assertEqual(now[2][:4], b"\x01\x02\x03\x04")
        self.assertEqual(now[0], got[0])

    def test_materialised_subset_shares_only_what_is_here(self):
        # Ranks 0 and 2 here: a replica and its primary; rank 1 alone.
        four, half = self.sizes()
        before = self.status()
        req = request(self.mesh(DP_TP))
        req.materialize.ranks.extend([1, 2, 0])
        b = self.ok(self.call("familyd.v1.FamilyService/Build", req)).build
        self.addCleanup(self.release, b.build_id, self.d)
        after = self.status()
        self.assertEqual([bool(s.token) for s in b.shards], [True, True, True, False])
        self.assertEqual(after.fills_started - before.fills_started, 2)
        self.assertEqual(after.shm_bytes_in_use - before.shm_bytes_in_use, half)
        fds = self.fetch(b)
        self.assertEqual(identity(fds[0]), identity(fds[2]))
        self.assertNotEqual(identity(fds[0]), identity(fds[1]))


class TestBudget(Base):
    """--shm-budget counts a replicated build's bytes once."""

    def test_replicated_build_fits_where_four_ranks_would_not(self):
        four, half = self.sizes()
        tmp = H.short_tmpdir()
        self.addCleanup(shutil.rmtree, tmp, True)
        d = H.Daemon(registry=REG, host_devices=4, node_name="itest-replicas", protos=P,
                     tmpdir=tmp, extra_args=["--shm-budget", str(half + 64)])
        d.start()
        self.addCleanup(lambda: d.alive() and d.stop())
        self.daemon = d

        b = self.built(DP_TP)
        self.assertEqual(self.status().shm_bytes_in_use, half)
        self.assertEqual(len(U.read_shards(self, d, b)), 4)
        # The same request made writable needs all four ranks' bytes: refused.
        self.release(b.build_id)
        res = self.call("familyd.v1.FamilyService/Build",
                        request(self.mesh(DP_TP), writable=True))
        self.assertEqual(res.code, "RESOURCE_EXHAUSTED", res)
        _, infos = d.client.error_details(res)
        self.assertEqual([i.reason for i in infos], ["SHM_BUDGET"])
        self.assertEqual(self.status().shm_bytes_in_use, 0)
        d.stop()
        check_sanitizers(d)


class GpuDaemon(H.Daemon):
    """familyd over the fake CUDA driver's four GPUs."""

    def spawn(self):
        env = {"FAMILYD_CUDA_DRIVER": FAKE, "FAKE_CUDA_DEVICES": "4",
               "FAKE_CUDA_STATE_FILE": os.path.join(self.tmpdir, "fake-cuda.state")}
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            return super().spawn()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


class TestGpu(Base):
    """A GPU allocation belongs to one GPU: GPU ranks never share."""

    def test_gpu_ranks_keep_their_own_allocations(self):
        if not os.path.exists(FAKE):
            self.skipTest("the fake libcuda was not built")
        tmp = H.short_tmpdir()
        self.addCleanup(shutil.rmtree, tmp, True)
        d = GpuDaemon(registry=REG, host_devices=None, protos=P, tmpdir=tmp,
                      extra_args=["--build-grace-ms", "0"])
        d.start()
        self.addCleanup(lambda: d.alive() and d.stop())
        self.daemon = d

        before = self.status()
        b = self.built(DP_TP)
        self.assertEqual([s.device_kind for s in b.shards], ["cuda"] * 4)
        self.assertEqual(self.status().fills_started - before.fills_started, 4)
        with open(os.path.join(tmp, "fake-cuda.state")) as f:
            self.assertRegex(f.read(), r"\ballocations=4\b")
        self.release(b.build_id)
        d.stop()
        check_sanitizers(d)


class TestRestart(Base):
    """Replicated builds outlive the daemon: --state-dir, and the fd store."""

    def setUp(self):
        self.tmp = H.short_tmpdir()
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.daemons = []

    def tearDown(self):
        for d in self.daemons:
            if d.alive():
                d.stop()
                check_sanitizers(d)

    def start(self, daemon):
        daemon.shard_socket = os.path.join(self.tmp, "shard.sock")
        self.daemons.append(daemon)
        self.daemon = daemon
        return daemon.start()

    def kill(self, d):
        d.client.close()
        d.client = None
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait()

    def build_replicated(self, d):
        """A replicated build (and a writable one beside it, a segment per rank)."""
        mesh_id = U.create_mesh(self, d.client, DP_TP)
        b = self.ok(self.call("familyd.v1.FamilyService/Build", request(mesh_id))).build
        w = self.ok(self.call("familyd.v1.FamilyService/Build",
                              request(mesh_id, seed=5, writable=True))).build
        return mesh_id, b, w

    def check_after_restart(self, d2, before, b, w, bytes_b):
        self.assertEqual(U.view(self, d2), before)
        self.assertEqual(U.read_shards(self, d2, b), bytes_b)
        reply, extra = U.fetch(d2, b)
        for fd in extra.values():
            os.close(fd)
        self.assertEqual(list(reply.devices), [0, 1, 2, 3])
        fds = self.fetch(b)
        self.assertEqual(identity(fds[0]), identity(fds[2]))
        self.assertEqual(identity(fds[1]), identity(fds[3]))
        self.assertNotEqual(identity(fds[0]), identity(fds[1]))
        self.assertRegex(d2.stderr(), r"Re-adopted build %s: 2 shards, %d bytes\."
                         % (b.build_id, sum(s.size_bytes for s in b.shards[:2])))
        self.assertRegex(d2.stderr(), r"Re-adopted build %s: 4 shards" % w.build_id)

    def test_state_dir(self):
        state = U.tmpfs_dir("fd-replicas-state-")
        if state is None:
            self.skipTest("no tmpfs to put a state dir on (/dev/shm, /run)")
        self.addCleanup(shutil.rmtree, state, True)

        def daemon():
            return H.Daemon(registry=REG, host_devices=4, node_name="itest-replicas",
                            protos=P, tmpdir=self.tmp, extra_args=["--state-dir", state])

        d1 = self.start(daemon())
        mesh_id, b, w = self.build_replicated(d1)
        before = U.view(self, d1)
        half = sum(s.size_bytes for s in b.shards[:2])
        four_w = sum(s.size_bytes for s in w.shards)
        self.assertEqual(before["status"][2], half + four_w)
        bytes_b = U.read_shards(self, d1, b)
        # The primaries' segments only; the writable build's four.
        self.assertEqual(sorted(f for f in os.listdir(state) if b.build_id + "-" in f),
                         ["shard-%s-0" % b.build_id, "shard-%s-1" % b.build_id])
        self.assertEqual(len([f for f in os.listdir(state) if w.build_id + "-" in f]), 4)
        self.kill(d1)

        d2 = self.start(daemon())
        self.check_after_restart(d2, before, b, w, bytes_b)
        # A restart fills nothing.
        self.assertEqual((self.status().fills_started, self.status().bytes_filled), (0, 0))

        # Released, all of it goes: both segments, the record, the bytes.
        for x in (b, w):
            self.ok(self.call("familyd.v1.FamilyService/ReleaseBuild", build_id=x.build_id,
                              force=True))
        self.assertEqual(sorted(os.listdir(state)), ["meta-" + mesh_id])
        st = self.status()
        self.assertEqual((st.builds, st.shm_bytes_in_use), (0, 0))

    def test_state_dir_record_that_does_not_hold_together_is_dropped(self):
        state = U.tmpfs_dir("fd-replicas-state-")
        if state is None:
            self.skipTest("no tmpfs to put a state dir on (/dev/shm, /run)")
        self.addCleanup(shutil.rmtree, state, True)

        def daemon():
            return H.Daemon(registry=REG, host_devices=4, node_name="itest-replicas",
                            protos=P, tmpdir=self.tmp, extra_args=["--state-dir", state])

        d1 = self.start(daemon())
        mesh_id = U.create_mesh(self, d1.client, DP_TP)
        wrong = self.ok(self.call("familyd.v1.FamilyService/Build", request(mesh_id))).build
        bad = self.ok(self.call("familyd.v1.FamilyService/Build", request(mesh_id, 6))).build
        kept = self.ok(self.call("familyd.v1.FamilyService/Build", request(mesh_id, 7))).build
        d1.stop()

        def rewrite(build, pairs):
            # The replicas section is the record's last: tag 7, 16 bytes, (rank, primary) x 2.
            path = os.path.join(state, "meta-" + build.build_id)
            with open(path, "rb") as f:
                data = bytearray(f.read())
            self.assertEqual(struct.unpack("<IIIIII", data[-24:]), (7, 16, 2, 0, 3, 1))
            data[-16:] = struct.pack("<IIII", *pairs)
            data[24:28] = struct.pack("<I", crc32c(bytes(data[:24]) + bytes(data[32:])))
            os.chmod(path, 0o600)
            with open(path, "wb") as f:
                f.write(data)

        # Rank 2 said to share rank 1's bytes (the same size, other slices); a replica of
        # itself.
        rewrite(wrong, (2, 1, 3, 1))
        rewrite(bad, (2, 2, 3, 1))
        d2 = self.start(daemon())
        err = d2.stderr()
        self.assertIn("Dropping build %s kept by an earlier run: its rank 2 is kept as a replica "
                      "of rank 1, whose slices differ." % wrong.build_id, err)
        self.assertIn("Dropping the state record meta-%s: the build's replica 2 of 2 is out of "
                      "order." % bad.build_id, err)
        self.assertEqual(U.view(self, d2)["ids"], [kept.build_id])
        self.assertEqual(sorted(os.listdir(state)),
                         sorted(["meta-" + mesh_id, "meta-" + kept.build_id,
                                 "metarep-" + kept.build_id,   # what holds it (this process)
                                 "shard-%s-0" % kept.build_id, "shard-%s-1" % kept.build_id]))
        self.assertEqual(len(U.read_shards(self, d2, kept)), 4)

    def test_fd_store(self):
        m = FakeManager(self.tmp)
        self.addCleanup(m.close)

        class Managed(H.Daemon):
            def spawn(inner):
                with open(inner.stdout_path, "ab") as out, open(inner.stderr_path, "ab") as err:
                    inner.proc = m.spawn(inner.argv(), stdout=out, stderr=err,
                                         stdin=subprocess.DEVNULL)
                return inner.proc

        def daemon(extra=()):
            mark = m.mark()
            d = self.start(Managed(registry=REG, host_devices=4, node_name="itest-replicas",
                                   protos=P, tmpdir=self.tmp, extra_args=list(extra)))
            m.wait_for("READY", "1", after=mark)
            return d

        def ours(n=None):
            deadline = time.monotonic() + 10
            while True:
                # Builds' and meshes' records and segments; the holders records (metarep-*)
                # are test_durability_fdstore.py's.
                names = sorted(k for k in m.fdstore if k.startswith(("shard-", "meta-")))
                if n is None or len(names) == n or time.monotonic() > deadline:
                    return names
                time.sleep(0.02)

        # Room is counted per kept segment: the mesh's record, then the replicated build's
        # two segments and record (four ranks, were each kept: five, refused).
        d1 = daemon(["--fdstore-max", "4"])
        mesh_id = U.create_mesh(self, d1.client, DP_TP)
        b = self.ok(self.call("familyd.v1.FamilyService/Build", request(mesh_id))).build
        want = sorted(["meta-" + mesh_id, "meta-" + b.build_id, "shard-%s-0" % b.build_id,
                       "shard-%s-1" % b.build_id])
        self.assertEqual(ours(4), want)
        self.assertEqual(m.fdstore_ignored, [])
        res = self.call("familyd.v1.FamilyService/Build", request(mesh_id, seed=2))
        self.assertEqual(res.code, "RESOURCE_EXHAUSTED", res)
        self.assertEqual(res.message, "fd store limit reached: build needs 3 descriptors, 4 of "
                                      "4 kept (--fdstore-max)")
        self.ok(self.call("familyd.v1.FamilyService/ReleaseBuild", build_id=b.build_id,
                          force=True))
        self.assertEqual(ours(1), ["meta-" + mesh_id])
        d1.stop()

        d2 = daemon()
        b = self.ok(self.call("familyd.v1.FamilyService/Build", request(mesh_id))).build
        w = self.ok(self.call("familyd.v1.FamilyService/Build",
                              request(mesh_id, seed=5, writable=True))).build
        self.assertEqual(len(ours(1 + 3 + 5)), 9)
        self.assertEqual(m.fdstore_ignored, [])
        before = U.view(self, d2)
        bytes_b = U.read_shards(self, d2, b)
        self.kill(d2)

        d3 = daemon()
        self.check_after_restart(d3, before, b, w, bytes_b)
        self.assertEqual(m.fdstore_ignored, [])
        for x in (b, w):
            self.ok(self.call("familyd.v1.FamilyService/ReleaseBuild", build_id=x.build_id,
                              force=True))
        self.assertEqual(ours(1), ["meta-" + mesh_id])
        st = self.status()
        self.assertEqual((st.builds, st.shm_bytes_in_use), (0, 0))


if __name__ == "__main__":
    unittest.main()
