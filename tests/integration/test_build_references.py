#!/usr/bin/python3
"""References to builds belong to processes (docs/sharing.md): release, exit, grace, pins.

Trainer-like processes (build_holder.py, each its own pid) hold builds of the real daemon. A
build is freed only when no process and no pin holds it, after --build-grace-ms; a process's
references go when it exits (SIGKILL included), not when its connection closes; a new process
that gets the old pid inherits nothing; builds in their grace period give way to new Builds.
A daemon killed and started again from its state (--state-dir) gives each build back what
held it: the processes that still live (same pid and start time), its pin, its privacy, its
creation time and its sharing key (TestRestart; the fd store's in test_durability_fdstore.py).
"""

import os
import shutil
import signal
import struct
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402
from test_build_sharing import Holder  # noqa: E402
import test_build_sharing as S  # noqa: E402
import test_durability_util as U  # noqa: E402
import other_uid  # noqa: E402

REGISTRY = os.path.join(H.CONFORMANCE, "registry")
GE = "grouped_experts"
CFG = {"num_experts": {"intValue": 4}, "hidden_size": {"intValue": 8},
       "moe_intermediate_size": {"intValue": 4}, "initializer_range": {"doubleValue": 0.02}}
SIZE = 1536  # bytes of one such build (one rank)
GRACE_MS = 1500

P = None
daemons = {}


def start(name, *args):
    d = H.Daemon(registry=REGISTRY, host_devices=1, protos=P, extra_args=list(args))
    d.start()
    daemons[name] = d
    return d


def setUpModule():
    global P
    P = H.Protos()
    # Holder runs test_build_sharing's copy of build_holder.py with its interpreter.
    S.PYTHON = other_uid.other_uid_python()
    S.COPY = other_uid.harness_copy(S.HOLDER, prefix="fd-refs-")
    try:
        start("grace", "--build-grace-ms", str(GRACE_MS), "--connection-idle-ms", "300")
        start("zero", "--build-grace-ms", "0")
        start("room", "--build-grace-ms", "60000", "--shm-budget", str(2 * SIZE + 100),
              "--max-builds", "3")
    except BaseException:
        tearDownModule()
        raise


def tearDownModule():
    try:
        for d in daemons.values():
            d.stop_checked()
    finally:
        if S.COPY is not None:
            S.COPY.cleanup()
            S.COPY = None


def request(seed=1):
    return {"family": GE, "config": {"fields": CFG},
            "materialize": {"enabled": True, "seed": str(seed)}}


class Retrying:
    """The test's own client: --connection-idle-ms closes its connection between calls, and
    grpcio may answer the first call after that UNAVAILABLE: it is called again."""

    def __init__(self, client):
        self.client = client

    def call(self, *a, **kw):
        res = self.client.call(*a, **kw)
        if res.code == "UNAVAILABLE":
            res = self.client.call(*a, **kw)
        return res

    def error_details(self, res):
        return self.client.error_details(res)


class Base(unittest.TestCase):
    name = "grace"

    def setUp(self):
        self.d = daemons[self.name]
        S.D = self.d  # Holder connects to S.D.socket
        self.c = Retrying(self.d.client)

    def holder(self):
        h = Holder()
        self.addCleanup(h.close)
        return h

    def status(self):
        return self.c.call("familyd.v1.AdminService/GetStatus", {}).reply

    def get(self, build_id):
        return self.c.call("familyd.v1.FamilyService/GetBuild", build_id=build_id)

    def built(self, h, seed=1):
        a = h.ask(op="build", request=request(seed))
        self.assertEqual(a["code"], "OK", a)
        return a

    def force(self, build_id):
        self.c.call("familyd.v1.FamilyService/ReleaseBuild", build_id=build_id, force=True)


