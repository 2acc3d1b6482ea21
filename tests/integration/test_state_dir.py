#!/usr/bin/python3
"""Restart without loss, without a service manager: --state-dir on a tmpfs.

With --state-dir (docs/operating.md, "Restart without loss"), segments are files on a tmpfs and
their records sit beside them; a restarted daemon re-adopts them: the same build ids, tokens, bytes,
meshes and budget. Such files cannot be sealed, so shards are handed out read-only. A trainer's
mapping survives a SIGKILL of the daemon. Damaged records are logged and dropped; a full tmpfs
fails the Build with RESOURCE_EXHAUSTED and keeps nothing.

Every daemon here runs the real binary; clients are grpcio and the shard socket by hand.
"""

import os
import shutil
import signal
import struct
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402
import shard_client as SC  # noqa: E402
import test_durability_util as U  # noqa: E402

P = H.Protos()
MESH = {"deviceMesh": [{"name": "dp", "size": "2"}, {"name": "ep", "size": "4"}]}


class StateDirDaemon(H.Daemon):
    """A familyd with --state-dir STATE and a fixed shard socket path, so that the Build
    replies of two daemons on the same state compare byte for byte."""

    def __init__(self, state, tmpdir, extra_args=(), **kw):
        super().__init__(registry=U.REGISTRY, tmpdir=tmpdir, protos=P,
                         extra_args=["--state-dir", state] + list(extra_args), **kw)
        self.shard_socket = os.path.join(tmpdir, "shard.sock")


