#!/usr/bin/python3
"""The three mapping modes (docs/operating.md "Mapping modes") against the real daemon and real
processes.

- private: two trainer processes map the same shard MAP_PRIVATE and write into it: each sees
  its own writes only; the daemon's bytes (fetched afresh) and a read-only reader's view do not
  change; torch tensors of a private rank take in-place ops.
- read-only: numpy arrays are not writeable, .torch() raises ValueError naming the modes, and a
  writable descriptor of a build not made writable is refused (PERMISSION_DENIED) on the shard
  socket, in the Python client and in familyctl (--mode shared), while --mode private works.
- shared: a build made writable (mode="shared" sets BuildRequest.writable) hands out writable
  descriptors; two mappings see each other's writes, and so does a fresh fetch.
- the C library's mode names (familyctl shard --mode) and the Python client's refuse unknown
  modes.
"""

import json
import os
import struct
import subprocess
import sys
import textwrap
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402
import shard_client as SC  # noqa: E402

PYDIR = os.path.join(H.SOURCE_ROOT, "client", "python")
sys.path.insert(0, PYDIR)
os.environ.setdefault("FAMILYD_DESCRIPTORS", H.descriptor_set_path())
import numpy as np  # noqa: E402
import torch  # noqa: E402

import familyd  # noqa: E402

REGISTRY = os.path.join(H.SOURCE_ROOT, "deploy", "registry")
CONFIG = {"hidden_size": 64, "moe_intermediate_size": 32, "num_experts": 4,
          "initializer_range": 0.02}
D = None
C = None