class TestReferences(Base):
    def test_release_keeps_it_for_others_and_sigkill_starts_grace(self):
        before = self.status().shm_bytes_in_use
        a, b = self.holder(), self.holder()
        x = self.built(a, seed=11)
        y = self.built(b, seed=11)
        self.assertEqual(x["build_id"], y["build_id"])
        r = a.ask(op="release", build_id=x["build_id"])
        self.assertEqual((r["code"], r["freed"]), ("OK", False), r)
        got = self.get(x["build_id"]).reply
        self.assertEqual([ref.pid for ref in got.references], [b.proc.pid])
        self.assertEqual(got.grace_deadline_unix_ms, 0)
        # Releasing again: not held any more.
        r = a.ask(op="release", build_id=x["build_id"])
        self.assertEqual((r["code"], r["reason"]), ("FAILED_PRECONDITION", "NOT_HELD"), r)
        self.assertEqual(r["message"],
                         "build '%s' is not held by the calling process (pid %d); to free it "
                         "whatever holds it, release it with force (familyctl release %s "
                         "--force)" % (x["build_id"], a.proc.pid, x["build_id"]))
        # SIGKILL the last holder: the build waits out its grace period, then goes.
        t0 = time.time()
        b.proc.kill()
        b.proc.wait()
        time.sleep(GRACE_MS / 2000)
        got = self.get(x["build_id"])
        self.assertEqual(got.code, "OK", got)
        self.assertEqual(len(got.reply.references), 0)
        self.assertGreater(got.reply.grace_deadline_unix_ms, int(t0 * 1000))
        self.assertEqual(self.status().builds_in_grace, 1)
        time.sleep(GRACE_MS / 1000 + 0.5)
        self.assertEqual(self.get(x["build_id"]).code, "NOT_FOUND")
        st = self.status()
        self.assertEqual((st.shm_bytes_in_use, st.builds_in_grace), (before, 0))

    def test_asking_again_within_the_grace_gets_the_same_build(self):
        a = self.holder()
        x = self.built(a, seed=12)
        a.close()
        time.sleep(0.3)
        got = self.get(x["build_id"]).reply
        self.assertNotEqual(got.grace_deadline_unix_ms, 0)
        b = self.holder()
        y = self.built(b, seed=12)
        self.assertEqual((y["build_id"], y["shared"]), (x["build_id"], True))
        self.assertEqual(self.get(x["build_id"]).reply.grace_deadline_unix_ms, 0)
        self.force(x["build_id"])

    def test_idle_connection_closed_keeps_the_build(self):
        a = self.holder()
        x = self.built(a, seed=13)
        time.sleep(1.0 + GRACE_MS / 1000)  # the daemon closed the idle connection long ago
        got = self.get(x["build_id"]).reply
        self.assertEqual([ref.pid for ref in got.references], [a.proc.pid])
        r = a.ask(op="release", build_id=x["build_id"])
        self.assertEqual((r["code"], r["freed"]), ("OK", False), r)
        self.force(x["build_id"])

    def test_a_reused_pid_inherits_nothing(self):
        if os.geteuid() != 0 or not os.access("/proc/sys/kernel/ns_last_pid", os.W_OK):
            self.skipTest("needs root and a writable /proc/sys/kernel/ns_last_pid")
        keeper, a = self.holder(), self.holder()
        x = self.built(keeper, seed=14)
        self.built(a, seed=14)
        old = a.proc.pid
        a.proc.kill()
        a.proc.wait()
        time.sleep(0.2)
        b = None
        for _ in range(20):
            with open("/proc/sys/kernel/ns_last_pid", "w") as f:
                f.write(str(old - 1))
            b = Holder()
            self.addCleanup(b.close)
            if b.proc.pid == old:
                break
        if b.proc.pid != old:
            self.skipTest("the kernel gave pid %d, not %d" % (b.proc.pid, old))
        r = b.ask(op="release", build_id=x["build_id"])
        self.assertEqual((r["code"], r["reason"]), ("FAILED_PRECONDITION", "NOT_HELD"), r)
        got = self.get(x["build_id"]).reply
        self.assertEqual([ref.pid for ref in got.references], [keeper.proc.pid])
        self.force(x["build_id"])

    def test_pinned_outlives_its_holders_and_force_frees_it(self):
        a = self.holder()
        x = self.built(a, seed=15)
        pin = self.c.call("familyd.v1.FamilyService/PinBuild", build_id=x["build_id"])
        self.assertTrue(pin.ok and pin.reply.pinned, pin)
        a.proc.kill()
        a.proc.wait()
        time.sleep(GRACE_MS / 1000 + 0.5)
        got = self.get(x["build_id"]).reply
        self.assertTrue(got.pinned)
        self.assertEqual((len(got.references), got.grace_deadline_unix_ms), (0, 0))
        # Unpinned, nothing holds it: its grace period starts.
        un = self.c.call("familyd.v1.FamilyService/UnpinBuild", build_id=x["build_id"])
        self.assertTrue(un.ok and not un.reply.pinned, un)
        self.assertNotEqual(self.get(x["build_id"]).reply.grace_deadline_unix_ms, 0)
        # Held and pinned: force frees it all the same.
        b = self.holder()
        self.built(b, seed=15)
        self.c.call("familyd.v1.FamilyService/PinBuild", build_id=x["build_id"])
        r = self.c.call("familyd.v1.FamilyService/ReleaseBuild", build_id=x["build_id"],
                        force=True)
        self.assertTrue(r.ok and r.reply.freed, r)
        self.assertEqual(self.get(x["build_id"]).code, "NOT_FOUND")
        for rpc in ("PinBuild", "UnpinBuild"):
            res = self.c.call("familyd.v1.FamilyService/" + rpc, build_id=x["build_id"])
            self.assertEqual(res.code, "NOT_FOUND")

    def test_release_of_a_build_not_held(self):
        a = self.holder()
        x = self.built(a, seed=16)
        # The test process never asked for it.
        r = self.c.call("familyd.v1.FamilyService/ReleaseBuild", build_id=x["build_id"])
        self.assertEqual(r.code, "FAILED_PRECONDITION")
        _, infos = self.c.error_details(r)
        self.assertEqual(infos[0].reason, "NOT_HELD")
        self.assertIn("--force", r.message)
        self.force(x["build_id"])