class StateDirTest(unittest.TestCase):
    def setUp(self):
        self.state = U.tmpfs_dir("fd-state-")
        if self.state is None:
            self.skipTest("no tmpfs to put a state dir on (/dev/shm, /run)")
        self.addCleanup(shutil.rmtree, self.state, True)
        self.tmp = H.short_tmpdir()
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.daemons = []

    def tearDown(self):
        # A clean stop of every daemon still running: exit 0, so the sanitizers' leak check
        # at exit (ASan builds) covers what the re-adoption allocated.
        for d in self.daemons:
            if d.alive():
                d.stop()

    def start(self, **kw):
        d = StateDirDaemon(self.state, self.tmp, **kw)
        self.daemons.append(d)
        return d.start()

    def kill(self, d):
        d.client.close()
        d.client = None
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait()

    def files(self):
        return sorted(os.listdir(self.state))

    def build_some(self, d):
        mesh_id = U.create_mesh(self, d.client, MESH)
        on_mesh = U.build(self, d, mesh_id=mesh_id,
                          materialize={"dtype": "bf16", "seed": 7})
        alone = U.build(self, d, materialize={"seed": 3})
        plain = U.build(self, d)
        return mesh_id, on_mesh, alone, plain

    # -----------------------------------------------------------------------------------------

    def test_sigkill_keeps_builds_tokens_bytes_and_mappings(self):
        d1 = self.start()
        mesh_id, on_mesh, alone, plain = self.build_some(d1)
        before = U.view(self, d1)
        self.assertEqual(before["ids"], [on_mesh.build_id, alone.build_id, plain.build_id])
        bytes_before = U.read_shards(self, d1, on_mesh)
        self.assertEqual(len(bytes_before), 8)

        # A trainer holds a mapping of rank 5's shard across the crash.
        reply, fds = U.fetch(d1, on_mesh)
        self.assertEqual(reply.code, U.STATUS_OK, reply.message)
        size5 = [s.size_bytes for s in on_mesh.shards if s.rank == 5][0]
        held = SC.map_readonly(fds[5], size5)
        for fd in fds.values():
            os.close(fd)

        # Segments and records are files in the state dir: a segment per distinct shard, ranks
        # 4-7 (dp=1) being replicas of ranks 0-3 (docs/sharing.md, "Replicas").
        names = self.files()
        for s in on_mesh.shards:
            name = "shard-%s-%d" % (on_mesh.build_id, s.rank)
            if s.rank < 4:
                self.assertIn(name, names)
            else:
                self.assertNotIn(name, names)
        for b in (on_mesh, alone, plain):
            self.assertIn("meta-" + b.build_id, names)
        self.assertIn("meta-" + mesh_id, names)

        self.kill(d1)
        self.assertEqual(bytes(held), bytes_before[5], "a mapping changed when the daemon died")

        d2 = self.start()
        self.assertEqual(U.view(self, d2), before)
        self.assertRegex(d2.stderr(), r"Re-adopted 3 builds and 1 mesh from the state dir")
        # The same tokens redeem the same bytes.
        self.assertEqual(U.read_shards(self, d2, on_mesh), bytes_before)
        self.assertEqual(set(U.read_shards(self, d2, alone)), {0})
        self.assertEqual(bytes(held), bytes_before[5])
        held.close()

        # The re-adopted build still counts on its mesh, and Validate knows it.
        res = d2.client.call("familyd.v1.MeshService/DeleteMesh", mesh_id=mesh_id)
        self.assertEqual(res.code, "FAILED_PRECONDITION", res)
        res = U.ok(self, d2.client.call("familyd.v1.FamilyService/Validate", {
            "boundaries": [{"fqns": ["experts"], "buildId": on_mesh.build_id}],
            "context": {"meshId": mesh_id}}))
        self.assertTrue(res.ok, res)

        # New ids never repeat re-adopted ones.
        fresh = U.build(self, d2, materialize={})
        self.assertNotIn(fresh.build_id, before["ids"])

        # The test process held its materialised builds before the kill and lives on: it holds
        # them after the restart with no call, so none waits out a grace period; a layout-only
        # build is held as before references.
        for b, holders in ((on_mesh, [os.getpid()]), (alone, [os.getpid()]), (plain, [])):
            got = U.ok(self, d2.client.call("familyd.v1.FamilyService/GetBuild",
                                            build_id=b.build_id))
            self.assertEqual([r.pid for r in got.references], holders)
            self.assertEqual(got.grace_deadline_unix_ms, 0, got)

    def test_shards_are_read_only_in_this_mode(self):
        d = self.start()
        b = U.build(self, d, materialize={}, writable=True)
        reply, fds = U.fetch(d, b, writable=True)
        self.assertEqual(fds, {})
        self.assertEqual(reply.code, U.STATUS_FAILED_PRECONDITION, reply)
        self.assertEqual(reply.message,
                         "shard 1 of 1 is read-only: it is kept in a --state-dir file, which "
                         "cannot be sealed against resizing, so it is never handed out writable")
        # A read-only one maps; a writable mapping of it is refused by the kernel.
        reply, fds = U.fetch(d, b)
        self.assertEqual(reply.code, U.STATUS_OK)
        fd = fds[0]
        self.addCleanup(os.close, fd)
        with self.assertRaises(OSError):
            SC.map_writable(fd, b.shards[0].size_bytes)
        with self.assertRaises(OSError):
            os.ftruncate(fd, 0)

    def test_release_removes_files_and_stays_released(self):
        d1 = self.start()
        mesh_id, on_mesh, alone, plain = self.build_some(d1)
        U.ok(self, d1.client.call("familyd.v1.FamilyService/ReleaseBuild",
                                  build_id=on_mesh.build_id, force=True))
        self.assertEqual([n for n in self.files() if on_mesh.build_id in n], [])
        U.ok(self, d1.client.call("familyd.v1.FamilyService/ReleaseBuild",
                                  build_id=plain.build_id, force=True))
        self.assertNotIn("meta-" + plain.build_id, self.files())
        # A deleted mesh's record goes too.
        other = U.create_mesh(self, d1.client, {"deviceMesh": [{"name": "tp", "size": "8"}]})
        self.assertIn("meta-" + other, self.files())
        U.ok(self, d1.client.call("familyd.v1.MeshService/DeleteMesh", mesh_id=other))
        self.assertNotIn("meta-" + other, self.files())
        before = U.view(self, d1)
        d1.stop()

        d2 = self.start()
        after = U.view(self, d2)
        self.assertEqual(after, before)
        self.assertEqual(after["ids"], [alone.build_id])
        res = d2.client.call("familyd.v1.FamilyService/GetBuild", build_id=on_mesh.build_id)
        self.assertEqual(res.code, "NOT_FOUND")
        reply, fds = U.fetch(d2, on_mesh)
        self.assertEqual((reply.code, fds), (5, {}))

    def test_damaged_records_are_dropped_and_the_daemon_starts(self):
        d1 = self.start()
        mesh_id, on_mesh, alone, plain = self.build_some(d1)
        self.kill(d1)

        # One bit flipped in a build's record: its checksum fails.
        path = os.path.join(self.state, "meta-" + alone.build_id)
        with open(path, "r+b") as f:
            f.seek(40)
            b = f.read(1)
            f.seek(40)
            f.write(bytes([b[0] ^ 1]))
        # A record of a later format (version 99), its checksum right: unknown, dropped.
        version99 = os.path.join(self.state, "meta-bld-00000000-99")
        with open(os.path.join(self.state, "meta-" + plain.build_id), "rb") as f:
            data = bytearray(f.read())
        data[8:12] = struct.pack("<I", 99)
        data[24:28] = struct.pack("<I", crc32c(bytes(data[:24]) + bytes(data[32:])))
        with open(version99, "wb") as f:
            f.write(data)
        # Garbage, and a segment no record names.
        with open(os.path.join(self.state, "meta-bld-garbage"), "wb") as f:
            f.write(b"not a record at all")
        with open(os.path.join(self.state, "shard-bld-00000000-7-0"), "wb") as f:
            f.write(b"\0" * 4096)
        # Not ours: left alone.
        with open(os.path.join(self.state, "README"), "w") as f:
            f.write("operator's note\n")

        d2 = self.start()
        err = d2.stderr()
        self.assertRegex(err, r"Dropping the state record meta-%s: checksum mismatch"
                         % alone.build_id)
        self.assertRegex(err, r"Dropping the state record meta-bld-00000000-99: written by "
                              r"another familyd: record version 99, this familyd reads version 1")
        self.assertRegex(err, r"Dropping the state record meta-bld-garbage: not a familyd "
                              r"state record")
        self.assertRegex(err, r"Dropping shard-bld-00000000-7-0: no kept build names it")
        ids = U.view(self, d2)["ids"]
        self.assertEqual(ids, [on_mesh.build_id, plain.build_id])
        self.assertEqual(self.files(), sorted(
            ["README", "meta-" + mesh_id, "meta-" + on_mesh.build_id, "meta-" + plain.build_id,
             "metarep-" + on_mesh.build_id] +
            ["shard-%s-%d" % (on_mesh.build_id, r) for r in range(4)]))

    def test_mutated_records_never_crash_the_daemon(self):
        """Records damaged behind their checksum (recomputed): every one is refused by the
        decoder's own checks or by its name, the daemon starts and keeps the good ones."""
        import random
        d1 = self.start()
        mesh_id, on_mesh, alone, plain = self.build_some(d1)
        before = U.view(self, d1)
        d1.stop()

        rng = random.Random(6)
        sources = [os.path.join(self.state, "meta-" + x) for x in
                   (on_mesh.build_id, alone.build_id, mesh_id)]
        n = 0
        for src in sources:
            with open(src, "rb") as f:
                good = f.read()
            for _ in range(60):
                data = bytearray(good)
                how = rng.randrange(4)
                if how == 0:        # a few bytes of the body changed
                    for _ in range(rng.randrange(1, 4)):
                        data[rng.randrange(32, len(data))] = rng.randrange(256)
                elif how == 1:      # cut short, the header's length kept right
                    data = data[:rng.randrange(32, len(data))]
                    data[16:24] = struct.pack("<Q", len(data) - 32)
                elif how == 2:      # a section's length changed
                    pos = 32
                    for _ in range(rng.randrange(3)):
                        if pos + 8 <= len(data):
                            pos += 8 + struct.unpack("<I", data[pos + 4:pos + 8])[0]
                    if pos + 8 <= len(data):
                        data[pos + 4:pos + 8] = struct.pack("<I", rng.randrange(1 << 16))
                else:               # a byte inside a protobuf length or tag
                    data[rng.randrange(32, min(len(data), 96))] ^= 1 << rng.randrange(8)
                data[24:28] = struct.pack("<I", crc32c(bytes(data[:24]) + bytes(data[32:])))
                n += 1
                with open(os.path.join(self.state, "meta-bld-mut-%d" % n), "wb") as f:
                    f.write(data)

        d2 = self.start()
        self.assertEqual(U.view(self, d2), before)
        self.assertEqual(d2.stderr().count("Dropping the state record meta-bld-mut-"), n)
        self.assertEqual([f for f in self.files() if "mut" in f], [])

    def test_kept_builds_count_against_todays_limits(self):
        d1 = self.start()
        mesh_id, on_mesh, alone, plain = self.build_some(d1)
        used = U.view(self, d1)["status"][2]
        self.kill(d1)

        # Fewer builds and bytes allowed now than are kept: all come back, new ones wait.
        d2 = self.start(extra_args=["--max-builds", "2", "--shm-budget", str(used + 4096)])
        self.assertEqual(len(U.view(self, d2)["ids"]), 3)
        st = U.ok(self, d2.client.call("familyd.v1.AdminService/GetStatus"))
        self.assertEqual((st.builds, st.shm_bytes_in_use), (3, used))
        # Re-adopted materialised builds wait out a grace period, and such builds give way to
        # new ones (test_build_references.py); pinned, they hold their slots.
        for b in (on_mesh, alone):
            U.ok(self, d2.client.call("familyd.v1.FamilyService/PinBuild", build_id=b.build_id))
        res = d2.client.call("familyd.v1.FamilyService/Build", U.build_request(P))
        self.assertEqual((res.code, res.message),
                         ("RESOURCE_EXHAUSTED", "build limit reached: 2 builds"))
        for b in (on_mesh, alone):
            U.ok(self, d2.client.call("familyd.v1.FamilyService/ReleaseBuild",
                                      build_id=b.build_id, force=True))
        st = U.ok(self, d2.client.call("familyd.v1.AdminService/GetStatus"))
        self.assertEqual((st.builds, st.shm_bytes_in_use), (1, 0))
        U.build(self, d2, materialize={})

    def test_missing_segment_drops_its_build(self):
        d1 = self.start()
        mesh_id, on_mesh, alone, plain = self.build_some(d1)
        self.kill(d1)
        os.unlink(os.path.join(self.state, "shard-%s-3" % on_mesh.build_id))

        d2 = self.start()
        self.assertRegex(d2.stderr(), r"Dropping build %s kept by an earlier run: its shard "
                                      r"shard-%s-3 is missing" % (on_mesh.build_id,
                                                                  on_mesh.build_id))
        self.assertEqual(U.view(self, d2)["ids"], [alone.build_id, plain.build_id])
        self.assertEqual([n for n in self.files() if on_mesh.build_id in n], [])
        # Its mesh stays (it has a record of its own), no longer used.
        U.ok(self, d2.client.call("familyd.v1.MeshService/DeleteMesh", mesh_id=mesh_id))

    def test_lost_mesh_record_comes_back_from_its_build(self):
        d1 = self.start()
        mesh_id, on_mesh, alone, plain = self.build_some(d1)
        before = U.view(self, d1)
        self.kill(d1)
        os.unlink(os.path.join(self.state, "meta-" + mesh_id))

        d2 = self.start()
        self.assertIn("Mesh %s had no record of its own; put back from build %s."
                      % (mesh_id, on_mesh.build_id), d2.stderr())
        # Counted as ListMeshes and GetStatus show it: one mesh, though it had no record.
        self.assertRegex(d2.stderr(), r"Re-adopted 3 builds and 1 mesh from the state dir")
        meshes = U.ok(self, d2.client.call("familyd.v1.MeshService/ListMeshes")).meshes
        self.assertEqual([m.mesh_id for m in meshes], [mesh_id])
        self.assertEqual(U.ok(self, d2.client.call("familyd.v1.AdminService/GetStatus")).meshes,
                         1)
        self.assertEqual(U.view(self, d2), before)
        self.assertIn("meta-" + mesh_id, self.files())

    def test_second_daemon_on_the_same_state_dir_refuses_to_start(self):
        self.start()
        other = H.short_tmpdir()
        self.addCleanup(shutil.rmtree, other, True)
        d2 = StateDirDaemon(self.state, other)
        self.daemons.append(d2)
        d2.spawn()
        self.assertEqual(d2.proc.wait(30), 1)
        self.assertIn("Another familyd uses the state dir %s, refusing to start." % self.state,
                      d2.stderr())


