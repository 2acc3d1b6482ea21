#!/usr/bin/python3
"""Builds from checkpoints (docs/checkpoints.md): deposits on the shard socket, the
values read into the shards, sharing by the files' identity, and every refusal.

The checkpoints are written by the safetensors library (numpy), an independent writer; the
expected bytes are the test's own numpy slicing of the same arrays (and, for BF16, the test's
own widening of the bits). The real daemon runs as root on the example registry
(deploy/registry) plus one family without checkpoint names; clients are this process (the
shard socket by hand, shard_client.py) and, for another uid, this file run again with
`--client` as `nobody` from a world-readable copy (other_uid.py).

- Deposits: the files' descriptors in one frame (also with the header sent alone first);
  refused with INVALID_ARGUMENT for a count that disagrees with the names, a pipe, a
  write-only descriptor, a name with "/", tokens beside files; a uid's 17th deposit is
  RESOURCE_EXHAUSTED; descriptors sent with a token request are closed and refused.
- Builds: tp=2 and dp=2 x tp=2 shards byte-equal to the slicing (F32 and BF16 files into
  float32 parameters; bfloat16 parameters from F32 files rounded to nearest even); the bytes
  the daemon reads (/proc/PID/io rchar, and /metrics) are those the node's shards need within
  1%; two deposits of the same files (other tokens, 4 concurrent callers) share one build; a
  file replaced between two Builds gives a new build with the new values.
- Refusals, each naming the file or tensor, the daemon serving on: truncated file, header
  length past the end, a 100 MB header, overlapping offsets, a shape disagreeing with its
  bytes, missing tensor, wrong shape, a dtype that does not convert, an index naming a missing
  file or `../x`, no materialize, a family without checkpoint names, an unknown token, another
  uid's token; another uid cannot deposit a 0600 file of root's (it cannot open it, and the
  daemon opens nothing).
"""

import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402
import other_uid  # noqa: E402
import shard_client as SC  # noqa: E402

BUILD = "familyd.v1.FamilyService/Build"
RELEASE = "familyd.v1.FamilyService/ReleaseBuild"
PREFIX = "model.layers.0.mlp"
HIDDEN, INTER = 64, 128
CONFIG = {"hidden_size": HIDDEN, "intermediate_size": INTER, "initializer_range": 0.02}
BIG_CONFIG = {"hidden_size": 256, "intermediate_size": 512, "initializer_range": 0.02}
NO_NAMES_YAML = """\
name: no_names
baseline: itest.checkpoint.NoNames
default_variant: plain
variants:
  plain:
    constructor: itest.checkpoint.Plain
    accepts: [config, module, module_fqn, context]
parameters:
  weight:
    shape: [hidden_size]
    init: ones
"""
NOBODY = 65534

P = None
D = None
TMP = None
COPY = None


def setUpModule():
    global P, D, TMP
    P = H.Protos()
    TMP = H.short_tmpdir("fd-ckpt-")
    os.chmod(TMP, 0o755)
    reg = os.path.join(TMP, "registry")
    shutil.copytree(os.path.join(H.SOURCE_ROOT, "deploy", "registry"), reg)
    with open(os.path.join(reg, "no_names.yaml"), "w") as f:
        f.write(NO_NAMES_YAML)
    D = H.Daemon(registry=reg, host_devices=4, node_name="itest-ckpt", protos=P,
                 extra_args=["--metrics-listen", "127.0.0.1:%d" % H.free_port()])
    os.chmod(D.tmpdir, 0o755)
    D.start()
    os.chmod(D.socket, 0o666)
    os.chmod(D.shard_socket, 0o666)


def tearDownModule():
    try:
        if D is not None:
            D.stop_checked()
    finally:
        if COPY is not None:
            COPY.cleanup()
        if TMP:
            shutil.rmtree(TMP, ignore_errors=True)


# ---- checkpoints ----------------------------------------------------------------------

def mlp_tensors(seed, dtype=np.float32, hidden=HIDDEN, inter=INTER):
    rng = np.random.default_rng(seed)
    shapes = {"gate_proj": (inter, hidden), "up_proj": (inter, hidden),
              "down_proj": (hidden, inter)}
    return {"%s.%s.weight" % (PREFIX, n): rng.standard_normal(s).astype(dtype)
            for n, s in shapes.items()}


def save(tensors, path, metadata=None):
    from safetensors.numpy import save_file
    save_file(tensors, path, metadata=metadata)


def save_bf16(tensors32, path):
    """BF16 tensors of the float32 arrays' upper halves (truncated: the file's values are
    exactly representable), written through safetensors.torch; the float32 values they
    stand for are returned."""
    import torch
    from safetensors.torch import save_file
    out, exact = {}, {}
    for k, v in tensors32.items():
        bits = (v.view(np.uint32) >> 16).astype(np.uint16)
        out[k] = torch.from_numpy(bits.view(np.int16).copy()).view(torch.bfloat16)
        exact[k] = (bits.astype(np.uint32) << 16).view(np.float32)
    save_file(out, path)
    return exact