class TestGraceZero(Base):
    name = "zero"

    def test_last_release_frees_at_once(self):
        before = self.status().shm_bytes_in_use
        a = self.holder()
        x = self.built(a)
        r = a.ask(op="release", build_id=x["build_id"])
        self.assertEqual((r["code"], r["freed"]), ("OK", True), r)
        self.assertEqual(self.get(x["build_id"]).code, "NOT_FOUND")
        y = self.built(a, seed=2)
        a.proc.kill()
        a.proc.wait()
        deadline = time.monotonic() + 5
        while self.get(y["build_id"]).code == "OK" and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual(self.get(y["build_id"]).code, "NOT_FOUND")
        self.assertEqual(self.status().shm_bytes_in_use, before)


class TestGiveWay(Base):
    name = "room"

    def test_grace_builds_give_way_oldest_first(self):
        a = self.holder()
        first = self.built(a, seed=21)
        second = self.built(a, seed=22)
        a.ask(op="release", build_id=first["build_id"])
        time.sleep(0.05)
        a.ask(op="release", build_id=second["build_id"])
        self.assertEqual(self.status().builds_in_grace, 2)
        # Budget: a third build needs the oldest one's bytes.
        third = self.built(a, seed=23)
        self.assertEqual(self.get(first["build_id"]).code, "NOT_FOUND")
        self.assertEqual(self.get(second["build_id"]).code, "OK")
        # --max-builds 3: layout-only builds take slots; the grace build gives its slot.
        lay = self.c.call("familyd.v1.FamilyService/Build", {"family": GE,
                                                              "config": {"fields": CFG}})
        self.assertTrue(lay.ok, lay)
        lay2 = self.c.call("familyd.v1.FamilyService/Build", {"family": GE,
                                                               "config": {"fields": CFG}})
        self.assertTrue(lay2.ok, lay2)
        self.assertEqual(self.get(second["build_id"]).code, "NOT_FOUND")
        # Held builds never give way.
        res = self.c.call("familyd.v1.FamilyService/Build", {"family": GE,
                                                              "config": {"fields": CFG}})
        self.assertEqual(res.code, "RESOURCE_EXHAUSTED", res)
        self.assertEqual(self.get(third["build_id"]).code, "OK")
        for b in (third["build_id"], lay.reply.build.build_id, lay2.reply.build.build_id):
            self.force(b)


def crc32c(data):
    crc = 0xffffffff
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82f63b78 if crc & 1 else crc >> 1
    return crc ^ 0xffffffff


def ask_again(h, **cmd):
    """A command of a holder whose channel may still point at a daemon that was killed:
    grpcio answers UNAVAILABLE until it reconnects."""
    deadline = time.monotonic() + 10
    while True:
        a = h.ask(**cmd)
        if a["code"] != "UNAVAILABLE" or time.monotonic() > deadline:
            return a
        time.sleep(0.1)