class NotTmpfsTest(unittest.TestCase):
    def test_state_dir_on_disk_is_said_and_keeps_nothing(self):
        base = None
        for cand in ("/var/tmp", os.path.dirname(os.path.abspath(H.familyd_bin())), "/tmp"):
            if os.path.isdir(cand) and os.access(cand, os.W_OK) and \
                    U.fs_type(cand) not in ("tmpfs", "ramfs", ""):
                base = cand
                break
        if base is None:
            self.skipTest("no directory off tmpfs to try")
        import tempfile
        state = tempfile.mkdtemp(prefix="fd-disk-state-", dir=base)
        self.addCleanup(shutil.rmtree, state, True)
        tmp = H.short_tmpdir()
        self.addCleanup(shutil.rmtree, tmp, True)
        with StateDirDaemon(state, tmp) as d:
            self.assertIn("--state-dir %s is on %s, not a tmpfs or ramfs: shards kept there "
                          "would be written to disk. Nothing is kept across restarts"
                          % (state, U.fs_type(state).replace("ext2/ext3", "ext2/ext3/ext4")),
                          d.stderr())
            b = U.build(self, d, materialize={}, writable=True)
            # Nothing persists: plain sealed memfds, writable handouts as without --state-dir.
            reply, fds = U.fetch(d, b, writable=True)
            for fd in fds.values():
                os.close(fd)
            self.assertEqual(reply.code, U.STATUS_OK, reply.message)
            self.assertEqual(os.listdir(state), [])


