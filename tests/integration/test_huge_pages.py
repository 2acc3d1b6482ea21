#!/usr/bin/python3
"""Shards on huge pages (--huge-pages; docs/operating.md "Huge pages") with the real daemon, as
root.

The test reserves hugetlb pages for its own run (vm.nr_hugepages, put back at the end, under
the lock file test-huge-pages and test-shard-populate hold too) and runs the daemon in its
default mode, auto:
- with pages reserved, a Build's host shard is a hugetlb memfd: the mapping client (this
  process, through the Python module) sees KernelPageSize 2048 kB and Shared_Hugetlb pages in
  its /proc/self/smaps; the handout's size and RankShard.allocation_bytes are the rank's bytes
  rounded up to 2 MiB, the pages come out of HugePages_Free, and the bytes past the rank's end
  are zero;
- the same request built on normal pages (no free huge pages left) gives the very same bytes;
- a copy-on-write mapping (mode "private") of a shard that took the last huge pages maps
  without a reservation and reads the same bytes;
- auto falls back to normal pages and logs why exactly once, however many fall back;
- GetStatus counts the rounded bytes against --shm-budget;
- under auto, a segment smaller than one huge page stays on normal pages, at its own size;
- under a service manager (fake_manager.py) hugetlb segments go into the fd store and a
  daemon killed and started again re-adopts them, same bytes, still on huge pages.
require and never, which need the option of the command line, are tested in-process by
tests/unit/test-huge-pages.c (require without pages: the HUGE_PAGES sentence).
"""

import fcntl
import os
import shutil
import signal
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
from smaps import mapping_fields as smaps_of  # noqa: E402
import test_durability_util as U  # noqa: E402
from fake_manager import FakeManager  # noqa: E402
from test_durability_fdstore import ManagedDaemon  # noqa: E402

MiB = 1 << 20
NR_HUGEPAGES = "/proc/sys/vm/nr_hugepages"
LOCK_PATH = "/tmp/familyd-test-huge-pages.lock"
FALLBACK = "Huge pages: a shard segment of"

REGISTRY_YAML = """\
# test_huge_pages: one float32 parameter of n elements, random values.
families:
  - name: blob
    baseline: hp.Blob
    default_variant: plain
    variants:
      plain:
        constructor: hp.BlobLocal
        accepts: [config]
    parameters:
      data:
        shape: [n]
        init: {normal: {std: 0.02}}
"""

N_FLOATS = 3 * MiB // 4 + 5    # 3 MiB + 20 bytes: rounds to 3 MiB + 64, then to 4 MiB


def read_int(path):
    with open(path) as f:
        return int(f.read().split()[0])


def write_int(path, v):
    with open(path, "w") as f:
        f.write("%d\n" % v)


def meminfo(field):
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return None


LOCK = None
SAVED = None
TMP = None
REGISTRY = None


def setUpModule():
    global LOCK, SAVED, TMP, REGISTRY
    if os.geteuid() != 0 or not os.access(NR_HUGEPAGES, os.W_OK) or meminfo("Hugepagesize") != 2048:
        raise unittest.SkipTest("needs root and 2 MiB huge pages")
    LOCK = open(LOCK_PATH, "a+")
    fcntl.flock(LOCK, fcntl.LOCK_EX)
    SAVED = read_int(NR_HUGEPAGES)
    TMP = tempfile.TemporaryDirectory(prefix="fd-huge-")
    REGISTRY = os.path.join(TMP.name, "registry")
    os.mkdir(REGISTRY)
    with open(os.path.join(REGISTRY, "blob.yaml"), "w") as f:
        f.write(REGISTRY_YAML)


def tearDownModule():
    if SAVED is not None:
        write_int(NR_HUGEPAGES, SAVED)
    if TMP is not None:
        TMP.cleanup()
    if LOCK is not None:
        LOCK.close()


