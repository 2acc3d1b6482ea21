#!/usr/bin/python3
"""Restart without loss under a service manager: systemd's file-descriptor store.

Under a service manager every shard segment and the record of every live build and mesh go into
the manager's fd store (FDSTORE=1, FDNAME=shard-<build>-<rank> and meta-<id>); a daemon started
again with those descriptors (LISTEN_FDS, LISTEN_FDNAMES) serves the same builds, tokens and
bytes. Released builds leave the store. --fdstore-max bounds what familyd stores: a Build past
it is refused with RESOURCE_EXHAUSTED, never left unprotected. What holds a build (processes,
pin, key) is a record of its own, metarep-<id>.<generation>, replaced by the next generation
at each change: only the newest stays in the store, and a restart gives it back.

No systemd as PID 1 here: fake_manager.py plays the manager (its notify socket, its fd store,
and the restart that passes the store back).
"""

import os
import shutil
import signal
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402
import shard_client as SC  # noqa: E402
import test_build_sharing as S  # noqa: E402
from test_build_sharing import Holder  # noqa: E402
import test_durability_util as U  # noqa: E402
import other_uid  # noqa: E402
from fake_manager import FakeManager  # noqa: E402

# Another process's request on the shard socket: prints the reply's code and message.
HANDOUT_PROBE = """
import sys
sys.path.insert(0, %r)
import familyd_harness as H
import shard_client as SC
reply, fds = SC.fetch(sys.argv[1], H.Protos(), sys.argv[2:])
print(reply.code)
print(reply.message)
""" % os.path.dirname(os.path.abspath(__file__))

P = H.Protos()
MESH = {"deviceMesh": [{"name": "dp", "size": "2"}, {"name": "ep", "size": "4"}]}


class ManagedDaemon(H.Daemon):
    """familyd started by the fake manager, with a fixed shard socket path."""

    def __init__(self, manager, tmpdir, extra_args=(), pass_fdstore=True):
        super().__init__(registry=U.REGISTRY, tmpdir=tmpdir, protos=P,
                         extra_args=list(extra_args))
        self.manager = manager
        self.pass_fdstore = pass_fdstore
        self.shard_socket = os.path.join(tmpdir, "shard.sock")

    def spawn(self):
        out = open(self.stdout_path, "ab")
        err = open(self.stderr_path, "ab")
        try:
            self.proc = self.manager.spawn(self.argv(), pass_fdstore=self.pass_fdstore,
                                           stdout=out, stderr=err, stdin=subprocess_devnull())
        finally:
            out.close()
            err.close()
        return self.proc


def subprocess_devnull():
    import subprocess
    return subprocess.DEVNULL