def crc32c(data):
    crc = 0xffffffff
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82f63b78 if crc & 1 else crc >> 1
    return crc ^ 0xffffffff


class FullTmpfsTest(unittest.TestCase):
    """A tmpfs of 256 KiB mounted in the daemon's own mount namespace (unshare -m; CI is root)."""

    SIZE = 256 * 1024

    def setUp(self):
        probe = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                                "d=$(mktemp -d) && mount -t tmpfs -o size=64k tmpfs \"$d\" && "
                                "umount \"$d\" && rmdir \"$d\""],
                               capture_output=True, text=True)
        if probe.returncode != 0:
            self.skipTest("cannot mount a tmpfs in a private mount namespace (unshare -m needs "
                          "root or CAP_SYS_ADMIN): %s" % probe.stderr.strip())
        self.tmp = H.short_tmpdir()
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.state = os.path.join(self.tmp, "state")
        os.mkdir(self.state)

    def test_full_tmpfs_fails_the_build_and_keeps_nothing(self):
        size = self.SIZE
        state = self.state

        class Namespaced(StateDirDaemon):
            def argv(self):
                return ["unshare", "-m", "--propagation", "private", "sh", "-c",
                        'mount -t tmpfs -o size=%d,mode=0700 tmpfs "$0" && exec "$@"' % size,
                        state] + super().argv()

        d = Namespaced(state, self.tmp)
        self.addCleanup(d.cleanup)
        d.start()
        # The daemon's view of its state dir, through its own mount namespace.
        inside = "/proc/%d/root%s" % (d.proc.pid, state)
        self.assertEqual(U.fs_type(inside), "tmpfs")

        small = U.build(self, d, materialize={})
        self.assertLess(small.shards[0].size_bytes, size // 4)
        before = U.view(self, d)
        files = sorted(os.listdir(inside))

        big = {"num_experts": 64, "hidden_size": 64, "moe_intermediate_size": 32,
               "initializer_range": 0.02}
        res = d.client.call("familyd.v1.FamilyService/Build",
                            U.build_request(P, config=big, materialize={}))
        self.assertEqual(res.code, "RESOURCE_EXHAUSTED", res)
        self.assertRegex(res.message, r"^no space left in the state dir %s for the build's "
                                      r"\d+ bytes of shards; nothing was kept$" % state)
        _, infos = d.client.error_details(res)
        self.assertEqual([i.reason for i in infos], ["STATE_DIR_FULL"])
        self.assertEqual(sorted(os.listdir(inside)), files, "a failed Build left files")
        self.assertEqual(U.view(self, d), before)

        # Still serving, and a build that fits still goes through.
        self.assertTrue(d.client.health().ok)
        again = U.build(self, d, materialize={"seed": 1})
        self.assertIn("meta-" + again.build_id, os.listdir(inside))
        d.stop()


if __name__ == "__main__":
    unittest.main(verbosity=2)
