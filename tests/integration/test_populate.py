#!/usr/bin/python3
"""Populated mappings (docs/operating.md "Mapping modes"): the Python client maps a real daemon's
shards with every page in this process's page tables before the first read, unless asked to be lazy.

Residency is read from /proc/self/smaps (the mapping's Rss), not mincore(): a shard's pages are
in memory from the daemon's fill on, so mincore() reports every page of any mapping of them as
resident, touched or not; what populating changes is this process's page tables, which Rss
counts. The C library's same choice (familyd_shard_map_flags, FAMILYD_MAP_LAZY) is tested over
real memfds by tests/unit/test-shard-populate.c.
"""

import ctypes
import ctypes.util
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402

PYDIR = os.path.join(H.SOURCE_ROOT, "client", "python")
sys.path.insert(0, PYDIR)
os.environ.setdefault("FAMILYD_DESCRIPTORS", H.descriptor_set_path())
import familyd  # noqa: E402
from familyd import shard as fshard  # noqa: E402
from smaps import resident_kib as rss_kib  # noqa: E402

MiB = 1 << 20
N_FLOATS = 24 * MiB     # 96 MiB: two populating threads' worth (64 MiB each at most)

REGISTRY_YAML = """\
# test_populate: one float32 parameter of n elements, all 1.0.
families:
  - name: blob
    baseline: pop.Blob
    default_variant: plain
    variants:
      plain:
        constructor: pop.BlobLocal
        accepts: [config]
    parameters:
      data:
        shape: [n]
        init: {constant: {value: 1.0}}
"""

D = None
C = None
TMP = None
LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
LIBC.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]


def mincore_resident(mm):
    n = (len(mm) + os.sysconf("SC_PAGESIZE") - 1) // os.sysconf("SC_PAGESIZE")
    vec = ctypes.create_string_buffer(n)
    if LIBC.mincore(fshard._address(mm), len(mm), vec) != 0:
        raise OSError(ctypes.get_errno(), "mincore")
    return sum(b & 1 for b in vec.raw)


def setUpModule():
    global D, C, TMP
    TMP = tempfile.TemporaryDirectory(prefix="fd-pop-")
    reg = os.path.join(TMP.name, "registry")
    os.mkdir(reg)
    with open(os.path.join(reg, "blob.yaml"), "w") as f:
        f.write(REGISTRY_YAML)
    D = H.Daemon(registry=reg, host_devices=1, node_name="pop-node",
                 extra_args=["--shm-budget", str(512 * MiB)])
    D.start()
    C = familyd.Client(D.socket, timeout=60)


def tearDownModule():
    if C is not None:
        C.close()
    try:
        if D is not None:
            D.stop()
    finally:
        if D is not None:
            D.cleanup()
        if TMP is not None:
            TMP.cleanup()


class PopulateTest(unittest.TestCase):
    def setUp(self):
        self.b = C.build("blob", config={"n": N_FLOATS}, map_shards=False)
        self.addCleanup(C.release_build, self.b.id, True)

    def handle(self):
        (h,) = fshard.fetch(self.b.shard_socket, [s.token for s in self.b.message.shards],
                            protos=C.protos)
        self.addCleanup(h.close)
        return h

    def test_populated_by_default(self):
        h = self.handle()
        mm = h.map()
        self.addCleanup(mm.close)
        self.assertEqual(rss_kib(mm), h.size // 1024)
        self.assertEqual(mm[h.size - 4:h.size], b"\x00\x00\x80\x3f")

    def test_lazy_touches_nothing(self):
        h = self.handle()
        mm = h.map(lazy=True)
        self.addCleanup(mm.close)
        self.assertEqual(rss_kib(mm), 0)
        # mincore cannot tell the two apart: the daemon's fill put every page in memory.
        self.assertEqual(mincore_resident(mm), (h.size + mmap_page() - 1) // mmap_page())
        self.assertEqual(mm[0:4], b"\x00\x00\x80\x3f")
        self.assertGreater(rss_kib(mm), 0)
        self.assertLess(rss_kib(mm), h.size // 1024)
        fshard.populate(mm)
        self.assertEqual(rss_kib(mm), h.size // 1024)

    def test_private_populated_without_copies(self):
        h = self.handle()
        mm = h.map("private")
        self.addCleanup(mm.close)
        self.assertEqual(rss_kib(mm), h.size // 1024)
        mm[0:4] = b"\x00\x00\x00\x40"
        self.assertEqual(self.handle().map()[0:4], b"\x00\x00\x80\x3f")

    def test_build_and_open_build_choose(self):
        b = C.open_build(self.b.id)
        self.addCleanup(b.close)
        self.assertEqual(rss_kib(b.ranks[0].mmap), b.ranks[0].size // 1024)
        lazy = C.open_build(self.b.id, lazy=True)
        self.addCleanup(lazy.close)
        self.assertEqual(rss_kib(lazy.ranks[0].mmap), 0)
        self.assertEqual(float(lazy.ranks[0]["data"][N_FLOATS - 1]), 1.0)


def mmap_page():
    return os.sysconf("SC_PAGESIZE")


if __name__ == "__main__":
    unittest.main()
