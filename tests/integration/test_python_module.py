#!/usr/bin/python3
"""The Python client module (client/python/familyd) against the real daemon.

Checks: Client.build returns numpy arrays whose bytes equal the shard bytes this test fetches
and maps on its own; bfloat16 as uint16 bits; zero copy (the arrays view the mapping; two
writable mappings of one shard see each other's writes); release keeps mappings valid;
resolve and create_mesh; the shard socket's refusal as ShardError; and the example
client/python/examples/moe_forward.py exits 0. torch checks run only when torch imports.
"""

import array
import mmap
import os
import socket
import struct
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402

PYDIR = os.path.join(H.SOURCE_ROOT, "client", "python")
sys.path.insert(0, PYDIR)

try:
    import numpy as np
except ImportError:  # pragma: no cover - depends on the machine
    sys.stderr.write("test_python_module: numpy missing (apt-get install python3-numpy)\n")
    sys.exit(1 if os.environ.get("CI") else H.SKIP)

os.environ.setdefault("FAMILYD_DESCRIPTORS", H.descriptor_set_path())
import familyd  # noqa: E402

try:
    import torch
except ImportError:
    torch = None

REGISTRY = os.path.join(H.SOURCE_ROOT, "deploy", "registry")
EXAMPLE = os.path.join(PYDIR, "examples", "moe_forward.py")
CONFIG = {"hidden_size": 64, "moe_intermediate_size": 32, "num_experts": 4,
          "initializer_range": 0.02}
D = None
C = None


def setUpModule():
    global D, C
    D = H.Daemon(registry=REGISTRY, host_devices=8, node_name="py-node")
    D.start()
    C = familyd.Client(D.socket, timeout=30)


def tearDownModule():
    if C is not None:
        C.close()
    if D is None:
        return
    try:
        D.stop()
    finally:
        D.cleanup()


def independent_bytes(path, token):
    """The whole shard of token, read through this test's own shard socket client."""
    P = D.protos
    payload = P.cls("familyd.v1.ShardFdRequest")(tokens=[token]).SerializeToString()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    fds = []
    try:
        s.connect(path)
        s.sendall(struct.pack("<I", len(payload)) + payload)
        buf = b""
        while len(buf) < 4 or len(buf) < 4 + struct.unpack("<I", buf[:4])[0]:
            data, anc, _, _ = s.recvmsg(65536, socket.CMSG_SPACE(4 * 253))
            for lvl, typ, cd in anc:
                if lvl == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
                    a = array.array("i")
                    a.frombytes(cd[:len(cd) - len(cd) % 4])
                    fds += list(a)
            if not data:
                raise AssertionError("shard socket closed early")
            buf += data
        n = struct.unpack("<I", buf[:4])[0]
        reply = P.cls("familyd.v1.ShardFdReply").FromString(buf[4:4 + n])
        assert reply.code == 0 and len(fds) == 1, (reply, fds)
        with mmap.mmap(fds[0], reply.sizes[0], flags=mmap.MAP_SHARED, prot=mmap.PROT_READ) as m:
            return bytes(m)
    finally:
        for fd in fds:
            os.close(fd)
        s.close()