class RestartBase(unittest.TestCase):
    """A daemon on a state dir, killed and started again on it; holders are build_holder.py
    processes connected to its socket, which stays the same across the restart."""

    def setUp(self):
        self.state = U.tmpfs_dir("fd-refs-")
        if self.state is None:
            self.skipTest("no tmpfs to put a state dir on (/dev/shm, /run)")
        self.addCleanup(shutil.rmtree, self.state, True)
        self.tmp = H.short_tmpdir()
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.daemons = []

    def tearDown(self):
        for d in self.daemons:
            if d.alive():
                d.stop()
                err = d.stderr()
                self.assertNotIn("runtime error:", err)
                self.assertNotIn("Sanitizer", err)

    def start(self):
        d = H.Daemon(registry=REGISTRY, host_devices=1, protos=P, tmpdir=self.tmp,
                     extra_args=["--state-dir", self.state, "--build-grace-ms", str(GRACE_MS)])
        self.daemons.append(d)
        d.start()
        S.D = d  # Holder connects to S.D.socket
        self.c = Retrying(d.client)
        return d

    def kill(self, d):
        d.client.close()
        d.client = None
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait()

    def holder(self):
        h = Holder()
        self.addCleanup(h.close)
        return h

    def get(self, build_id):
        return self.c.call("familyd.v1.FamilyService/GetBuild", build_id=build_id)

    def built(self, h, seed, private=False):
        req = request(seed)
        if private:
            req["privateBuild"] = True
        a = ask_again(h, op="build", request=req)
        self.assertEqual(a["code"], "OK", a)
        return a

    def pids(self, build_id):
        return [ref.pid for ref in self.get(build_id).reply.references]