class HugePagesTest(unittest.TestCase):
    def setUp(self):
        write_int(NR_HUGEPAGES, 0)
        self.d = H.Daemon(registry=REGISTRY, host_devices=1, node_name="huge-node",
                          extra_args=["--shm-budget", str(64 * MiB)])
        self.d.start()
        self.c = familyd.Client(self.d.socket, timeout=30)

    def tearDown(self):
        self.c.close()
        try:
            self.d.stop()
        finally:
            self.d.cleanup()
            write_int(NR_HUGEPAGES, 0)

    def build(self):
        return self.c.build("blob", config={"n": N_FLOATS}, seed=7, private_build=True)

    def in_use(self):
        st = self.c.call("familyd.v1.AdminService/GetStatus",
                         self.c.protos.cls("familyd.v1.GetStatusRequest")())
        return st.shm_bytes_in_use

    def test_huge_then_normal_same_bytes_fallback_logged_once(self):
        write_int(NR_HUGEPAGES, 2)
        self.assertEqual(meminfo("HugePages_Free"), 2)
        huge = self.build()
        rt = huge.ranks[0]
        size_bytes = huge.message.shards[0].size_bytes
        self.assertEqual(size_bytes, 3 * MiB + 64)
        self.assertEqual(rt.size, 4 * MiB)
        self.assertEqual(huge.message.shards[0].allocation_bytes, 4 * MiB)
        sm = smaps_of(rt.mmap)
        self.assertEqual(sm.get("KernelPageSize"), 2048, sm)
        # Populated on mapping: both huge pages are in this process's page tables.
        self.assertEqual(sm.get("Shared_Hugetlb", 0) + sm.get("Private_Hugetlb", 0), 4096, sm)
        self.assertEqual(meminfo("HugePages_Free"), 0)
        self.assertEqual(bytes(rt.mmap[size_bytes:]), bytes(4 * MiB - size_bytes))
        self.assertNotIn(FALLBACK, self.d.stderr())

        # No free huge page left: the same request goes on normal pages, same bytes.
        normal = self.build()
        self.assertNotEqual(normal.id, huge.id)
        nt = normal.ranks[0]
        self.assertEqual(nt.size, size_bytes)
        self.assertEqual(normal.message.shards[0].allocation_bytes, size_bytes)
        self.assertEqual(smaps_of(nt.mmap).get("KernelPageSize"), 4)
        self.assertEqual(bytes(nt.mmap[:size_bytes]), bytes(rt.mmap[:size_bytes]))
        self.assertNotEqual(bytes(nt.mmap[:64]), bytes(64))

        # Auto's fallback says why, once, however many segments fall back.
        again = self.build()
        for b in (huge, normal, again):
            b.close()
            b.release()
        log = self.d.stderr()
        self.assertEqual(log.count(FALLBACK), 1, log)
        self.assertIn("Huge pages: a shard segment of %d bytes is on normal pages: its 2 huge "
                      "pages of 2048 kB could not be reserved (0 of 2 free)" % size_bytes, log)
        self.assertIn("(--huge-pages auto; logged once)", log)

    def test_copy_on_write_mapping_with_every_huge_page_taken(self):
        # A frozen module's mapping (mode "private") of a shard whose segment took the last
        # huge pages: the pool has none to reserve for copies, so the client maps it without
        # a reservation instead of failing with ENOMEM, and reads the daemon's bytes.
        write_int(NR_HUGEPAGES, 2)
        ro = self.c.build("blob", config={"n": N_FLOATS}, seed=9)
        self.assertEqual(meminfo("HugePages_Free"), 0)
        cow = self.c.build("blob", config={"n": N_FLOATS}, seed=9, mode="private")
        self.assertEqual(cow.id, ro.id)
        size_bytes = ro.message.shards[0].size_bytes
        pt = cow.ranks[0]
        self.assertEqual(smaps_of(pt.mmap).get("KernelPageSize"), 2048)
        self.assertEqual(bytes(pt.mmap[:size_bytes]), bytes(ro.ranks[0].mmap[:size_bytes]))
        self.assertNotEqual(bytes(pt.mmap[:64]), bytes(64))
        for b in (cow, ro):
            b.close()
            b.release()

    def test_small_segment_stays_on_normal_pages(self):
        # A shard smaller than one huge page (a norm's weight) would waste most of a 2 MiB
        # page: auto keeps it on normal pages, silently, with pages free.
        write_int(NR_HUGEPAGES, 2)
        b = self.c.build("blob", config={"n": 1000}, seed=7, private_build=True)
        self.assertEqual(b.message.shards[0].allocation_bytes, b.message.shards[0].size_bytes)
        self.assertLess(b.message.shards[0].size_bytes, 2 * MiB)
        self.assertEqual(smaps_of(b.ranks[0].mmap).get("KernelPageSize"), 4)
        self.assertEqual(meminfo("HugePages_Free"), 2)
        self.assertNotIn(FALLBACK, self.d.stderr())
        b.close()
        b.release()

    def test_no_huge_pages_reserved_logs_why(self):
        b = self.build()
        self.assertEqual(b.ranks[0].size, 3 * MiB + 64)
        self.assertEqual(smaps_of(b.ranks[0].mmap).get("KernelPageSize"), 4)
        b.close()
        b.release()
        self.assertIn("Huge pages: a shard segment of %d bytes is on normal pages: the host has "
                      "no huge pages reserved (vm.nr_hugepages is 0) (--huge-pages auto; logged "
                      "once)." % (3 * MiB + 64), self.d.stderr())

    def test_budget_counts_the_rounding(self):
        write_int(NR_HUGEPAGES, 2)
        b = self.build()
        self.assertEqual(b.ranks[0].size, 4 * MiB)
        # What --shm-budget counts: the segment's 4 MiB, not the rank's 3 MiB + 64.
        self.assertEqual(self.in_use(), 4 * MiB)
        b.close()
        self.assertTrue(self.c.release_build(b.id, force=True))
        self.assertEqual(self.in_use(), 0)