def split_dir(tensors, path):
    """Two files and an index, as save_pretrained lays out a sharded checkpoint."""
    os.makedirs(path, exist_ok=True)
    names = sorted(tensors)
    files = {"model-00001-of-00002.safetensors": names[:1],
             "model-00002-of-00002.safetensors": names[1:]}
    weight_map = {}
    for fname, part in files.items():
        save({n: tensors[n] for n in part}, os.path.join(path, fname))
        weight_map.update({n: fname for n in part})
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    return path


def raw_file(path, header, data=b"", length=None):
    """A file written byte by byte: 8-byte length (header's, or length), JSON, data."""
    js = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(js) if length is None else length))
        f.write(js)
        f.write(data)
    return path


def bf16_round(x):
    """float32 -> bfloat16 bits, round to nearest even (the test's own)."""
    b = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7fff + ((b >> 16) & 1)) >> 16
    return b.astype(np.uint16)


# ---- calls ----------------------------------------------------------------------------

def mesh(axes):
    spec = {"deviceMesh": [{"name": n, "size": str(s)} for n, s in axes],
            "ranks": [str(r) for r in range(int(np.prod([s for _, s in axes])))]}
    res = D.client.call("familyd.v1.MeshService/CreateMesh", {"mesh": spec})
    assert res.ok, res
    return res.reply.mesh_id


def request(token, mesh_id=None, family="mlp", prefix=PREFIX, materialize=True, dtypes=None,
            private=False, names="", config=None):
    req = P.cls("familyd.v1.BuildRequest")(family=family, private_build=private)
    if mesh_id:
        req.mesh_id = mesh_id
    req.config.SetInParent()
    for k, v in (config or CONFIG).items():
        req.config.fields[k].CopyFrom(P.value(v))
    if materialize:
        req.materialize.enabled = True
    if dtypes:
        req.materialize.dtype = dtypes
    req.checkpoint.token = token
    req.checkpoint.prefix = prefix
    req.checkpoint.names = names
    return req


def shards(build):
    """{rank: bytes} through read-only mappings."""
    reply, fds = SC.fetch(build.shard_socket or D.shard_socket, P,
                          [s.token for s in build.shards if s.token])
    assert reply.code == 0, reply.message
    out = {}
    for s, fd, size in zip([s for s in build.shards if s.token], fds, reply.sizes):
        m = SC.map_readonly(fd, size)
        out[s.rank] = bytes(m)
        m.close()
        os.close(fd)
    return out


def daemon_io():
    """The daemon's /proc/PID/io counters."""
    with open("/proc/%d/io" % D.proc.pid) as f:
        return {k: int(v) for k, v in (line.split(":") for line in f)}


def daemon_rchar():
    return daemon_io()["rchar"]


class Base(unittest.TestCase):
    def deposit(self, path):
        return SC.deposit(D.shard_socket, P, path)

    def build(self, req):
        res = D.client.call(BUILD, req, timeout=60)
        self.assertTrue(res.ok, "%s %s" % (res.code, res.message))
        b = res.reply.build
        self.addCleanup(D.client.call, RELEASE, build_id=b.build_id, force=True)
        return b

    def refused(self, req, status, reason, *texts):
        res = D.client.call(BUILD, req, timeout=60)
        self.assertEqual(res.code, status, res.message)
        _, infos = D.client.error_details(res)
        self.assertEqual(infos[0].reason if infos else "", reason, res.message)
        for t in texts:
            self.assertIn(t, res.message)
        # The daemon serves on.
        self.assertTrue(D.client.call("familyd.v1.AdminService/GetStatus").ok)
        return res.message

    def check_values(self, build, tensors, dtype=np.float32):
        got = shards(build)
        self.assertEqual(sorted(got), sorted(s.rank for s in build.shards))
        for s in build.shards:
            for sl in s.slices:
                if not sl.byte_length:
                    continue
                full = tensors["%s.%s.weight" % (PREFIX, sl.parameter)]
                want = full[tuple(slice(o, o + n) for o, n in
                                  zip(sl.global_offset, sl.local_shape))]
                raw = got[s.rank][sl.byte_offset:sl.byte_offset + sl.byte_length]
                if dtype == "bf16":
                    self.assertEqual(raw, bf16_round(want).tobytes(),
                                     "rank %d %s" % (s.rank, sl.parameter))
                else:
                    self.assertEqual(raw, np.ascontiguousarray(want).astype(dtype).tobytes(),
                                     "rank %d %s" % (s.rank, sl.parameter))


