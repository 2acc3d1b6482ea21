#!/usr/bin/python3
"""Faults on the client side: a client SIGKILLed while it holds mapped shards, one SIGKILLed in
the middle of a materialising Build, and one client using up the shm budget. Each time the
affected caller alone is hurt, and a concurrent healthy client (test_faults_common.HealthyClient:
Resolve, Build, shard fetch, ReleaseBuild, Health on its own connection) sees no error.

The killed clients are child processes running this file with --child (real processes, killed
for real, with the kernel cleaning up after them): `hold` builds, fetches and maps every shard,
says "ready" and sleeps; `build` sends one large materialising Build and waits for it.
"""

import json
import os
import signal
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402
import shard_client as SC  # noqa: E402
from test_faults_common import (BIG, REGISTRY, SMALL, SMALL_BYTES, HealthyClient,  # noqa: E402
                                fd_count, wait_for)


def child_main(argv):
    """--child hold|build SOCKET: the client that gets killed."""
    what, sock = argv[0], argv[1]
    protos = H.Protos()
    c = H.Client(sock, protos)
    if what == "hold":
        mesh = c.call("familyd.v1.MeshService/CreateMesh",
                      {"mesh": {"deviceMesh": [{"name": "ep", "size": 4}], "ranks": [0, 1, 2, 3]}})
        b = c.call("familyd.v1.FamilyService/Build",
                   {"family": "grouped_experts", "config": SMALL, "meshId": mesh.reply.mesh_id,
                    "materialize": {"enabled": True, "seed": "9"}, "privateBuild": True})
        build = b.reply.build
        tokens = [s.token for s in build.shards if s.token]
        # Two connections: one with every shard mapped, one left open with a reply unread.
        reply, fds = SC.fetch(build.shard_socket, protos, tokens)
        maps = [SC.map_readonly(fd, size) for fd, size in zip(fds, reply.sizes)]
        sc = SC.ShardClient(build.shard_socket, protos)
        sc.send_frame(protos.cls("familyd.v1.ShardFdRequest")(tokens=tokens).SerializeToString())
        print(json.dumps({"build": build.build_id, "tokens": tokens,
                          "sum": sum(sum(m[:64]) for m in maps)}), flush=True)
    else:
        print(json.dumps({"started": True}), flush=True)
        c.call("familyd.v1.FamilyService/Build",
               {"family": "grouped_experts", "config": BIG, "materialize": {"enabled": True}, "privateBuild": True},
               timeout=300)
    time.sleep(3600)


def spawn_child(what, daemon):
    env = dict(os.environ)
    p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", what,
                          daemon.socket], stdout=subprocess.PIPE, env=env)
    line = p.stdout.readline()
    if not line:
        p.kill()
        p.wait()
        raise AssertionError("the %s child died before it was ready" % what)
    return p, json.loads(line)


def kill(p):
    p.send_signal(signal.SIGKILL)
    p.wait()
    p.stdout.close()


def status(c):
    st = c.call("familyd.v1.AdminService/GetStatus", {})
    assert st.ok, st
    return st.reply


class TestKilledClients(unittest.TestCase):
    def setUp(self):
        # --build-grace-ms 0: a build goes as soon as nothing holds it, killed holders too.
        self.d = H.Daemon(registry=REGISTRY, extra_args=["--build-grace-ms", "0"])
        self.d.start()
        self.addCleanup(self.d.cleanup)
        self.pid = self.d.proc.pid

    def tearDown(self):
        self.d.stop()
        err = self.d.stderr()
        self.assertNotIn("runtime error:", err)
        self.assertNotIn("Sanitizer", err)

    def test_killed_while_holding_mapped_shards(self):
        c = self.d.client
        self.assertTrue(c.health().ok)
        # This process builds too (the healthy client): the daemon then watches it (a pidfd)
        # until it exits, as it watches every process that held a build. Count from there.
        b = c.call("familyd.v1.FamilyService/Build",
                   {"family": "grouped_experts", "config": SMALL,
                    "materialize": {"enabled": True}, "privateBuild": True})
        self.assertTrue(b.ok, b)
        self.assertTrue(c.call("familyd.v1.FamilyService/ReleaseBuild",
                               {"buildId": b.reply.build.build_id}).ok)
        fds_before = fd_count(self.pid)
        with HealthyClient(self.d) as hc:
            p, info = spawn_child("hold", self.d)
            try:
                # By id: the healthy client's own short-lived builds come and go meanwhile.
                self.assertTrue(c.call("familyd.v1.FamilyService/GetBuild",
                                       {"buildId": info["build"]}).ok)
            finally:
                kill(p)
            time.sleep(1)
        self.assertEqual(hc.problems, [])
        self.assertGreater(hc.calls, 0)
        # Its connections (one API, two shard socket, one with a reply unread) and the healthy
        # client's go away, and so does its reference to the build it made: nothing else holds
        # it, and with --build-grace-ms 0 it is freed at once (tokens, segments, bytes), so the
        # daemon's descriptors come back to where they were.
        self.assertTrue(wait_for(lambda: status(c).builds == 0, 15), "the build outlived its "
                        "only holder: %s" % status(c))
        st = status(c)
        self.assertEqual((st.builds, st.shm_bytes_in_use), (0, 0))
        reply, fds = SC.fetch(self.d.shard_socket, self.d.protos, info["tokens"])
        self.assertEqual((reply.code, fds), (5, []))     # NOT_FOUND: the tokens went with it
        res = c.call("familyd.v1.FamilyService/GetBuild", {"buildId": info["build"]})
        self.assertEqual(res.code, "NOT_FOUND", res)
        self.assertTrue(wait_for(lambda: fd_count(self.pid) <= fds_before, 15),
                        "daemon descriptors: %d before, %d at the end"
                        % (fds_before, fd_count(self.pid)))

    def test_killed_during_a_materialising_build(self):
        c = self.d.client
        with HealthyClient(self.d) as hc:
            p, _ = spawn_child("build", self.d)
            big = 64 * 1024 * 1024 * 4 + 64 * 512 * 1024 * 4
            # Killed once the big Build has reserved its bytes (the fill is under way).
            self.assertTrue(wait_for(lambda: status(c).shm_bytes_in_use >= big, 30),
                            "the big Build never started")
            kill(p)
            # Nobody can learn that build's id any more: the daemon keeps nothing of it.
            gone = wait_for(lambda: status(c).shm_bytes_in_use < big, 60)
        # Read once the healthy client is done (its own small build released).
        st = status(c)
        self.assertEqual(hc.problems, [])
        self.assertTrue(gone, "the killed client's Build still holds %d bytes"
                        % st.shm_bytes_in_use)
        self.assertEqual((st.builds, st.shm_bytes_in_use), (0, 0),
                         "the killed client's Build was kept")
        self.assertEqual(len(c.call("familyd.v1.FamilyService/ListBuilds", {}).reply.builds), 0)