class HugePagesModesTest(unittest.TestCase):
    """--huge-pages require and never, through the daemon's own option."""

    def daemon(self, mode):
        d = H.Daemon(registry=REGISTRY, host_devices=1, node_name="huge-node",
                     extra_args=["--shm-budget", str(64 * MiB), "--huge-pages", mode])
        self.addCleanup(d.cleanup)
        self.addCleanup(d.stop)   # before the pages go back (cleanups run last first)
        return d

    def setUp(self):
        self.addCleanup(write_int, NR_HUGEPAGES, 0)

    def test_require_without_reserved_pages_refuses_to_start(self):
        write_int(NR_HUGEPAGES, 0)
        tmp = H.short_tmpdir("fd-huge-")
        self.addCleanup(shutil.rmtree, tmp, True)
        status, out, _ = H.run_to_exit(
            [H.familyd_bin(), "--socket", os.path.join(tmp, "s.sock"), "--registry", REGISTRY,
             "--host-devices", "1", "--huge-pages", "require"], timeout=30)
        self.assertEqual(status, 1, out)
        self.assertIn("--huge-pages require: the host has no huge pages reserved "
                      "(vm.nr_hugepages is 0); reserve some, or use --huge-pages auto", out)
        self.assertFalse(os.path.exists(os.path.join(tmp, "s.sock")))

    def test_require_fails_a_build_past_the_free_pages(self):
        write_int(NR_HUGEPAGES, 2)
        d = self.daemon("require")
        d.start()
        c = familyd.Client(d.socket, timeout=30)
        self.addCleanup(c.close)
        first = c.build("blob", config={"n": N_FLOATS}, seed=7, private_build=True)
        self.assertEqual(first.ranks[0].size, 4 * MiB)
        self.assertEqual(smaps_of(first.ranks[0].mmap).get("KernelPageSize"), 2048)
        with self.assertRaises(familyd.FamilydError) as cm:
            c.build("blob", config={"n": N_FLOATS}, seed=8, private_build=True)
        e = cm.exception
        self.assertEqual((e.code_name, e.reason), ("RESOURCE_EXHAUSTED", "HUGE_PAGES"), e)
        # The bytes the segment would take: 3 MiB + 64 rounded up to whole pages.
        self.assertEqual(e.message, "out of huge pages for %d bytes: 0 of 2 reserved pages of "
                         "2048 kB free (--huge-pages require)" % (4 * MiB))
        self.assertNotIn(FALLBACK, d.stderr())
        first.close()
        first.release()

    def test_never_stays_on_normal_pages(self):
        write_int(NR_HUGEPAGES, 2)
        d = self.daemon("never")
        d.start()
        c = familyd.Client(d.socket, timeout=30)
        self.addCleanup(c.close)
        b = c.build("blob", config={"n": N_FLOATS}, seed=7, private_build=True)
        self.assertEqual(b.ranks[0].size, 3 * MiB + 64)
        self.assertEqual(smaps_of(b.ranks[0].mmap).get("KernelPageSize"), 4)
        self.assertEqual(meminfo("HugePages_Free"), 2)
        self.assertNotIn(FALLBACK, d.stderr())   # never is not a fallback
        b.close()
        b.release()


class HugePagesRestartTest(unittest.TestCase):
    def setUp(self):
        self.tmp = H.short_tmpdir()
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.addCleanup(write_int, NR_HUGEPAGES, 0)
        self.daemons = []

    def tearDown(self):
        for d in self.daemons:
            if d.alive():
                d.stop()

    def start(self, m):
        mark = m.mark()
        # require: the build's small shards go on huge pages too (auto keeps a segment under
        # one huge page on normal pages).
        d = ManagedDaemon(m, self.tmp, extra_args=["--huge-pages", "require"])
        self.daemons.append(d)
        d.start()
        m.wait_for("READY", "1", after=mark)
        return d

    def read_huge(self, d, b):
        """{rank: bytes} of b's shards, each checked to be a hugetlb memfd of 2 MiB; mapped
        and unmapped whole (the handout's size: a hugetlb mapping unmaps whole pages only)."""
        reply, fds = U.fetch(d, b)
        self.assertEqual(reply.code, U.STATUS_OK, reply.message)
        out = {}
        for (rank, fd), size in zip(sorted(fds.items()), reply.sizes):
            try:
                self.assertEqual(os.fstat(fd).st_blksize, 2 * MiB)
                self.assertEqual(size, 2 * MiB)
                h = fshard.ShardHandle(os.dup(fd), size, "host", 0, False)
                with h:
                    mm = h.map()
                    out[rank] = bytes(mm)
                    mm.close()
            finally:
                os.close(fd)
        return out

    def test_fd_store_restart_keeps_huge_shards(self):
        write_int(NR_HUGEPAGES, 32)
        m = FakeManager(self.tmp)
        self.addCleanup(m.close)
        d1 = self.start(m)
        b = U.build(self, d1, materialize={"seed": 9})
        ranks = [s for s in b.shards if s.token]
        self.assertTrue(ranks)
        before = self.read_huge(d1, b)
        self.assertEqual(len(before), len(ranks))

        d1.client.close()
        d1.client = None
        d1.proc.send_signal(signal.SIGKILL)
        d1.proc.wait()

        d2 = self.start(m)
        self.assertRegex(d2.stderr(), r"Re-adopted 1 build")
        self.assertEqual(self.read_huge(d2, b), before)


if __name__ == "__main__":
    unittest.main()