class TestPythonModule(unittest.TestCase):
    def check_against_shards(self, b, np_dtype):
        self.assertTrue(b.ranks)
        for shard in b.message.shards:
            if not shard.token:
                self.assertNotIn(shard.rank, b.ranks)
                continue
            raw = independent_bytes(b.shard_socket, shard.token)
            rt = b.ranks[shard.rank]
            self.assertEqual(set(rt), {"gate_up_proj", "down_proj"})
            for sl in shard.slices:
                arr = rt[sl.parameter]
                self.assertEqual(arr.shape, tuple(sl.local_shape))
                self.assertEqual(arr.dtype, np.dtype(np_dtype))
                self.assertEqual(arr.tobytes(), raw[sl.byte_offset:sl.byte_offset + sl.byte_length])

    def test_build_float32_no_mesh(self):
        with C.build("grouped_experts", config=CONFIG, seed=3) as b:
            self.assertEqual(sorted(b.ranks), [0])
            self.check_against_shards(b, "float32")
            w = b.ranks[0]["gate_up_proj"]
            self.assertEqual(w.shape, (4, 64, 64))
            self.assertFalse(w.flags.writeable)    # read-only mapping
            self.assertFalse(w.flags.owndata)
            self.assertTrue(np.isfinite(w).all())
            self.assertLess(abs(float(w.std()) - 0.02), 0.005)

    def test_build_bf16_on_mesh(self):
        mesh = C.create_mesh({"ep": 2}, ranks=[0, 1])
        self.assertTrue(mesh.mesh_id)
        with C.build("grouped_experts", config=CONFIG, mesh_id=mesh.mesh_id, dtype="bfloat16",
                     seed=3, mode="private") as b:
            self.assertEqual(b.dtype_of("gate_up_proj"), "bfloat16")
            self.assertEqual(sorted(b.ranks), [0, 1])
            self.check_against_shards(b, "uint16")
            self.assertEqual(b.ranks[1]["down_proj"].shape, (2, 32, 64))
            # The assembled tensor does not depend on the layout: bf16 of the float32 build.
            with C.build("grouped_experts", config=CONFIG, seed=3) as f:
                full = f.ranks[0]["gate_up_proj"]
                both = np.concatenate([b.ranks[0]["gate_up_proj"], b.ranks[1]["gate_up_proj"]])
                back = (both.astype(np.uint32) << 16).view(np.float32)
                np.testing.assert_allclose(back, full, rtol=2 ** -8, atol=0)
            if torch is not None:
                t = b.ranks[1].torch()["gate_up_proj"]
                self.assertEqual(t.dtype, torch.bfloat16)
                self.assertEqual(t.data_ptr(), b.ranks[1]["gate_up_proj"].ctypes.data)

    def test_ranks_subset(self):
        mesh = C.create_mesh({"ep": 4}, ranks=[0, 1, 2, 3])
        with C.build("grouped_experts", config=CONFIG, mesh_id=mesh.mesh_id, ranks=[2]) as b:
            self.assertEqual(sorted(b.ranks), [2])
            self.assertEqual(len(b.message.shards), 4)
            self.check_against_shards(b, "float32")

    def test_zero_copy_writable(self):
        b = C.build("grouped_experts", config=CONFIG, writable=True)
        other = C.open_build(b.id, writable=True)      # a second fetch, a second mapping
        try:
            rt = b.ranks[0]
            w = rt["down_proj"]
            self.assertTrue(w.flags.writeable)
            # The array views the mapping itself.
            whole = np.frombuffer(rt.mmap, dtype=np.uint8)
            self.assertTrue(np.shares_memory(w, whole))
            sl = [s for s in rt.slices if s.parameter == "down_proj"][0]
            # Writes through the array show in the other mapping, and the other way round.
            w[0, 0, 0] = 42.5
            self.assertEqual(float(other.ranks[0]["down_proj"][0, 0, 0]), 42.5)
            struct.pack_into("<f", other.ranks[0].mmap, sl.byte_offset + 4, -7.25)
            self.assertEqual(float(w[0, 0, 1]), -7.25)
            if torch is not None:
                t = rt.torch()["down_proj"]
                t[0, 0, 2] = 3.0
                self.assertEqual(float(w[0, 0, 2]), 3.0)
            # And in the bytes anyone else fetches.
            token = [s for s in b.message.shards if s.rank == 0][0].token
            raw = independent_bytes(b.shard_socket, token)
            self.assertEqual(struct.unpack_from("<ff", raw, sl.byte_offset), (42.5, -7.25))
        finally:
            other.close()
            b.release()
            b.close()

    def test_release_keeps_mappings(self):
        b = C.build("grouped_experts", config=CONFIG)
        w = b.ranks[0]["gate_up_proj"]
        before = w.copy()
        # Freed at once (force: this process's reference alone would leave it in its grace
        # period, test_build_references.py), yet the mapping stays valid.
        self.assertTrue(b.release(force=True))
        with self.assertRaises(familyd.FamilydError) as cm:
            C.get_build(b.id)
        self.assertEqual(cm.exception.code_name, "NOT_FOUND")
        self.assertEqual(cm.exception.reason, "BUILD_NOT_FOUND")
        np.testing.assert_array_equal(w, before)
        b.close()
        del w

    def test_errors(self):
        with self.assertRaises(familyd.FamilydError) as cm:
            C.build("grouped_experts", config={"hidden_size": 64})
        self.assertEqual(cm.exception.code_name, "INVALID_ARGUMENT")
        with self.assertRaises(familyd.ShardError) as cm:
            familyd.fetch_shards(D.shard_socket, ["no-such-token"])
        self.assertNotEqual(cm.exception.code, 0)
        with self.assertRaises(ValueError):
            familyd.fetch_shards(D.shard_socket, [])

    def test_resolve(self):
        r = C.resolve("grouped_experts", arguments={"use_mxfp8": True}, ep_size=2)
        self.assertEqual(r.variant, "mxfp8")

    def test_example(self):
        env = dict(os.environ)
        env["FAMILYD_DESCRIPTORS"] = H.descriptor_set_path()
        for extra in ([], ["--ep", "2", "--dtype", "bf16"], ["--ep", "4", "--numpy"]):
            p = subprocess.run([sys.executable, EXAMPLE, "--socket", D.socket] + extra,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               stdin=subprocess.DEVNULL, timeout=120, env=env)
            out = p.stdout.decode()
            self.assertEqual(p.returncode, 0, "%s\n%s\n%s" % (extra, out, p.stderr.decode()))
            self.assertRegex(out, r"y\s+\[16, 64\]\s+sum=")
            self.assertIn("local experts", out)


if __name__ == "__main__":
    unittest.main(verbosity=2)