class TestDeposit(Base):
    def setUp(self):
        self.dir = os.path.join(TMP, self.id().rsplit(".", 1)[-1])
        os.makedirs(self.dir, exist_ok=True)
        self.file = os.path.join(self.dir, "model.safetensors")
        save(mlp_tensors(1), self.file)

    def one(self, names, fds, **kw):
        with SC.ShardClient(D.shard_socket, P) as sc:
            return sc.deposit(names, fds, **kw)[0]

    def test_token_and_split_frame(self):
        fd = os.open(self.file, os.O_RDONLY)
        try:
            r = self.one(["model.safetensors"], [fd])
            self.assertEqual(r.code, 0, r.message)
            self.assertRegex(r.checkpoint_token, r"^[0-9a-f]{32}$")
            r2 = self.one(["model.safetensors"], [fd], split=True)
            self.assertEqual(r2.code, 0, r2.message)
            self.assertNotEqual(r.checkpoint_token, r2.checkpoint_token)
        finally:
            os.close(fd)

    def test_refusals(self):
        fd = os.open(self.file, os.O_RDONLY)
        wfd = os.open(self.file, os.O_WRONLY)
        rp, wp = os.pipe()
        try:
            cases = [
                (["a.safetensors", "b.safetensors"], [fd], "names 2 files and carries 1"),
                (["model.safetensors"], [], "names 1 files and carries 0"),
                (["pipe.safetensors"], [rp], "is not a regular file"),
                (["w.safetensors"], [wfd], "is not open for reading"),
                (["../model.safetensors"], [fd], "without '/'"),
                ([".."], [fd], "without '/'"),
            ]
            for names, fds, text in cases:
                r = self.one(names, fds)
                self.assertEqual(r.code, 3, (names, r.message))
                self.assertIn(text, r.message)
                self.assertEqual(r.checkpoint_token, "")
            r = self.one(["model.safetensors"], [fd], tokens=["0" * 32])
            self.assertEqual(r.code, 3)
            self.assertIn("with shard tokens", r.message)
            # Descriptors with a token request: refused, and closed (the next request on the
            # connection is served).
            with SC.ShardClient(D.shard_socket, P) as sc:
                req = P.cls("familyd.v1.ShardFdRequest")(tokens=["0" * 32])
                payload = req.SerializeToString()
                sc.sock.sendmsg([struct.pack("<I", len(payload)) + payload],
                                [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                  struct.pack("i", fd))])
                reply = P.cls("familyd.v1.ShardFdReply").FromString(sc.recv_frame()[0])
                self.assertEqual(reply.code, 3, reply.message)
                again, _ = sc.request(["0" * 32])
                self.assertEqual(again.code, 5, again.message)
        finally:
            for x in (fd, wfd, rp, wp):
                os.close(x)


class TestHeldDescriptors(Base):
    def test_unfinished_frames_hold_at_most_1024_descriptors(self):
        """Frames whose body never comes hold the descriptors sent with them: at most 1,024
        over all connections (4 x 253 fit), the connection past it is closed, and the daemon's
        own descriptors stay bounded; once they go, deposits work again."""
        path = os.path.join(TMP, "held.safetensors")
        save(mlp_tensors(13), path)
        fd = os.open(path, os.O_RDONLY)
        socks = []
        try:
            before = len(os.listdir("/proc/%d/fd" % D.proc.pid))
            for i in range(5):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.settimeout(10)
                s.connect(D.shard_socket)
                # A header announcing 100 bytes, and 253 descriptors; no body.
                s.sendmsg([struct.pack("<I", 100)],
                          [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                            struct.pack("253i", *([fd] * 253)))])
                socks.append(s)
            # One of them (the daemon reads them in any order) is closed; four stay open.
            time.sleep(0.5)
            closed = 0
            for s in socks:
                s.setblocking(False)
                try:
                    closed += s.recv(1) == b""
                except BlockingIOError:
                    pass
            self.assertEqual(closed, 1)
            held = len(os.listdir("/proc/%d/fd" % D.proc.pid)) - before
            self.assertLessEqual(held, 1024 + 8)
            self.assertGreaterEqual(held, 4 * 253)
        finally:
            for s in socks:
                s.close()
            os.close(fd)
        self.assertRegex(self.deposit(path), "^[0-9a-f]{32}$")