class FdStoreTest(unittest.TestCase):
    def setUp(self):
        self.tmp = H.short_tmpdir()
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.daemons = []

    def tearDown(self):
        # Clean stops (exit 0): the sanitizers' leak check at exit covers the re-adoption.
        for d in self.daemons:
            if d.alive():
                d.stop()

    def manager(self, **kw):
        m = FakeManager(self.tmp, **kw)
        self.addCleanup(m.close)
        return m

    def start(self, m, **kw):
        mark = m.mark()
        d = ManagedDaemon(m, self.tmp, **kw)
        self.daemons.append(d)
        d.start()
        m.wait_for("READY", "1", after=mark)
        return d

    def kill(self, d):
        d.client.close()
        d.client = None
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait()

    def ours(self, m):
        return sorted(n for n in m.fdstore if n.startswith(("shard-", "meta")))

    def wait_ours(self, m, n, timeout=10.0):
        """Our names in the store once there are n of them: FDSTORE=1 datagrams may reach the
        fake manager's thread after the Build's reply reached us."""
        deadline = time.monotonic() + timeout
        while len(self.ours(m)) != n and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.ours(m)

    def wait_holders_records(self, m, build_id, want, timeout=10.0):
        """The build's records of holders in the store once they are want (the datagrams of the
        last swap may still be on their way)."""
        deadline = time.monotonic() + timeout
        while True:
            got = [n for n in self.ours(m) if n.startswith("metarep-%s." % build_id)]
            if got == want or time.monotonic() > deadline:
                return got
            time.sleep(0.02)

    # -----------------------------------------------------------------------------------------

    def test_sigkill_and_restart_with_the_store(self):
        m = self.manager()
        d1 = self.start(m)
        mesh_id = U.create_mesh(self, d1.client, MESH)
        on_mesh = U.build(self, d1, mesh_id=mesh_id, materialize={"dtype": "bf16", "seed": 5},
                          writable=True)
        alone = U.build(self, d1, materialize={"seed": 9})
        plain = U.build(self, d1)
        before = U.view(self, d1)
        bytes_before = U.read_shards(self, d1, on_mesh)

        # The test process holds its materialising builds: one record of holders each.
        want = sorted(["meta-" + mesh_id] +
                      ["meta-" + b.build_id for b in (on_mesh, alone, plain)] +
                      ["metarep-%s.1" % b.build_id for b in (on_mesh, alone)] +
                      ["shard-%s-%d" % (on_mesh.build_id, r) for r in range(8)] +
                      ["shard-%s-0" % alone.build_id])
        self.assertEqual(self.wait_ours(m, len(want)), want)
        self.assertEqual(m.fdstore_ignored, [])

        # A trainer maps rank 2 writable (sealed memfds may be) and keeps it across the crash.
        reply, fds = U.fetch(d1, on_mesh, writable=True)
        self.assertEqual(reply.code, U.STATUS_OK, reply.message)
        size2 = [s.size_bytes for s in on_mesh.shards if s.rank == 2][0]
        held = SC.map_writable(fds[2], size2)
        for fd in fds.values():
            os.close(fd)

        self.kill(d1)
        self.assertEqual(bytes(held), bytes_before[2])

        d2 = self.start(m)
        self.assertEqual(U.view(self, d2), before)
        self.assertRegex(d2.stderr(), r"Re-adopted 3 builds and 1 mesh from the fd store")
        self.assertEqual(U.read_shards(self, d2, on_mesh), bytes_before)
        # on_mesh is a training handout (private and writable): it stays this process's across
        # the restart (the holders record keeps its process), so another process of this uid
        # is refused its tokens on the shard socket.
        probe = subprocess.run(
            [sys.executable, "-c", HANDOUT_PROBE, d2.shard_socket,
             [s.token for s in on_mesh.shards if s.token][0]],
            capture_output=True, text=True, timeout=60)
        self.assertEqual(probe.stdout.splitlines()[:1], ["7"], probe)  # PERMISSION_DENIED
        self.assertIn("belongs to another process", probe.stdout)
        # Nothing was stored twice, nothing dropped.
        self.assertEqual(self.ours(m), want)
        self.assertEqual(m.fdstore_ignored, [])

        # The held mapping and the re-adopted segment are one memory: a write shows through.
        held[0:4] = b"\x01\x02\x03\x04"
        self.assertEqual(U.read_shards(self, d2, on_mesh)[2][:4], b"\x01\x02\x03\x04")
        held.close()

        # Released: its descriptors leave the store; a restart does not bring it back.
        mark = m.mark()
        U.ok(self, d2.client.call("familyd.v1.FamilyService/ReleaseBuild",
                                  build_id=on_mesh.build_id, force=True))
        for name in ["meta-" + on_mesh.build_id, "metarep-%s.1" % on_mesh.build_id] + \
                ["shard-%s-%d" % (on_mesh.build_id, r) for r in range(8)]:
            m.wait_for("FDNAME", name, after=mark)
        self.assertEqual([n for n in self.ours(m) if on_mesh.build_id in n], [])
        after_release = U.view(self, d2)
        self.kill(d2)
        d3 = self.start(m)
        self.assertEqual(U.view(self, d3), after_release)
        self.assertEqual(U.view(self, d3)["ids"], [alone.build_id, plain.build_id])

    def test_fdstore_max_refuses_a_build_that_would_not_be_kept(self):
        m = self.manager()
        # One build of one shard needs two descriptors (its segment and its record); held, the
        # record of its holders takes a third.
        d = self.start(m, extra_args=["--fdstore-max", "4"])
        first = U.build(self, d, materialize={})
        before = U.view(self, d)
        stored = self.wait_ours(m, 3)
        self.assertEqual(len(stored), 3)

        res = d.client.call("familyd.v1.FamilyService/Build",
                            U.build_request(P, materialize={"seed": 2}))
        self.assertEqual(res.code, "RESOURCE_EXHAUSTED", res)
        self.assertEqual(res.message, "fd store limit reached: build needs 2 descriptors, 3 of "
                                      "4 kept (--fdstore-max)")
        _, infos = d.client.error_details(res)
        self.assertEqual([i.reason for i in infos], ["FDSTORE_LIMIT"])
        self.assertEqual(U.view(self, d), before)
        self.assertEqual(self.ours(m), stored)

        # A build of no shards needs its record only: it fits; then a mesh does not.
        plain = U.build(self, d)
        res = d.client.call("familyd.v1.MeshService/CreateMesh", {"mesh": MESH})
        self.assertEqual(res.code, "RESOURCE_EXHAUSTED", res)
        self.assertEqual(res.message, "fd store limit reached: mesh needs 1 descriptor, 4 of 4 "
                                      "kept (--fdstore-max)")
        self.assertEqual(
            len(U.ok(self, d.client.call("familyd.v1.MeshService/ListMeshes")).meshes), 0)

        # Releasing gives the room back.
        U.ok(self, d.client.call("familyd.v1.FamilyService/ReleaseBuild",
                                 build_id=first.build_id, force=True))
        again = U.build(self, d, materialize={"seed": 2})
        self.assertEqual(U.view(self, d)["ids"], [plain.build_id, again.build_id])
        self.assertEqual(self.wait_ours(m, 4), sorted(
            ["meta-" + plain.build_id, "meta-" + again.build_id, "metarep-%s.1" % again.build_id,
             "shard-%s-0" % again.build_id]))
        self.assertEqual(m.fdstore_ignored, [])

    def test_no_room_for_the_holders_record_is_logged_not_refused(self):
        m = self.manager()
        d = self.start(m, extra_args=["--fdstore-max", "2"])
        first = U.build(self, d, materialize={})
        self.assertEqual(self.wait_ours(m, 2), sorted(["meta-" + first.build_id,
                                                      "shard-%s-0" % first.build_id]))
        got = U.ok(self, d.client.call("familyd.v1.FamilyService/GetBuild",
                                       build_id=first.build_id))
        self.assertEqual([r.pid for r in got.references], [os.getpid()])
        self.assertIn("Failed to keep the holders of build %s (they are lost if the daemon "
                      "restarts), ignoring: no room in the fd store (--fdstore-max) or the "
                      "state dir" % first.build_id, d.stderr())
        self.assertEqual(m.fdstore_ignored, [])

    def test_damaged_and_orphaned_descriptors_are_dropped(self):
        m = self.manager()
        d1 = self.start(m)
        kept = U.build(self, d1, materialize={})
        lost = U.build(self, d1, materialize={})
        # Each: its record, its shard, the record of its holders (the datagrams may still be
        # on their way to the manager).
        self.assertEqual(len(self.wait_ours(m, 6)), 6)
        self.kill(d1)

        # The manager hands back a record that is not one, and loses a shard of a build.
        fd = os.memfd_create("junk")
        os.write(fd, b"garbage")
        m.fdstore["meta-bld-00000000-1"] = fd
        os.close(m.fdstore.pop("shard-%s-0" % lost.build_id))

        mark = m.mark()
        d2 = self.start(m)
        err = d2.stderr()
        self.assertRegex(err, r"Dropping the state record meta-bld-00000000-1: not a familyd "
                              r"state record")
        self.assertRegex(err, r"Dropping build %s kept by an earlier run: its shard shard-%s-0 "
                              r"is missing" % (lost.build_id, lost.build_id))
        self.assertEqual(U.view(self, d2)["ids"], [kept.build_id])
        for name in ("meta-bld-00000000-1", "meta-" + lost.build_id):
            m.wait_for("FDSTOREREMOVE", "1", after=mark)
            self.assertIsNotNone(m.find("FDNAME", name, after=mark), name)
        # The lost build's record of holders went with it.
        self.assertEqual(self.ours(m), sorted(["meta-" + kept.build_id,
                                               "metarep-%s.1" % kept.build_id,
                                               "shard-%s-0" % kept.build_id]))

    def test_holders_survive_a_sigkill_and_generations_do_not_pile_up(self):
        m = self.manager()
        d1 = self.start(m, extra_args=["--build-grace-ms", "1500"])
        S.D = d1  # Holder connects to S.D.socket
        # Holder runs S's copy of build_holder.py with S's interpreter.
        S.PYTHON = other_uid.other_uid_python()
        S.COPY = other_uid.harness_copy(S.HOLDER, prefix="fd-fdstore-")
        self.addCleanup(S.COPY.cleanup)
        a, b, gone = Holder(), Holder(), Holder()
        for h in (a, b, gone):
            self.addCleanup(h.close)
        req = {"family": U.GE, "config": {"fields": {
            k: ({"intValue": v} if isinstance(v, int) else {"doubleValue": v})
            for k, v in U.GE_CONFIG.items()}}, "materialize": {"enabled": True, "seed": "51"}}
        x = [h.ask(op="build", request=req) for h in (a, b, gone)]
        self.assertEqual([r["code"] for r in x], ["OK"] * 3, x)
        build_id = x[0]["build_id"]
        self.assertEqual({r["build_id"] for r in x}, {build_id})
        pinned = U.build(self, d1, materialize={"seed": 52})
        U.ok(self, d1.client.call("familyd.v1.FamilyService/PinBuild",
                                  build_id=pinned.build_id))
        # Six changes of x's holders and pins: one record of them in the store, the newest.
        for pin in ("PinBuild", "UnpinBuild"):
            U.ok(self, d1.client.call("familyd.v1.FamilyService/" + pin, build_id=build_id))
        want = ["metarep-%s.5" % build_id]
        self.assertEqual(self.wait_holders_records(m, build_id, want), want)
        self.assertEqual(len(self.wait_ours(m, 6)), 6)
        self.assertEqual(m.fdstore_ignored, [])

        self.kill(d1)
        gone.proc.kill()
        gone.proc.wait()
        d2 = self.start(m, extra_args=["--build-grace-ms", "1500"])
        S.D = d2
        got = U.ok(self, d2.client.call("familyd.v1.FamilyService/GetBuild", build_id=build_id))
        self.assertEqual([r.pid for r in got.references], [a.proc.pid, b.proc.pid])
        self.assertEqual((got.pinned, got.grace_deadline_unix_ms), (False, 0))
        got = U.ok(self, d2.client.call("familyd.v1.FamilyService/GetBuild",
                                        build_id=pinned.build_id))
        self.assertTrue(got.pinned)
        # The dead holder was dropped at the restore, and the record saved again: the next
        # generation replaced the one given back.
        want = ["metarep-%s.6" % build_id]
        self.assertEqual(self.wait_holders_records(m, build_id, want), want)
        self.assertEqual(len(self.wait_ours(m, 6)), 6)
        # The key was kept: the same request from a holder gets the same build.
        again = a.ask(op="build", request=req)
        deadline = time.monotonic() + 10
        while again["code"] == "UNAVAILABLE" and time.monotonic() < deadline:
            time.sleep(0.1)
            again = a.ask(op="build", request=req)
        self.assertEqual((again["code"], again["build_id"], again["shared"]),
                         ("OK", build_id, True), again)
        # Its holders exit: the grace period, then it is freed, its records out of the store.
        a.close()
        b.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and d2.client.call(
                "familyd.v1.FamilyService/GetBuild", build_id=build_id).code == "OK":
            time.sleep(0.1)
        self.assertEqual(d2.client.call("familyd.v1.FamilyService/GetBuild",
                                        build_id=build_id).code, "NOT_FOUND")
        self.assertEqual([n for n in self.wait_ours(m, 3) if build_id in n], [])
        self.assertEqual(m.fdstore_ignored, [])

    def test_without_the_store_nothing_is_adopted(self):
        """systemctl stop, then start: the manager passes nothing back; familyd starts empty."""
        m = self.manager()
        d1 = self.start(m)
        U.build(self, d1, materialize={})
        d1.stop()
        d2 = self.start(m, pass_fdstore=False)
        self.assertEqual(U.view(self, d2)["ids"], [])


if __name__ == "__main__":
    unittest.main(verbosity=2)