class TestRestart(RestartBase):
    def test_holders_pin_privacy_and_key_survive_a_sigkill(self):
        d1 = self.start()
        a, b, gone = self.holder(), self.holder(), self.holder()
        x = self.built(a, 31)
        self.assertEqual(self.built(b, 31)["build_id"], x["build_id"])
        self.assertEqual(self.built(gone, 31)["build_id"], x["build_id"])
        alone = self.built(gone, 32)         # held only by a process that dies meanwhile
        pinned = self.built(gone, 33)        # ... and pinned
        pin = self.c.call("familyd.v1.FamilyService/PinBuild", build_id=pinned["build_id"])
        self.assertTrue(pin.ok and pin.reply.pinned, pin)
        private = self.built(a, 34, private=True)
        # The same process twice: two references, released one at a time.
        self.assertEqual(self.built(a, 31)["build_id"], x["build_id"])
        before = {i: self.get(i).reply for i in
                  (x["build_id"], alone["build_id"], pinned["build_id"], private["build_id"])}
        self.assertEqual(self.pids(x["build_id"]), [a.proc.pid, b.proc.pid, gone.proc.pid])

        # The daemon is killed; one holder dies while it is down.
        self.kill(d1)
        gone.proc.kill()
        gone.proc.wait()
        t0 = time.time()
        self.start()

        # The living holders hold it with no call, since the same time; no grace period.
        got = self.get(x["build_id"]).reply
        self.assertEqual([r.pid for r in got.references], [a.proc.pid, b.proc.pid])
        self.assertEqual([(r.uid, r.since_unix_ms) for r in got.references],
                         [(r.uid, r.since_unix_ms) for r in before[x["build_id"]].references[:2]])
        self.assertEqual(got.grace_deadline_unix_ms, 0)
        self.assertEqual(got.created_unix_ms, before[x["build_id"]].created_unix_ms)
        self.assertFalse(got.pinned or got.private_build)
        # Pinned: still pinned, no holder, no grace period.
        got = self.get(pinned["build_id"]).reply
        self.assertEqual((got.pinned, len(got.references), got.grace_deadline_unix_ms),
                         (True, 0, 0))
        # Private: still private, still held.
        got = self.get(private["build_id"]).reply
        self.assertTrue(got.private_build)
        self.assertEqual([r.pid for r in got.references], [a.proc.pid])
        # Held by nobody alive: its grace period started at the restart.
        got = self.get(alone["build_id"]).reply
        self.assertEqual(len(got.references), 0)
        self.assertGreaterEqual(got.grace_deadline_unix_ms, int(t0 * 1000) + GRACE_MS)

        # The sharing key was kept: asking again, from a new process, gets the same build.
        e = self.holder()
        again = self.built(e, 32)
        self.assertEqual((again["build_id"], again["shared"]), (alone["build_id"], True))
        self.assertEqual(self.pids(alone["build_id"]), [e.proc.pid])
        # A private build is still found by nobody.
        other = self.built(e, 34, private=True)
        self.assertNotEqual(other["build_id"], private["build_id"])

        # a held x twice: its first release leaves it listed.
        r = ask_again(a, op="release", build_id=x["build_id"])
        self.assertEqual((r["code"], r["freed"]), ("OK", False), r)
        self.assertEqual(self.pids(x["build_id"]), [a.proc.pid, b.proc.pid])
        # Once its holders exit, the watcher sees it: the grace period, then freed.
        a.close()
        b.close()
        deadline = time.monotonic() + 5
        while self.get(x["build_id"]).reply.grace_deadline_unix_ms == 0 and \
                time.monotonic() < deadline:
            time.sleep(0.05)
        got = self.get(x["build_id"]).reply
        self.assertEqual(len(got.references), 0)
        self.assertNotEqual(got.grace_deadline_unix_ms, 0)
        time.sleep(GRACE_MS / 1000 + 0.7)
        self.assertEqual(self.get(x["build_id"]).code, "NOT_FOUND")
        self.assertEqual(self.get(private["build_id"]).code, "NOT_FOUND")
        self.assertEqual(self.get(pinned["build_id"]).code, "OK")
        self.assertFalse([n for n in os.listdir(self.state) if x["build_id"] in n])

    def test_holders_kept_across_two_restarts_and_a_damaged_record(self):
        d1 = self.start()
        a = self.holder()
        x = self.built(a, 41)
        y = self.built(a, 42)
        self.assertIn("metarep-" + x["build_id"], os.listdir(self.state))
        self.kill(d1)
        d2 = self.start()
        self.assertEqual(self.pids(x["build_id"]), [a.proc.pid])
        self.assertRegex(d2.stderr(), r"Build %s: 1 process still holds it\." % x["build_id"])
        self.kill(d2)
        # A record of holders damaged while the daemon was down: no holders, never a lost build.
        with open(os.path.join(self.state, "metarep-" + y["build_id"]), "r+b") as f:
            f.seek(40)
            f.write(b"\xff\xff")
        # And one whose build's record is gone: dropped.
        with open(os.path.join(self.state, "metarep-bld-00000000-9"), "wb") as f:
            f.write(b"orphan")
        d3 = self.start()
        err = d3.stderr()
        self.assertEqual(self.pids(x["build_id"]), [a.proc.pid])
        got = self.get(y["build_id"])
        self.assertEqual(got.code, "OK", got)
        self.assertEqual(len(got.reply.references), 0)
        self.assertNotEqual(got.reply.grace_deadline_unix_ms, 0)
        self.assertRegex(err, r"Build %s: the record of its holders is dropped \(its checksum "
                              r"does not match \(damaged\)\); it waits out its grace period, "
                              r"ignoring\." % y["build_id"])
        self.assertRegex(err, r"Dropping metarep-bld-00000000-9: no kept record names it\.")
        self.assertNotIn("metarep-bld-00000000-9", os.listdir(self.state))


    def test_a_holder_with_another_start_time_is_another_process(self):
        """The saved start time of a live pid differs (the pid was reused while the daemon was
        down): that reference is dropped, the other kept."""
        d1 = self.start()
        a, b = self.holder(), self.holder()
        x = self.built(a, 44)
        self.built(b, 44)
        self.kill(d1)
        path = os.path.join(self.state, "metarep-" + x["build_id"])
        with open(path, "rb") as f:
            data = bytearray(f.read())
        n, key_size = struct.unpack_from("<I", data, 12)[0], struct.unpack_from("<Q", data, 24)[0]
        self.assertEqual(n, 2)
        at = 32 + key_size
        self.assertEqual(struct.unpack_from("<i", data, at)[0], a.proc.pid)
        start = struct.unpack_from("<Q", data, at + 8)[0]
        struct.pack_into("<Q", data, at + 8, start + 1)
        struct.pack_into("<I", data, len(data) - 4, crc32c(bytes(data[:-4])))
        with open(path, "wb") as f:
            f.write(data)
        d2 = self.start()
        self.assertEqual(self.pids(x["build_id"]), [b.proc.pid])
        self.assertRegex(d2.stderr(), r"Build %s: process %d held it before the restart and is "
                                      r"gone; its reference is dropped\." % (x["build_id"],
                                                                             a.proc.pid))
        # a is not a holder: its release is refused.
        r = ask_again(a, op="release", build_id=x["build_id"])
        self.assertEqual((r["code"], r["reason"]), ("FAILED_PRECONDITION", "NOT_HELD"), r)

if __name__ == "__main__":
    unittest.main(verbosity=2)