class TestBuild(Base):
    @classmethod
    def setUpClass(cls):
        cls.dir = os.path.join(TMP, "build")
        cls.tensors = mlp_tensors(2)
        cls.split = split_dir(cls.tensors, os.path.join(cls.dir, "split"))
        cls.single = os.path.join(cls.dir, "single.safetensors")
        save(cls.tensors, cls.single)
        cls.bf16 = os.path.join(cls.dir, "bf16.safetensors")
        cls.bf16_values = save_bf16(mlp_tensors(3), cls.bf16)

    def test_tp2_split_files_byte_equal(self):
        b = self.build(request(self.deposit(self.split), mesh([("tp", 2)])))
        self.assertEqual(len(b.shards), 2)
        self.check_values(b, self.tensors)
        # The reply names each parameter's checkpoint tensors (ParameterLayout.checkpoint).
        self.assertEqual({p.name: p.checkpoint for p in b.info.layout.parameters},
                         {n: "{prefix}.%s.weight" % n
                          for n in ("gate_proj", "up_proj", "down_proj")})

    def test_dp_tp_single_file_and_bytes_read(self):
        before = daemon_rchar()
        b = self.build(request(self.deposit(self.single), mesh([("dp", 2), ("tp", 2)]),
                               private=True))
        read = daemon_rchar() - before
        self.check_values(b, self.tensors)
        # Replicas share: the node's shards need two distinct ranks' bytes, each read once.
        need = sum(v.nbytes for v in self.tensors.values())
        self.assertGreaterEqual(read, need)
        self.assertLessEqual(read, need * 1.01 + 64 * 1024, "read %d for %d" % (read, need))

    def test_four_processes_one_build_one_read(self):
        """4 processes deposit and Build the same member from the same (uncached) files at
        once: one build, and the daemon's storage reads (/proc/PID/io read_bytes) are within
        1% of what the node's shards need."""
        path = os.path.join(self.dir, "four.safetensors")
        rng = np.random.default_rng(12)
        big = {"%s.%s.weight" % (PREFIX, n): rng.standard_normal(s).astype(np.float32)
               for n, s in [("gate_proj", (512, 256)), ("up_proj", (512, 256)),
                            ("down_proj", (256, 512))]}
        save(big, path)
        with open(path, "rb") as f:
            os.fsync(f.fileno())
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        mid = mesh([("dp", 2), ("tp", 2)])
        before = daemon_io()
        procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--build-once",
                                   D.socket, D.shard_socket, path, mid],
                                  stdout=subprocess.PIPE, text=True) for _ in range(4)]
        outs = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
        after = daemon_io()
        for o in outs:
            self.assertEqual(o["code"], "OK", o)
        ids = {o["build_id"] for o in outs}
        self.assertEqual(len(ids), 1, outs)
        need = sum(v.nbytes for v in big.values())
        read = after["read_bytes"] - before["read_bytes"]
        self.assertGreaterEqual(read, need * 0.99, after)
        self.assertLessEqual(read, need * 1.01, "read %d for %d" % (read, need))
        # Every caller released its reference when it exited; the build goes with its grace.
        D.client.call(RELEASE, build_id=ids.pop(), force=True)

    def test_bf16_file_into_float32(self):
        b = self.build(request(self.deposit(self.bf16), mesh([("tp", 2)])))
        self.check_values(b, self.bf16_values)

    def test_float32_file_into_bfloat16(self):
        b = self.build(request(self.deposit(self.single), mesh([("tp", 2)]), dtypes="bfloat16"))
        self.check_values(b, self.tensors, dtype="bf16")

    def test_same_files_share_one_build(self):
        mid = mesh([("tp", 2)])
        reqs = [request(self.deposit(self.split), mid) for _ in range(4)]
        self.assertEqual(len({r.checkpoint.token for r in reqs}), 4)
        results = [None] * 4

        def call(i):
            results[i] = D.client.call(BUILD, reqs[i], timeout=60)
        threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for r in results:
            self.assertTrue(r.ok, r.message)
        ids = {r.reply.build.build_id for r in results}
        self.assertEqual(len(ids), 1, ids)
        self.addCleanup(D.client.call, RELEASE, build_id=ids.pop(), force=True)
        # Another prefix, or a seeded Build of the same request, is another build.
        seeded = request("", mid)
        seeded.ClearField("checkpoint")
        other = self.build(seeded)
        self.assertNotEqual(other.build_id, results[0].reply.build.build_id)

    def test_changed_file_is_a_new_build(self):
        path = os.path.join(self.dir, "changing.safetensors")
        mid = mesh([("tp", 2)])
        first = mlp_tensors(10)
        save(first, path)
        a = self.build(request(self.deposit(path), mid))
        self.check_values(a, first)
        second = mlp_tensors(11)
        save(second, path + ".new")
        os.replace(path + ".new", path)
        b = self.build(request(self.deposit(path), mid))
        self.assertNotEqual(a.build_id, b.build_id)
        self.check_values(b, second)

    def test_names_parameters(self):
        """CheckpointRef.names "parameters": tensors named as the member's parameters, after
        the prefix (no registry names needed); another names value is refused."""
        by_name = {"blk.%s" % k.rsplit(".", 2)[-2]: v for k, v in self.tensors.items()}
        path = os.path.join(self.dir, "by-name.safetensors")
        save(by_name, path)
        b = self.build(request(self.deposit(path), mesh([("tp", 2)]), prefix="blk",
                               names="parameters"))
        self.check_values(b, self.tensors)
        ones = os.path.join(self.dir, "weight.safetensors")
        save({"weight": np.arange(HIDDEN, dtype=np.float32)}, ones)
        b = self.build(request(self.deposit(ones), None, family="no_names", prefix="",
                               names="parameters"))
        got = shards(b)[b.shards[0].rank][:HIDDEN * 4]
        self.assertEqual(got, np.arange(HIDDEN, dtype=np.float32).tobytes())
        self.refused(request(self.deposit(path), None, names="fqn"), "INVALID_ARGUMENT",
                     "BAD_REQUEST", "checkpoint.names must be")
        # The registry's names do not fill from the by-name file.
        self.refused(request(self.deposit(path), mesh([("tp", 2)]), prefix="blk"),
                     "NOT_FOUND", "CHECKPOINT_TENSOR_MISSING", "'blk.gate_proj.weight'")

    def test_watch_build_reports_bytes_read(self):
        """BuildProgress of a Build from a checkpoint: bytes_to_read is what the shards need,
        bytes_read reaches it; a seeded Build reports neither."""
        req = request(self.deposit(self.single), mesh([("tp", 2)]), private=True)
        req.progress_tag = "ckpt-progress"
        b = self.build(req)
        res = D.client.stream_first("familyd.v1.FamilyService/WatchBuild",
                                    {"progressTag": "ckpt-progress"})
        self.assertTrue(res.ok, res.message)
        p = res.reply
        self.assertEqual(p.build_id, b.build_id)
        self.assertEqual(p.state, 2)  # BUILD_PROGRESS_STATE_DONE
        need = sum(v.nbytes for v in self.tensors.values())
        self.assertEqual((p.bytes_read, p.bytes_to_read), (need, need))
        seeded = request("", mesh([("tp", 2)]), private=True)
        seeded.ClearField("checkpoint")
        seeded.progress_tag = "seeded-progress"
        self.build(seeded)
        p = D.client.stream_first("familyd.v1.FamilyService/WatchBuild",
                                  {"progressTag": "seeded-progress"}).reply
        self.assertEqual((p.bytes_read, p.bytes_to_read), (0, 0))
        self.assertGreater(p.bytes_total, 0)

    def test_watch_build_counts_a_banded_tensor_once(self):
        """A writable dp=2 x tp=2 Build has no replicas: each dp rank reads its own halves of
        the row-sharded gate_proj and up_proj (each read twice), while down_proj, a column
        shard the node reads whole, is banded and read once for all four ranks (its two copies
        of each column half scattered from memory). bytes_to_read says so, bytes_read reaches
        it, and every rank holds the checkpoint's values."""
        req = request(self.deposit(self.single), mesh([("dp", 2), ("tp", 2)]), private=True)
        req.writable = True
        req.progress_tag = "ckpt-banded-once"
        b = self.build(req)
        self.assertEqual(len(b.shards), 4)
        self.check_values(b, self.tensors)
        p = D.client.stream_first("familyd.v1.FamilyService/WatchBuild",
                                  {"progressTag": "ckpt-banded-once"}).reply
        self.assertEqual(p.state, 2)  # BUILD_PROGRESS_STATE_DONE
        t = {n.rsplit(".", 2)[-2]: v.nbytes for n, v in self.tensors.items()}
        need = 2 * (t["gate_proj"] + t["up_proj"]) + t["down_proj"]
        self.assertEqual((p.bytes_read, p.bytes_to_read), (need, need))

    def test_wide_column_shards_read_straight_into_place(self):
        """down_proj's column halves of 2 KiB a row (hidden 16, intermediate 1024): large
        enough runs for its band to be read straight into both ranks' slices (one preadv),
        where the narrow tensors above go through memory; the values are the file's."""
        wide = mlp_tensors(21, hidden=16, inter=1024)
        path = os.path.join(self.dir, "wide.safetensors")
        save(wide, path)
        b = self.build(request(self.deposit(path), mesh([("tp", 2)]), private=True,
                               config=dict(CONFIG, hidden_size=16, intermediate_size=1024)))
        self.check_values(b, wide)

    def test_bands_of_many_runs(self):
        """down_proj [5000, 1024] (20 MB, rows of 4 KiB) over tp=2: two bands (4096 rows, then
        the 904 left), each more runs (two a row) than one preadv takes (IOV_MAX, 1024): 8
        calls for the first band, 2 for the second, straight into both ranks' halves. The
        row-sharded gate_proj and up_proj halves (10 MB each) are 3 reads of 4 MiB or less per
        rank. The values are the file's."""
        import test_metrics_common as M
        port = int(D.extra_args[1].rsplit(":", 1)[1])
        big = mlp_tensors(22, hidden=5000, inter=1024)
        path = os.path.join(self.dir, "many-runs.safetensors")
        save(big, path)
        config = dict(CONFIG, hidden_size=5000, intermediate_size=1024)
        before = M.value(M.parse(M.scrape(port)[1]), "familyd_checkpoint_reads_total")
        b = self.build(request(self.deposit(path), mesh([("tp", 2)]), private=True,
                               config=config))
        after = M.value(M.parse(M.scrape(port)[1]), "familyd_checkpoint_reads_total")
        self.check_values(b, big)
        half = 512 * 5000 * 4
        rows_reads = 2 * 2 * -(-half // (4 << 20))
        band_reads = -(-4096 * 2 // 1024) + -(-904 * 2 // 1024)
        self.assertEqual((rows_reads, band_reads), (12, 10))
        self.assertEqual(after - before, rows_reads + band_reads)
        D.client.call(RELEASE, build_id=b.build_id, force=True)

    def test_metrics_count_bytes_read(self):
        import test_metrics_common as M
        port = int(D.extra_args[1].rsplit(":", 1)[1])
        status = "familyd.v1.AdminService/GetStatus"
        m0 = M.parse(M.scrape(port)[1])
        before = M.value(m0, "familyd_checkpoint_read_bytes_total")
        st0 = D.client.call(status).reply
        b = self.build(request(self.deposit(self.single), mesh([("tp", 4)]), private=True))
        m1 = M.parse(M.scrape(port)[1])
        after = M.value(m1, "familyd_checkpoint_read_bytes_total")
        st1 = D.client.call(status).reply
        self.assertEqual(len(b.shards), 4)
        self.check_values(b, self.tensors)
        need = sum(v.nbytes for v in self.tensors.values())
        self.assertEqual(after - before, need)
        # gate_proj and up_proj are row shards: one read per rank each. down_proj is a column
        # shard (a quarter of every row per rank) that the node reads whole: banded, one read
        # of its 64 whole rows for all four ranks, not one per row and rank (4 x 64).
        reads = (M.value(m1, "familyd_checkpoint_reads_total") -
                 M.value(m0, "familyd_checkpoint_reads_total"))
        self.assertEqual(reads, 2 * 4 + 1)
        self.assertEqual(st1.checkpoint_bytes_read - st0.checkpoint_bytes_read, need)
        self.assertEqual(st1.shard_socket, D.shard_socket)


class TestRefusals(Base):
    @classmethod
    def setUpClass(cls):
        cls.dir = os.path.join(TMP, "bad")
        os.makedirs(cls.dir, exist_ok=True)
        cls.tensors = mlp_tensors(4)
        cls.good = os.path.join(cls.dir, "good.safetensors")
        save(cls.tensors, cls.good)
        cls.mesh = mesh([("tp", 2)])

    def bad(self, name, status, reason, *texts, prefix=PREFIX, **kw):
        return self.refused(request(self.deposit(os.path.join(self.dir, name)), self.mesh,
                                    prefix=prefix, **kw), status, reason, *texts)

    def test_truncated(self):
        with open(self.good, "rb") as f:
            data = f.read()
        with open(os.path.join(self.dir, "trunc.safetensors"), "wb") as f:
            f.write(data[:len(data) - 100])
        self.bad("trunc.safetensors", "FAILED_PRECONDITION", "CHECKPOINT_INVALID",
                 "checkpoint file trunc.safetensors")

    def test_header_past_end(self):
        raw_file(os.path.join(self.dir, "past.safetensors"), {}, length=1 << 20)
        self.bad("past.safetensors", "FAILED_PRECONDITION", "CHECKPOINT_INVALID",
                 "past.safetensors")

    def test_header_100mb(self):
        path = os.path.join(self.dir, "huge.safetensors")
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", 100 * 1000 * 1000 + 8))
            f.truncate(100 * 1000 * 1000 + 32)
        self.bad("huge.safetensors", "FAILED_PRECONDITION", "CHECKPOINT_INVALID",
                 "huge.safetensors")

    def test_headers_over_the_total(self):
        # Three files each declaring a 99 MB header (sparse): refused before any is read.
        d = os.path.join(self.dir, "headers")
        os.makedirs(d, exist_ok=True)
        for i in range(3):
            with open(os.path.join(d, "part-%d.safetensors" % i), "wb") as f:
                f.write(struct.pack("<Q", 99 * 1000 * 1000))
                f.truncate(99 * 1000 * 1000 + 64)
        self.bad("headers", "FAILED_PRECONDITION", "CHECKPOINT_INVALID",
                 "headers declare 297000000 bytes in all, over the limit of 268435456")

    def test_overlapping_offsets(self):
        h = {"%s.gate_proj.weight" % PREFIX: {"dtype": "F32", "shape": [2],
                                               "data_offsets": [0, 8]},
             "%s.up_proj.weight" % PREFIX: {"dtype": "F32", "shape": [2],
                                             "data_offsets": [4, 12]}}
        raw_file(os.path.join(self.dir, "overlap.safetensors"), h, b"\0" * 12)
        self.bad("overlap.safetensors", "FAILED_PRECONDITION", "CHECKPOINT_INVALID",
                 "overlap.safetensors")

    def test_shape_disagrees_with_bytes(self):
        h = {"x": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}
        raw_file(os.path.join(self.dir, "shape.safetensors"), h, b"\0" * 8)
        self.bad("shape.safetensors", "FAILED_PRECONDITION", "CHECKPOINT_INVALID",
                 "shape.safetensors", 'tensor "x"')

    def test_missing_tensor(self):
        t = dict(self.tensors)
        del t["%s.up_proj.weight" % PREFIX]
        save(t, os.path.join(self.dir, "missing.safetensors"))
        self.bad("missing.safetensors", "NOT_FOUND", "CHECKPOINT_TENSOR_MISSING",
                 "'%s.up_proj.weight'" % PREFIX)
        # The same through a prefix the checkpoint lacks.
        self.refused(request(self.deposit(self.good), self.mesh, prefix="model.layers.9.mlp"),
                     "NOT_FOUND", "CHECKPOINT_TENSOR_MISSING", "model.layers.9.mlp.")

    def test_wrong_shape(self):
        t = dict(self.tensors)
        t["%s.down_proj.weight" % PREFIX] = np.zeros((HIDDEN, INTER + 1), np.float32)
        save(t, os.path.join(self.dir, "wrong.safetensors"))
        self.bad("wrong.safetensors", "FAILED_PRECONDITION", "CHECKPOINT_SHAPE",
                 "'%s.down_proj.weight'" % PREFIX, "[%d, %d]" % (HIDDEN, INTER + 1))

    def test_dtype_does_not_convert(self):
        t = dict(self.tensors)
        t["%s.gate_proj.weight" % PREFIX] = np.zeros((INTER, HIDDEN), np.int64)
        save(t, os.path.join(self.dir, "ints.safetensors"))
        self.bad("ints.safetensors", "FAILED_PRECONDITION", "CHECKPOINT_DTYPE",
                 "'%s.gate_proj.weight'" % PREFIX, "I64")

    def test_index_names_missing_file(self):
        d = split_dir(self.tensors, os.path.join(self.dir, "gone"))
        os.unlink(os.path.join(d, "model-00002-of-00002.safetensors"))
        self.bad("gone", "FAILED_PRECONDITION", "CHECKPOINT_INVALID",
                 "model.safetensors.index.json", "model-00002-of-00002.safetensors")

    def test_index_names_outside(self):
        d = split_dir(self.tensors, os.path.join(self.dir, "outside"))
        with open(os.path.join(d, "model.safetensors.index.json")) as f:
            index = json.load(f)
        name = next(iter(index["weight_map"]))
        index["weight_map"][name] = "../x.safetensors"
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump(index, f)
        self.bad("outside", "FAILED_PRECONDITION", "CHECKPOINT_INVALID",
                 "model.safetensors.index.json", "../x.safetensors")

    def test_no_materialize(self):
        self.refused(request(self.deposit(self.good), self.mesh, materialize=False),
                     "INVALID_ARGUMENT", "BINDING", "must materialise")

    def test_family_without_names(self):
        self.refused(request(self.deposit(self.good), None, family="no_names"),
                     "FAILED_PRECONDITION", "CHECKPOINT_NAMES", "'weight'", "'no_names'")

    def test_unknown_token(self):
        self.refused(request("0" * 32, self.mesh), "NOT_FOUND", "CHECKPOINT_TOKEN",
                     "checkpoint token unknown")
        self.refused(request("x" * 300, self.mesh), "INVALID_ARGUMENT", "LIMIT")


class TestGpu(Base):
    """Ranks in GPU memory (the tests' fake CUDA driver, two GPUs): the bytes a second
    process imports through libfamilyd (the fake's import probe) are the host build's."""

    def test_gpu_ranks_equal_host_ranks(self):
        import test_cuda_fake as CF
        if not os.path.exists(CF.FAKE) or not os.path.exists(CF.PROBE):
            self.fail("the fake libcuda or the import probe was not built")
        path = os.path.join(TMP, "gpu.safetensors")
        tensors = mlp_tensors(8)
        save(tensors, path)
        g = CF.EnvDaemon(CF.gpu_env(), registry=D.registry, protos=P, host_devices=None)
        g.start()
        try:
            res = g.client.call("familyd.v1.MeshService/CreateMesh",
                                {"mesh": {"deviceMesh": [{"name": "tp", "size": "2"}],
                                          "ranks": ["0", "1"]}})
            req = request(SC.deposit(g.shard_socket, P, path), res.reply.mesh_id)
            built = g.client.call(BUILD, req, timeout=60)
            self.assertTrue(built.ok, built.message)
            b = built.reply.build
            self.assertEqual({s.device_kind for s in b.shards}, {"cuda"})
            out = os.path.join(g.tmpdir, "probe")
            os.makedirs(out)
            p = subprocess.run([CF.PROBE, g.socket, b.build_id, out], capture_output=True,
                               text=True, timeout=60,
                               env=dict(os.environ, FAMILYD_CUDA_DRIVER=CF.FAKE))
            self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
            host = self.build(request(self.deposit(path), mesh([("tp", 2)])))
            want = shards(host)
            for s in b.shards:
                with open(os.path.join(out, "rank-%d.bin" % s.rank), "rb") as f:
                    self.assertEqual(f.read(s.size_bytes), want[s.rank][:s.size_bytes],
                                     "rank %d" % s.rank)
        finally:
            g.stop_checked()


class TestOtherUid(Base):
    """nobody deposits what it can open; root cannot build from nobody's token, nor can
    nobody deposit root's 0600 file (its own open fails: the daemon opens nothing)."""

    @classmethod
    def setUpClass(cls):
        global COPY
        if COPY is None:
            COPY = other_uid.harness_copy(os.path.abspath(__file__), prefix="fd-ckpt-uid-")
        cls.dir = os.path.join(TMP, "uid")
        os.makedirs(cls.dir, exist_ok=True)
        os.chmod(cls.dir, 0o755)
        cls.public = os.path.join(cls.dir, "public.safetensors")
        save(mlp_tensors(5), cls.public)
        os.chmod(cls.public, 0o644)
        cls.private = os.path.join(cls.dir, "private.safetensors")
        save(mlp_tensors(6), cls.private)
        os.chmod(cls.private, 0o600)
        argv = ["setpriv", "--reuid", str(NOBODY), "--regid", str(NOBODY), "--clear-groups",
                other_uid.other_uid_python(), COPY.path(os.path.basename(__file__)),
                "--client", D.shard_socket]
        cls.client = other_uid.LineClient(argv, COPY)
        # Before test_per_uid_limit fills nobody's share of deposits.
        cls.nobody_deposit = cls.client.send({"op": "deposit", "path": cls.public})

    @classmethod
    def tearDownClass(cls):
        cls.client.close()

    def test_tokens_are_their_uid_s(self):
        got = self.nobody_deposit
        self.assertTrue(got.get("token"), got)
        self.refused(request(got["token"], mesh([("tp", 2)])), "NOT_FOUND", "CHECKPOINT_TOKEN")

    def test_per_uid_limit(self):
        # nobody's deposits (this class's): up to 64, the next refused; root deposits on.
        got = self.client.send({"op": "fill", "path": self.public, "count": 70})
        self.assertEqual(got["codes"].count(0), 64 - got["held"], got)
        self.assertEqual(got["codes"][-1], 8, got)
        self.assertIn("as many checkpoint deposits as one user may (64", got["message"])
        self.assertTrue(self.deposit(self.public))

    def test_cannot_deposit_what_it_cannot_open(self):
        got = self.client.send({"op": "deposit", "path": self.private})
        self.assertEqual(got.get("error"), "EACCES", got)


def client_main(shard_socket):
    """nobody's side: deposits the files it can open, JSON lines in and out."""
    protos = H.Protos()
    held = [0]  # deposits made before a fill
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd.get("op") == "exit":
            return 0
        if cmd.get("op") == "fill":
            codes, message = [], ""
            fd = os.open(cmd["path"], os.O_RDONLY)
            for _ in range(cmd["count"]):
                with SC.ShardClient(shard_socket, protos) as sc:
                    r, _ = sc.deposit([os.path.basename(cmd["path"])], [fd])
                codes.append(r.code)
                message = r.message or message
            os.close(fd)
            sys.stdout.write(json.dumps({"codes": codes, "message": message,
                                         "held": held[0]}) + "\n")
            sys.stdout.flush()
            continue
        try:
            ans = {"token": SC.deposit(shard_socket, protos, cmd["path"])}
            held[0] += 1
        except PermissionError:
            ans = {"error": "EACCES"}
        except Exception as e:  # noqa: BLE001 - reported to the test, which fails on it
            ans = {"error": repr(e)}
        sys.stdout.write(json.dumps(ans) + "\n")
        sys.stdout.flush()
    return 0


def build_once(sock, shard_sock, path, mesh_id):
    """One process's deposit and Build (root's, this test's Python): a JSON line."""
    global P
    P = H.Protos()
    client = H.Client(sock, P)
    res = client.call(BUILD, request(SC.deposit(shard_sock, P, path), mesh_id,
                                     config=BIG_CONFIG), timeout=120)
    print(json.dumps({"code": res.code, "message": res.message,
                      "build_id": res.reply.build.build_id if res.ok else ""}))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--build-once":
        sys.exit(build_once(*sys.argv[2:]))
    if len(sys.argv) >= 3 and sys.argv[1] == "--client":
        sys.exit(client_main(sys.argv[2]))
    unittest.main(verbosity=2)