class TestBudgetExhausted(unittest.TestCase):
    """One client fills --shm-budget: its next Build is refused with RESOURCE_EXHAUSTED and the
    text of docs/semantics.md; another client meanwhile resolves and makes layout-only builds; after
    the first releases, everyone builds again. (test_build.py TestLimits has the exact
    accounting with one client; test_build_limits.py the descriptor budget.)"""

    def test_budget_exhausted_by_one_client(self):
        budget = 4 * SMALL_BYTES
        with H.Daemon(registry=REGISTRY, extra_args=["--shm-budget", str(budget),
                                                     "--build-grace-ms", "0"]) as d:
            greedy = H.Client(d.socket, d.protos)
            other = H.Client(d.socket, d.protos)
            self.addCleanup(greedy.close)
            self.addCleanup(other.close)
            req = {"family": "grouped_experts", "config": SMALL, "materialize": {"enabled": True}, "privateBuild": True}
            with HealthyClient(d, build=False) as hc:
                held = []
                for _ in range(4):
                    b = greedy.call("familyd.v1.FamilyService/Build", req)
                    self.assertTrue(b.ok, b)
                    held.append(b.reply.build.build_id)
                refused = greedy.call("familyd.v1.FamilyService/Build", req)
                self.assertEqual(refused.code, "RESOURCE_EXHAUSTED", refused)
                self.assertEqual(refused.message,
                                 "shm budget exceeded: build needs %d bytes, %d of %d in use"
                                 % (SMALL_BYTES, budget, budget))
                self.assertEqual(greedy.error_details(refused)[1][0].reason, "SHM_BUDGET")
                # Another client: the same refusal for shared memory, everything else served.
                self.assertEqual(other.call("familyd.v1.FamilyService/Build", req).code,
                                 "RESOURCE_EXHAUSTED")
                plain = other.call("familyd.v1.FamilyService/Build",
                                   {"family": "grouped_experts", "config": SMALL})
                self.assertTrue(plain.ok, plain)
                self.assertTrue(other.call("familyd.v1.FamilyService/ReleaseBuild",
                                           {"buildId": plain.reply.build.build_id}).ok)
                self.assertTrue(greedy.call("familyd.v1.FamilyService/ReleaseBuild",
                                            {"buildId": held.pop()}).ok)
                again = other.call("familyd.v1.FamilyService/Build", req)
                self.assertTrue(again.ok, again)
                reply, fds = SC.fetch(again.reply.build.shard_socket, d.protos,
                                      [again.reply.build.shards[0].token])
                for fd in fds:
                    os.close(fd)
                self.assertEqual((reply.code, len(fds)), (0, 1))
                for i in held + [again.reply.build.build_id]:
                    self.assertTrue(greedy.call("familyd.v1.FamilyService/ReleaseBuild",
                                                {"buildId": i}).ok)
            self.assertEqual(hc.problems, [])
            st = status(d.client)
            self.assertEqual((st.builds, st.shm_bytes_in_use), (0, 0))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child_main(sys.argv[2:])
    else:
        unittest.main(verbosity=2)
