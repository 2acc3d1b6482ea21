#!/usr/bin/python3
"""Build's descriptor budget: one shard segment (one descriptor) per materialised rank."""

import os
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402

REGISTRY = os.path.join(H.CONFORMANCE, "registry")
CONFIG = {"fields": {"num_experts": {"intValue": 4}, "hidden_size": {"intValue": 8},
                     "moe_intermediate_size": {"intValue": 4},
                     "initializer_range": {"doubleValue": 0.02}}}


class TestShardLimit(unittest.TestCase):
    def test_max_shards_refuses_whole_builds_and_frees_on_release(self):
        # Private builds (identical requests would share one), freed by their release.
        with H.Daemon(registry=REGISTRY, extra_args=["--max-shards", "2",
                                                     "--build-grace-ms", "0"]) as d:
            c = d.client
            mesh = c.call("familyd.v1.MeshService/CreateMesh",
                          {"mesh": {"deviceMesh": [{"name": "ep", "size": 4}],
                                    "ranks": [0, 1, 2, 3]}})
            self.assertTrue(mesh.ok, mesh)
            req = {"family": "grouped_experts", "config": CONFIG, "materialize": {"enabled": True}, "privateBuild": True}

            r = c.call("familyd.v1.FamilyService/Build", dict(req, meshId=mesh.reply.mesh_id))
            self.assertEqual(r.code, "RESOURCE_EXHAUSTED", r)
            self.assertEqual(r.message, "shard limit reached: build needs 4 shards, 0 of 2 held")
            self.assertEqual(c.error_details(r)[1][0].reason, "SHARD_LIMIT")
            st = c.call("familyd.v1.AdminService/GetStatus", {})
            self.assertEqual((st.reply.builds, st.reply.shm_bytes_in_use), (0, 0))

            ids = []
            for _ in range(2):
                ok = c.call("familyd.v1.FamilyService/Build", req)
                self.assertTrue(ok.ok, ok)
                ids.append(ok.reply.build.build_id)
            third = c.call("familyd.v1.FamilyService/Build", req)
            self.assertEqual(third.message,
                             "shard limit reached: build needs 1 shards, 2 of 2 held")

            # A layout-only build holds no descriptor.
            plain = c.call("familyd.v1.FamilyService/Build", dict(req, materialize={}))
            self.assertTrue(plain.ok, plain)

            self.assertTrue(c.call("familyd.v1.FamilyService/ReleaseBuild",
                                   {"buildId": ids[0]}).ok)
            again = c.call("familyd.v1.FamilyService/Build", req)
            self.assertTrue(again.ok, again)


class TestShardLimitGiveWay(unittest.TestCase):
    def test_builds_in_their_grace_period_give_their_shards_way(self):
        # The default grace period: a released build keeps its shard descriptors until a
        # Build needs them, then goes (docs/sharing.md).
        with H.Daemon(registry=REGISTRY, extra_args=["--max-shards", "2"]) as d:
            c = d.client
            req = {"family": "grouped_experts", "config": CONFIG,
                   "materialize": {"enabled": True}, "privateBuild": True}
            ids = [c.call("familyd.v1.FamilyService/Build", req).reply.build.build_id
                   for _ in range(2)]
            self.assertTrue(all(ids), ids)
            third = c.call("familyd.v1.FamilyService/Build", req)
            self.assertEqual(third.code, "RESOURCE_EXHAUSTED", third)
            self.assertTrue(c.call("familyd.v1.FamilyService/ReleaseBuild",
                                   {"buildId": ids[0]}).ok)
            self.assertTrue(c.call("familyd.v1.FamilyService/GetBuild", {"buildId": ids[0]}).ok)
            again = c.call("familyd.v1.FamilyService/Build", req)
            self.assertTrue(again.ok, again)
            gone = c.call("familyd.v1.FamilyService/GetBuild", {"buildId": ids[0]})
            self.assertEqual(gone.code, "NOT_FOUND", gone)


class TestDeadline(unittest.TestCase):
    def test_a_build_whose_client_gave_up_is_not_kept(self):
        big = {"fields": {"num_experts": {"intValue": 64}, "hidden_size": {"intValue": 1024},
                          "moe_intermediate_size": {"intValue": 512},
                          "initializer_range": {"doubleValue": 0.02}}}
        with H.Daemon(registry=REGISTRY) as d:
            c = d.client
            r = c.call("familyd.v1.FamilyService/Build",
                       {"family": "grouped_experts", "config": big,
                        "materialize": {"enabled": True}, "privateBuild": True}, timeout=0.05)
            self.assertEqual(r.code, "DEADLINE_EXCEEDED", r)
            # The daemon finishes (or stops) the fill on its own time; then nothing is held.
            deadline = time.monotonic() + 60
            while True:
                st = c.call("familyd.v1.AdminService/GetStatus", {})
                if st.reply.shm_bytes_in_use == 0 or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            time.sleep(0.2)
            st = c.call("familyd.v1.AdminService/GetStatus", {})
            self.assertEqual((st.reply.builds, st.reply.shm_bytes_in_use), (0, 0))
            self.assertEqual(len(c.call("familyd.v1.FamilyService/ListBuilds", {})
                                 .reply.builds), 0)


