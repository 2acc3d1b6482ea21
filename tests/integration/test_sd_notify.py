#!/usr/bin/python3
"""sd_notify from the real familyd, received by a fake service manager (fake_manager.py).

READY=1 comes only once both sockets accept (checked at the moment the datagram arrives),
with STATUS= naming the registry generation and counts; RELOADING=1 ... READY=1 frame every
reload (SIGHUP, the Reload RPC, a failed one); WATCHDOG=1 at half of WATCHDOG_USEC; STOPPING=1
on SIGTERM; a failed start says why (STATUS=, ERRNO=) and never READY=1.
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
from fake_manager import FakeManager  # noqa: E402

SRC_REGISTRY = os.path.join(H.CONFORMANCE, "registry")
GE_SMALL = {"num_experts": 4, "hidden_size": 8, "moe_intermediate_size": 4,
            "initializer_range": 0.02}
P = None


def setUpModule():
    global P
    P = H.Protos()


class ProbingManager(FakeManager):
    """Records, in the receiving thread, whether the sockets accepted when READY=1 arrived:
    the datagram was sent before that moment, so a READY=1 sent before bind() shows."""

    def __init__(self, tmpdir, paths):
        self.paths = paths
        self.ready_probes = []
        super().__init__(tmpdir)

    def _handle(self, data, fds, pid, now, truncated=False):
        if b"READY=1" in data.split(b"\n"):
            self.ready_probes.append({p: H.socket_accepts(p) for p in self.paths})
        super()._handle(data, fds, pid, now, truncated)


class Base(unittest.TestCase):
    watchdog_usec = None

    def setUp(self):
        self.tmp = H.short_tmpdir("fd-sdn-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.registry = os.path.join(self.tmp, "registry")
        shutil.copytree(SRC_REGISTRY, self.registry)
        self.socket = os.path.join(self.tmp, "api.sock")
        self.shard_socket = os.path.join(self.tmp, "shard.sock")
        self.manager = ProbingManager(self.tmp, [self.socket, self.shard_socket])
        self.addCleanup(self.manager.close)
        self.proc = None
        self.client = None

    def tearDown(self):
        if self.client:
            self.client.close()
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stderr(self):
        with open(os.path.join(self.tmp, "familyd.err"), errors="replace") as f:
            return f.read()

    def spawn(self, extra=(), registry=None, watchdog_usec=None):
        argv = [H.familyd_bin(), "--socket", self.socket, "--shard-socket", self.shard_socket,
                "--registry", registry or self.registry, "--host-devices", "2", *extra]
        err = open(os.path.join(self.tmp, "familyd.err"), "wb")
        self.proc = self.manager.spawn(argv, watchdog_usec=watchdog_usec,
                                       stdout=subprocess.DEVNULL, stderr=err,
                                       stdin=subprocess.DEVNULL)
        err.close()
        return self.proc

    def start(self, **kw):
        self.spawn(**kw)
        try:
            ready = self.manager.wait_for("READY", "1", timeout=H.START_TIMEOUT)
        except AssertionError:
            self.proc.poll()
            raise AssertionError("no READY=1 (exit status %s); stderr:\n%s"
                                 % (self.proc.returncode, self.stderr()))
        self.client = H.Client(self.socket, P)
        return ready

    def stop(self):
        if self.client:
            self.client.close()
            self.client = None
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(H.STOP_TIMEOUT)
        self.assertEqual(rc, 0, self.stderr())

    def msg(self, i):
        return self.manager.messages[i]

    def add_broken_family(self):
        with open(os.path.join(self.registry, "zz-broken.yaml"), "w") as f:
            f.write("name: broken\nbaseline: itest.Broken\ncolour: red\n")

    def add_family(self):
        with open(os.path.join(self.registry, "zz-extra.yaml"), "w") as f:
            f.write("name: extra\nbaseline: itest.extra.Extra\ndefault_variant: one\n"
                    "variants:\n  one:\n    constructor: itest.extra.One\n"
                    "    accepts: [config]\n")


class TestReady(Base):
    def test_ready_only_once_both_sockets_accept_with_status(self):
        ready = self.start()
        self.assertEqual(self.manager.ready_probes[0],
                         {self.socket: True, self.shard_socket: True},
                         "READY=1 was sent before both sockets accepted")
        # Nothing came before READY=1 that claims readiness, and it came from the main pid
        # (NotifyAccess=main).
        self.assertEqual(self.manager.count("READY", "1"), 1)
        self.assertEqual(self.msg(ready)["_pid"], self.proc.pid)
        # Readiness means calls are answered now, not "soon".
        res = self.client.health(timeout=H.CALL_TIMEOUT)
        self.assertTrue(res.ok, res)
        self.assertEqual(res.reply.status, 1)   # SERVING

        status = self.msg(ready).get("STATUS", "")
        families = self.client.call("familyd.v1.FamilyService/ListFamilies", {})
        self.assertTrue(families.ok, families)
        n = len(families.reply.families)
        self.assertIn("registry generation 1", status)
        self.assertIn("%d families" % n, status)
        self.assertIn("0 builds", status)
        print("STATUS at READY=1: %s" % status)
        self.stop()

    def test_failed_start_says_why_and_is_never_ready(self):
        broken = os.path.join(self.tmp, "broken-registry")
        os.mkdir(broken)
        with open(os.path.join(broken, "a.yaml"), "w") as f:
            f.write("name: a\nbaseline: x.A\ncolour: red\n")
        self.spawn(registry=broken)
        rc = self.proc.wait(H.START_TIMEOUT)
        self.assertNotEqual(rc, 0)
        i = self.manager.wait_for("ERRNO", timeout=5)
        self.assertIn("Failed to start", self.msg(i).get("STATUS", ""))
        self.assertGreater(int(self.msg(i)["ERRNO"]), 0)
        self.assertEqual(self.manager.count("READY", "1"), 0)
        self.assertFalse(os.path.exists(self.socket))
        self.assertFalse(os.path.exists(self.shard_socket))


class TestReload(Base):
    def reload_pair(self, after, trigger):
        """RELOADING=1 then READY=1, both after index `after`; returns their indices."""
        trigger()
        i = self.manager.wait_for("RELOADING", "1", after=after)
        j = self.manager.wait_for("READY", "1", after=i)
        self.assertIn("MONOTONIC_USEC", self.msg(i))
        # The first READY=1 after `after` is the one that ends this reload.
        self.assertEqual(self.manager.find("READY", "1", after=after), j)
        return i, j

    def test_sighup_reload(self):
        ready = self.start()
        self.add_family()
        i, j = self.reload_pair(ready, lambda: self.proc.send_signal(signal.SIGHUP))
        self.assertIn("registry generation 2", self.msg(j)["STATUS"])
        self.assertNotIn("failed", self.msg(j)["STATUS"])
        self.stop()

    def test_reload_rpc_and_failed_reload(self):
        ready = self.start()
        results = []
        self.add_family()
        i, j = self.reload_pair(ready, lambda: results.append(
            self.client.call("familyd.v1.AdminService/Reload", {})))
        self.assertTrue(results[-1].ok, results[-1])
        self.assertEqual(results[-1].reply.registry_generation, 2)
        self.assertIn("registry generation 2", self.msg(j)["STATUS"])

        # A reload that fails still ends with READY=1: the old registry serves on, and
        # STATUS= says so until a reload succeeds.
        self.add_broken_family()
        k, l = self.reload_pair(j, lambda: results.append(
            self.client.call("familyd.v1.AdminService/Reload", {})))
        self.assertEqual(results[-1].code, "FAILED_PRECONDITION", results[-1])
        self.assertIn("registry generation 2", self.msg(l)["STATUS"])
        self.assertIn("the last reload failed", self.msg(l)["STATUS"])

        os.unlink(os.path.join(self.registry, "zz-broken.yaml"))
        m, n = self.reload_pair(l, lambda: self.proc.send_signal(signal.SIGHUP))
        self.assertIn("registry generation 3", self.msg(n)["STATUS"])
        self.assertNotIn("failed", self.msg(n)["STATUS"])
        self.stop()


class TestWatchdog(Base):
    def test_pings_at_half_the_interval(self):
        usec = 400000
        self.start(watchdog_usec=usec)
        start = self.manager.mark()
        time.sleep(2.0)
        end = self.manager.mark()
        pings = [m["_time"] for m in self.manager.messages[start + 1:end + 1]
                 if m.get("WATCHDOG") == "1"]
        print("watchdog: %d pings in 2.0 s with WATCHDOG_USEC=%d (expected about %.0f)"
              % (len(pings), usec, 2.0 / (usec / 2e6)))
        # Every 200 ms: 10 in 2 s. Tolerance for a loaded 2-core machine under ASan, but
        # neither "once per interval" (5) nor a busy loop would pass.
        self.assertGreaterEqual(len(pings), 7)
        self.assertLessEqual(len(pings), 13)
        gaps = [b - a for a, b in zip(pings, pings[1:])]
        self.assertLess(max(gaps), usec / 1e6, "a gap between pings reached the interval")
        self.assertTrue(all(m["_pid"] == self.proc.pid for m in self.manager.messages
                            if m.get("WATCHDOG") == "1"))
        self.stop()

    def test_no_pings_without_watchdog_usec(self):
        self.start()
        time.sleep(1.0)
        self.assertEqual(self.manager.count("WATCHDOG"), 0)
        self.stop()

    def test_status_follows_builds(self):
        # The watchdog's timer also refreshes STATUS= when it changed.
        ready = self.start(watchdog_usec=300000, extra=["--build-grace-ms", "0"])
        req = P.cls("familyd.v1.BuildRequest")(family="grouped_experts")
        req.config.SetInParent()
        for k, v in GE_SMALL.items():
            req.config.fields[k].CopyFrom(P.value(v))
        req.materialize.enabled = True
        res = self.client.call("familyd.v1.FamilyService/Build", req)
        self.assertTrue(res.ok, res)
        deadline = time.monotonic() + 10
        while True:
            last = [m for m in self.manager.messages[ready + 1:] if "STATUS" in m]
            if last and "1 build," in last[-1]["STATUS"]:
                break
            self.assertLess(time.monotonic(), deadline, "STATUS= never showed the build: %r"
                            % [m.get("STATUS") for m in last])
            time.sleep(0.1)
        rel = self.client.call("familyd.v1.FamilyService/ReleaseBuild",
                               {"buildId": res.reply.build.build_id})
        self.assertTrue(rel.ok, rel)
        mark = self.manager.mark()
        i = self.manager.wait_for("STATUS", after=mark)
        while "0 builds" not in self.msg(i)["STATUS"]:
            i = self.manager.wait_for("STATUS", after=i)
        self.stop()


class TestStopping(Base):
    def test_stopping_on_sigterm(self):
        ready = self.start()
        self.proc.send_signal(signal.SIGTERM)
        i = self.manager.wait_for("STOPPING", "1", after=ready, timeout=H.STOP_TIMEOUT)
        self.assertEqual(self.msg(i)["_pid"], self.proc.pid)
        self.assertEqual(self.proc.wait(H.STOP_TIMEOUT), 0, self.stderr())
        # Nothing claims readiness after STOPPING=1.
        self.assertIsNone(self.manager.find("READY", "1", after=i))
        self.assertFalse(os.path.exists(self.socket))


if __name__ == "__main__":
    unittest.main(verbosity=2)
