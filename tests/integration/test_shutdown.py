#!/usr/bin/python3
"""SIGTERM while calls are being answered: the daemon drains its calls and exits 0.

gRPC's shutdown notification fires once the server's channels are gone, not once familyd's
handlers have stopped; a worker still inside a handler must finish before the server is
destroyed (daemon/rpc/server.c), or gRPC aborts on the next batch.
"""

import os
import shutil
import signal
import sys
import threading
import time
import unittest

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402

REGISTRY = os.path.join(H.CONFORMANCE, "registry")


def hammer(sock, protos, stop):
    """Resolve and ListFamilies as fast as possible until told to stop or the daemon goes."""
    c = H.Client(sock, protos)
    try:
        while not stop.is_set():
            r = c.call("familyd.v1.FamilyService/Resolve",
                       {"family": "grouped_experts", "context": {"epSize": 4}}, timeout=5)
            r2 = c.call("familyd.v1.FamilyService/ListFamilies", {}, timeout=5)
            if not (r.ok and r2.ok):
                return
    finally:
        c.close()


class TestShutdownUnderLoad(unittest.TestCase):
    def test_sigterm_with_calls_in_flight_exits_0(self):
        for round_ in range(8):
            tmp = H.short_tmpdir("fd-shut-")
            self.addCleanup(shutil.rmtree, tmp, True)
            d = H.Daemon(registry=REGISTRY, tmpdir=tmp)
            d.start()
            self.addCleanup(d.kill)
            stop = threading.Event()
            threads = [threading.Thread(target=hammer, args=(d.socket, d.protos, stop))
                       for _ in range(6)]
            for t in threads:
                t.start()
            # Watches stay open across the stop too.
            watches = [d.client.stream("grpc.health.v1.Health/Watch", {}) for _ in range(3)]
            time.sleep(0.3 + 0.1 * round_)
            status = d.stop(expect_status=None)
            stop.set()
            for t in threads:
                t.join(10)
            for w in watches:
                w.cancel()
            self.assertEqual(status, 0, "round %d: exit %r\n%s" % (round_, status, d.stderr()))
            self.assertNotIn("assertion failed", d.stderr())


class TestWatches(unittest.TestCase):
    def test_health_watch_of_an_unknown_service_reports_service_unknown(self):
        with H.Daemon(registry=REGISTRY) as d:
            first = d.client.stream_first("grpc.health.v1.Health/Watch", {"service": "nope.Svc"})
            self.assertTrue(first.ok, first)
            # SERVICE_UNKNOWN = 3 in grpc.health.v1.HealthCheckResponse.ServingStatus.
            self.assertEqual(first.reply.status, 3)
            known = d.client.stream_first("grpc.health.v1.Health/Watch",
                                          {"service": "familyd.v1.FamilyService"})
            self.assertEqual(known.reply.status, 1)
            check = d.client.health("nope.Svc")
            self.assertEqual(check.code, "NOT_FOUND")


    def test_watches_over_the_limit_are_refused(self):
        with H.Daemon(registry=REGISTRY, extra_args=["--max-watches", "2"]) as d:
            open_ = [d.client.stream("grpc.health.v1.Health/Watch", {}) for _ in range(2)]
            for w in open_:
                self.assertEqual(next(w).status, 1)
            third = d.client.stream_first("grpc.health.v1.Health/Watch", {})
            self.assertEqual(third.code, "RESOURCE_EXHAUSTED", third)
            self.assertEqual(third.message, "watch limit reached: 2 open watches")
            topo = d.client.stream_first("familyd.v1.MeshService/WatchTopology", {})
            self.assertEqual(topo.code, "RESOURCE_EXHAUSTED", topo)
            # Unary calls are not watches.
            self.assertTrue(d.client.health().ok)
            # Closing a watch frees its slot.
            open_[0].cancel()
            deadline = time.monotonic() + 10
            while True:
                again = d.client.stream_first("grpc.health.v1.Health/Watch", {})
                if again.ok or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            self.assertTrue(again.ok, again)
            open_[1].cancel()


class TestReplyLimits(unittest.TestCase):
    def test_long_names_are_refused_and_messages_stay_short(self):
        with H.Daemon(registry=REGISTRY) as d:
            long_id = "m" * 100000
            for rpc, req, field in (("familyd.v1.MeshService/GetMesh", {"meshId": long_id},
                                     "mesh_id"),
                                    ("familyd.v1.MeshService/DeleteMesh", {"meshId": long_id},
                                     "mesh_id"),
                                    ("familyd.v1.FamilyService/GetFamily", {"family": long_id},
                                     "family")):
                r = d.client.call(rpc, req)
                self.assertEqual(r.code, "INVALID_ARGUMENT", (rpc, r))
                self.assertIn(field + " is longer than", r.message)
            # A long unknown service name is echoed cut, not whole.
            r = d.client.health("s" * 100000)
            self.assertEqual(r.code, "NOT_FOUND")
            self.assertLess(len(r.message), 2100)
            # 256 unknown 250-byte keys: the sorted list is cut at the limit, whole trailers.
            args = {("k%03d" % i) + "x" * 246: {"boolValue": True} for i in range(256)}
            r = d.client.call("familyd.v1.FamilyService/Resolve",
                              {"family": "grouped_experts", "arguments": args})
            self.assertEqual(r.code, "INVALID_ARGUMENT", r)
            self.assertTrue(r.message.startswith("grouped_experts: unknown arguments: ['k000"))
            self.assertLessEqual(len(r.message.encode()), 2048)
            self.assertTrue(r.message.endswith("..."), r.message[-40:])
            st, infos = d.client.error_details(r)
            self.assertEqual(st.message, r.message)
            self.assertEqual(infos[0].reason, "UNKNOWN_ARGUMENTS")

    def test_reload_with_many_errors_is_cut_at_a_line(self):
        tmp = H.short_tmpdir("fd-many-")
        self.addCleanup(shutil.rmtree, tmp, True)
        reg = os.path.join(tmp, "registry")
        shutil.copytree(REGISTRY, reg)
        with H.Daemon(registry=reg, tmpdir=tmp) as d:
            for i in range(200):
                with open(os.path.join(reg, "bad%03d.yaml" % i), "w") as f:
                    f.write("name: bad%d\nbaseline: x.Bad%d\nunknown_key: 1\n"
                            "variants: {v: {constructor: x.V, accepts: []}}\n" % (i, i))
            r = d.client.call("familyd.v1.AdminService/Reload", {})
            self.assertEqual(r.code, "FAILED_PRECONDITION", r)
            self.assertTrue(r.message.startswith("registry reload failed: "), r.message[:80])
            self.assertIn("bad000.yaml:3:1:", r.message)
            self.assertRegex(r.message, r"\n\.\.\. \(\d+ more lines\)$")
            self.assertLessEqual(len(r.message.encode()), 2048)
            # The old registry is still served.
            ok = d.client.call("familyd.v1.FamilyService/Resolve", {"family": "grouped_experts"})
            self.assertTrue(ok.ok, ok)


if __name__ == "__main__":
    unittest.main(verbosity=2)