class TestBuildOffTheWorkers(unittest.TestCase):
    BIG = {"fields": {"num_experts": {"intValue": 64}, "hidden_size": {"intValue": 1024},
                      "moe_intermediate_size": {"intValue": 1024},
                      "initializer_range": {"doubleValue": 0.02}}}

    def test_health_answers_while_builds_materialise(self):
        import threading
        with H.Daemon(registry=REGISTRY) as d:
            results = []

            def big_build():
                c = H.Client(d.socket, d.protos)
                try:
                    results.append(c.call("familyd.v1.FamilyService/Build",
                                          {"family": "grouped_experts", "config": self.BIG,
                                           "materialize": {"enabled": True}, "privateBuild": True}, timeout=120))
                finally:
                    c.close()

            # Two ~768 MiB Builds: more than the daemon's two gRPC workers could hold.
            threads = [threading.Thread(target=big_build) for _ in range(2)]
            for t in threads:
                t.start()
            time.sleep(0.3)
            slowest = 0.0
            for _ in range(10):
                h = d.client.health(timeout=5)
                self.assertTrue(h.ok, h)
                slowest = max(slowest, h.elapsed)
                time.sleep(0.05)
            for t in threads:
                t.join(120)
            self.assertLess(slowest, 1.0, "Health waited %.2f s behind the fills" % slowest)
            self.assertEqual([r.code for r in results], ["OK", "OK"], results)
            ids = [r.reply.build.build_id for r in results]
            for i in ids:
                self.assertTrue(d.client.call("familyd.v1.FamilyService/ReleaseBuild",
                                              {"buildId": i}).ok)

    def test_sigterm_during_a_fill_stops_promptly_and_cleanly(self):
        import threading
        d = H.Daemon(registry=REGISTRY)
        d.start()
        self.addCleanup(d.kill)
        done = []

        def big_build():
            c = H.Client(d.socket, d.protos)
            try:
                done.append(c.call("familyd.v1.FamilyService/Build",
                                   {"family": "grouped_experts", "config": self.BIG,
                                    "materialize": {"enabled": True}, "privateBuild": True}, timeout=120))
            finally:
                c.close()

        threads = [threading.Thread(target=big_build) for _ in range(3)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        t0 = time.monotonic()
        status = d.stop(timeout=60, expect_status=None)
        elapsed = time.monotonic() - t0
        for t in threads:
            t.join(30)
        self.assertEqual(status, 0, d.stderr())
        # Queued Builds are answered at once; the (up to two) fills already running finish
        # first, as they are not cancelled mid-way. One such fill takes 10-15 s under ASan,
        # 21-23 s when other tests share the two cores: the bound says "no hang", with room.
        self.assertLess(elapsed, 60)


def wide_registry(tmp, n_params):
    reg = os.path.join(tmp, "registry")
    os.makedirs(reg, exist_ok=True)
    lines = ["name: wide", "baseline: itest.wide.Wide", "default_variant: v", "variants:",
             "  v: {constructor: itest.wide.V, accepts: [config]}", "parameters:"]
    for i in range(n_params):
        lines.append("  p%02d: {shape: [n], placements: {ep: shard(0)}}" % i)
    with open(os.path.join(reg, "wide.yaml"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return reg


class TestReplyLimit(unittest.TestCase):
    def setUp(self):
        self.tmp = H.short_tmpdir("fd-wide-")
        self.addCleanup(__import__("shutil").rmtree, self.tmp, True)

    def test_replies_over_4_mib_are_refused_and_nothing_is_kept(self):
        reg = wide_registry(self.tmp, 80)
        with H.Daemon(registry=reg, tmpdir=self.tmp, host_devices=4096) as d:
            c = d.client
            mesh = c.call("familyd.v1.MeshService/CreateMesh",
                          {"mesh": {"deviceMesh": [{"name": "ep", "size": 4096}]}})
            self.assertTrue(mesh.ok, mesh)
            req = {"family": "wide", "config": {"fields": {"n": {"intValue": 8192}}},
                   "meshId": mesh.reply.mesh_id}
            r = c.call("familyd.v1.FamilyService/Build", req, timeout=60)
            self.assertEqual(r.code, "RESOURCE_EXHAUSTED", r)
            self.assertRegex(r.message, r"^the Build reply would be \d+ bytes, more than the "
                                        r"limit of 4194304 bytes \(4096 ranks\)$")
            st = c.call("familyd.v1.AdminService/GetStatus", {})
            self.assertEqual(st.reply.builds, 0)

    def test_list_builds_over_4_mib_is_refused_whole(self):
        reg = wide_registry(self.tmp, 25)
        with H.Daemon(registry=reg, tmpdir=self.tmp, host_devices=4096) as d:
            c = d.client
            mesh = c.call("familyd.v1.MeshService/CreateMesh",
                          {"mesh": {"deviceMesh": [{"name": "ep", "size": 4096}]}})
            req = {"family": "wide", "config": {"fields": {"n": {"intValue": 8192}}},
                   "meshId": mesh.reply.mesh_id}
            for _ in range(3):
                ok = c.call("familyd.v1.FamilyService/Build", req, timeout=60)
                self.assertTrue(ok.ok, ok)
            r = c.call("familyd.v1.FamilyService/ListBuilds", {}, timeout=60)
            self.assertEqual(r.code, "RESOURCE_EXHAUSTED", r)
            self.assertIn("more than the limit of 4194304 bytes", r.message)
            self.assertTrue(c.health().ok)


if __name__ == "__main__":
    unittest.main(verbosity=2)