# A trainer process: opens the build in a mode, then obeys lines on stdin ("write V": writes V
# at down_proj[0,0,0]; "read": prints down_proj[0,0,0]; "quit"), answering each with a line.
TRAINER = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    import familyd
    c = familyd.Client(sys.argv[2], timeout=30)
    b = c.open_build(sys.argv[3], mode=sys.argv[4])
    w = b.ranks[0]["down_proj"]
    print("ready", flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "write":
            w[0, 0, 0] = float(cmd[1])
            print("ok", flush=True)
        elif cmd[0] == "read":
            print(repr(float(w[0, 0, 0])), flush=True)
        else:
            break
""")


def setUpModule():
    global D, C
    D = H.Daemon(registry=REGISTRY, host_devices=2, node_name="map-node")
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


def fresh_bytes(build, rank=0):
    """The rank's whole shard, fetched and mapped read-only afresh: the daemon's bytes."""
    shard = [s for s in build.message.shards if s.rank == rank][0]
    reply, fds = SC.fetch(build.shard_socket, D.protos, [shard.token])
    try:
        assert reply.code == 0, reply.message
        mm = SC.map_readonly(fds[0], reply.sizes[0])
        try:
            return bytes(mm)
        finally:
            mm.close()
    finally:
        for fd in fds:
            os.close(fd)


def down_proj_first(build, raw):
    sl = [s for s in build.message.shards[0].slices if s.parameter == "down_proj"][0]
    return struct.unpack_from("<f", raw, sl.byte_offset)[0]


class Trainer:
    def __init__(self, build_id, mode):
        self.p = subprocess.Popen([sys.executable, "-c", TRAINER, PYDIR, D.socket, build_id, mode],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  env=dict(os.environ))
        self.expect("ready")

    def expect(self, what=None):
        line = self.p.stdout.readline().strip()
        if what is not None and line != what:
            raise AssertionError("trainer said %r, not %r" % (line, what))
        return line

    def say(self, line):
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()
        return self.expect()

    def close(self):
        try:
            self.p.stdin.write("quit\n")
            self.p.stdin.close()
        except BrokenPipeError:
            pass
        self.p.wait(timeout=30)
        self.p.stdout.close()


class TestPrivate(unittest.TestCase):
    def test_two_processes_write_their_own_copies(self):
        b = C.build("grouped_experts", config=CONFIG, seed=7, private_build=True)
        try:
            before = fresh_bytes(b)
            original = down_proj_first(b, before)
            a, z = Trainer(b.id, "private"), Trainer(b.id, "private")
            reader = Trainer(b.id, "read-only")
            try:
                self.assertEqual(a.say("write 11.5"), "ok")
                self.assertEqual(z.say("write -3.25"), "ok")
                self.assertEqual(a.say("read"), "11.5")
                self.assertEqual(z.say("read"), "-3.25")
                self.assertEqual(float(reader.say("read")), original)
                # This process's own read-only view, and the daemon's bytes, are unchanged.
                self.assertEqual(float(b.ranks[0]["down_proj"][0, 0, 0]), original)
                self.assertEqual(fresh_bytes(b), before)
            finally:
                for t in (a, z, reader):
                    t.close()
        finally:
            b.release()
            b.close()

    def test_private_torch_takes_inplace_ops(self):
        b = C.build("grouped_experts", config=CONFIG, seed=3, private_build=True,
                    mode="private")
        try:
            before = fresh_bytes(b)
            rt = b.ranks[0]
            self.assertEqual(rt.mode, "private")
            self.assertTrue(rt["down_proj"].flags.writeable)
            t = rt.torch()["down_proj"]
            t.mul_(2.0)
            t[0, 0, 0] = 5.0
            # Zero copy until written: the numpy array and the tensor share this mapping.
            self.assertEqual(float(rt["down_proj"][0, 0, 0]), 5.0)
            self.assertEqual(fresh_bytes(b), before)
        finally:
            b.release()
            b.close()


class TestReadOnly(unittest.TestCase):
    def setUp(self):
        self.b = C.build("grouped_experts", config=CONFIG, seed=5, private_build=True)

    def tearDown(self):
        self.b.release()
        self.b.close()

    def test_numpy_arrays_are_not_writeable(self):
        rt = self.b.ranks[0]
        self.assertEqual(rt.mode, "read-only")
        self.assertFalse(rt.writable)
        for arr in rt.values():
            self.assertFalse(arr.flags.writeable)
        with self.assertRaises(ValueError):
            rt["down_proj"][0, 0, 0] = 1.0

    def test_torch_refused_with_the_modes(self):
        with self.assertRaises(ValueError) as cm:
            self.b.ranks[0].torch()
        self.assertIn("private", str(cm.exception))
        self.assertIn("shared", str(cm.exception))

    def test_writable_descriptor_refused(self):
        self.assertFalse(self.b.message.writable)
        shard = self.b.message.shards[0]
        reply, fds = SC.fetch(self.b.shard_socket, D.protos, [shard.token], writable=True)
        self.assertEqual(fds, [])
        self.assertEqual(reply.code, 7)     # PERMISSION_DENIED
        self.assertIn("shard 1 of 1 is read-only", reply.message)
        self.assertIn("private", reply.message)
        with self.assertRaises(familyd.ShardError) as cm:
            C.open_build(self.b.id, mode="shared")
        self.assertEqual(cm.exception.code, 7)
        # Read-only and private fetches still work.
        reply, fds = SC.fetch(self.b.shard_socket, D.protos, [shard.token])
        self.assertEqual(reply.code, 0)
        for fd in fds:
            os.close(fd)

    def test_unknown_mode(self):
        with self.assertRaises(ValueError) as cm:
            C.open_build(self.b.id, mode="rw")
        self.assertIn("read-only, private, shared", str(cm.exception))


class TestShared(unittest.TestCase):
    def test_writable_build_shares_writes(self):
        b = C.build("grouped_experts", config=CONFIG, seed=9, mode="shared")
        other = C.open_build(b.id, mode="shared")
        try:
            self.assertTrue(b.message.writable)
            self.assertEqual(b.ranks[0].mode, "shared")
            w = b.ranks[0]["down_proj"]
            w[0, 0, 0] = 42.5
            self.assertEqual(float(other.ranks[0]["down_proj"][0, 0, 0]), 42.5)
            self.assertEqual(down_proj_first(b, fresh_bytes(b)), 42.5)
            t = other.ranks[0].torch()["down_proj"]
            t[0, 0, 0] = -1.5
            self.assertEqual(float(w[0, 0, 0]), -1.5)
        finally:
            other.close()
            b.release()
            b.close()

    def test_writable_and_read_only_builds_are_not_shared(self):
        # Writability is part of the sharing key: the same request, writable or not, gives
        # two builds.
        w = C.build("grouped_experts", config=CONFIG, seed=21, mode="shared")
        r = C.build("grouped_experts", config=CONFIG, seed=21)
        try:
            self.assertNotEqual(w.id, r.id)
            self.assertTrue(w.message.writable)
            self.assertFalse(r.message.writable)
        finally:
            for b in (w, r):
                b.release()
                b.close()


class TestFamilyctlModes(unittest.TestCase):
    def ctl(self, *args):
        return subprocess.run([H.familyctl_bin(), "--socket", D.socket] + list(args),
                              capture_output=True, text=True, timeout=60)

    def test_modes(self):
        b = C.build("grouped_experts", config=CONFIG, seed=11, private_build=True)
        try:
            for mode in ("read-only", "private"):
                r = self.ctl("shard", b.id, "0", "--mode", mode, "--json")
                self.assertEqual(r.returncode, 0, r.stderr)
                out = json.loads(r.stdout)
                self.assertEqual(out["mode"], mode)
                self.assertFalse(out["writable"])
            r = self.ctl("shard", b.id, "0", "--mode", "shared")
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("read-only", r.stderr)
            self.assertIn("PERMISSION_DENIED", r.stderr)
            r = self.ctl("shard", b.id, "0", "--mode", "rw")
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn("read-only, private or shared", r.stderr)
        finally:
            b.release()
            b.close()


if __name__ == "__main__":
    unittest.main(verbosity=2)
