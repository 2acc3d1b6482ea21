#!/usr/bin/python3
"""Daemons in etcd mode (--coordinator): a real etcd (etcd_harness.py) and real familyd daemons.

Membership through etcd: four daemons agree on the world, order and version; a SIGKILLed daemon
is down everywhere within the lease TTL + 2 s and up again after a restart; a clean stop is seen
at once; ForgetNode is refused while the node is up and forgets it everywhere once it is down;
a second daemon of a live name refuses to start. An etcd outage of 10 s: nobody is marked down,
local calls answer, `familyd.cluster` is NOT_SERVING (a live health Watch sees NOT_SERVING, then
SERVING after it, and a Watch of the daemon's own status no message more) and GetStatus says
why; after it the
leases hold and the topology agrees. A three-member etcd losing a member: no disruption. Bad
records written by hand (garbage, a duplicate node rank, another cluster's): one log line each,
nothing crashes, the rest of the topology stays.
"""

import os
import re
import subprocess
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402
from cluster_harness import DaemonViews  # noqa: E402
from etcd_harness import EtcdCluster, EtcdServer  # noqa: E402

os.environ.setdefault("UCX_TLS", "tcp")
os.environ.setdefault("UCX_NET_DEVICES", "lo")
os.environ.setdefault("UCX_LOG_LEVEL", "error")

REGISTRY = os.path.join(H.CONFORMANCE, "registry")
DOWN_MS = 2000          # the lease's TTL: 2 s
TTL_S = 2.0
GE = "grouped_experts"
GE_CFG = {"num_experts": 8, "hidden_size": 16, "moe_intermediate_size": 8,
          "initializer_range": 0.02}


def varint(n):
    n &= (1 << 64) - 1
    out = b""
    while True:
        b = n & 0x7f
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def member_record(name, node_rank=-1, cluster="c1"):
    """A familyd.coord.v1.CoordMember as a daemon writes it (proto/etcd/familyd/coord/v1/member.proto),
    without devices."""
    def string(field, s):
        b = s.encode()
        return varint(field << 3 | 2) + varint(len(b)) + b
    return (string(1, name) + varint(2 << 3) + varint(node_rank) + varint(3 << 3) + varint(7)
            + string(8, cluster))


def wire_fields(data):
    """{field number: [values]} of a serialized protobuf message (varints as ints,
    length-delimited fields as bytes): enough to look at a record without its descriptor."""
    out, i = {}, 0

    def read_varint():
        nonlocal i
        shift = n = 0
        while True:
            b = data[i]
            i += 1
            n |= (b & 0x7f) << shift
            shift += 7
            if not b & 0x80:
                return n
    while i < len(data):
        key = read_varint()
        field, kind = key >> 3, key & 7
        if kind == 0:
            value = read_varint()
        elif kind == 2:
            size = read_varint()
            value, i = data[i:i + size], i + size
        elif kind == 1:
            value, i = data[i:i + 8], i + 8
        elif kind == 5:
            value, i = data[i:i + 4], i + 4
        else:
            raise ValueError("wire type %d" % kind)
        out.setdefault(field, []).append(value)
    return out


class EtcdDaemons(DaemonViews):
    """n familyd daemons in etcd mode against etcd (endpoints), cluster c1, 2 host devices each."""

    def __init__(self, endpoints, n, cluster="c1", extra_args=()):
        self.endpoints = endpoints
        self.cluster = cluster
        self.protos = H.Protos()
        self.extra_args = list(extra_args)
        self.daemons = [self.make(i) for i in range(n)]

    def make(self, i, name=None):
        args = ["--coordinator", "etcd://" + self.endpoints, "--cluster", self.cluster,
                "--down-ms", str(DOWN_MS), "--node-rank", str(i)] + self.extra_args
        return H.Daemon(REGISTRY, host_devices=2, node_name=name or "node%d" % i,
                        extra_args=args, protos=self.protos, state_dir=False)

    def start(self):
        for d in self.daemons:
            d.start()
        return self

    def restart(self, i):
        self.daemons[i].cleanup()
        self.daemons[i] = self.make(i)
        self.daemons[i].start()

    def close(self, check=True):
        try:
            if check:
                for d in self.daemons:
                    if d.alive():
                        d.stop()
        finally:
            for d in self.daemons:
                d.cleanup()

    def __enter__(self):
        try:
            return self.start()
        except BaseException:
            self.close(check=False)
            raise

    def __exit__(self, exc_type, exc, tb):
        self.close(check=exc_type is None)
        return False


def prefix_revision(etcd, prefix):
    """The newest mod_revision of a key under prefix, from etcdctl's JSON."""
    import json
    out = json.loads(etcd.etcdctl("get", "--prefix", prefix, "-w", "json"))
    return max(int(kv["mod_revision"]) for kv in out.get("kvs", []))


def keys(etcd, prefix="/familyd/c1/"):
    out = etcd.etcdctl("get", "--prefix", prefix, "--keys-only").decode()
    return sorted(k for k in out.split("\n") if k)


class TestMembership(unittest.TestCase):
    def test_four_agree_kill_restart_stop_forget_duplicate(self):
        with EtcdServer() as etcd, EtcdDaemons(etcd.endpoint, 4) as c:
            took, view = c.wait_agreement(states=["up"] * 4)
            version, world, nodes = view
            print("4 daemons agreed in %.2f s on version %d" % (took, version))
            self.assertEqual(world, 8)
            self.assertEqual([n[:3] for n in nodes],
                             [("node%d" % i, 2 * i, 2) for i in range(4)])
            # The version is the prefix's newest mod_revision.
            self.assertEqual(version, prefix_revision(etcd, "/familyd/c1/"))
            self.assertEqual(keys(etcd), ["/familyd/c1/alive/node%d" % i for i in range(4)] +
                             ["/familyd/c1/members/node%d" % i for i in range(4)])
            for i in range(4):
                t = c.topology(i)
                self.assertEqual(t.local_node, "node%d" % i)
                self.assertEqual([n.local for n in t.nodes], [j == i for j in range(4)])
                st = c.status(i)
                self.assertEqual((st.peers_up, st.peers_down), (3, 0))
                self.assertEqual(st.topology_version, version)
                self.assertTrue(st.coordinator.reachable)
                self.assertEqual(st.coordinator.endpoints, etcd.endpoint)
                self.assertEqual(st.coordinator.cluster, "c1")
                self.assertEqual(c.client(i).health("familyd.cluster").reply.status, 1)

            # SIGKILL: down everywhere within the lease's TTL + 2 s.
            t_kill = time.monotonic()
            c.daemons[3].kill()
            seen = {}
            while len(seen) < 3 and time.monotonic() - t_kill < TTL_S + 5:
                for i in range(3):
                    if i not in seen and c.states(i)["node3"] == "down":
                        seen[i] = time.monotonic() - t_kill
                time.sleep(0.05)
            print("node3 SIGKILLed: down after %s s" % ", ".join("%.2f" % s for s in seen.values()))
            self.assertEqual(len(seen), 3, seen)
            self.assertLess(max(seen.values()), TTL_S + 2)
            _, view = c.wait_agreement(states=["up", "up", "up", "down"])
            self.assertEqual(view[1], 8)   # the down node keeps its ranks
            self.assertEqual(view[2][3][:3], ("node3", 6, 2))
            self.assertEqual((c.status(0).peers_up, c.status(0).peers_down), (2, 1))

            # A restart: up everywhere again.
            c.restart(3)
            c.wait_agreement(states=["up"] * 4)

            # A clean stop revokes the lease: down at once, the record stays.
            t_stop = time.monotonic()
            c.daemons[3].stop()
            c.wait_agreement(states=["up", "up", "up", "down"], timeout=TTL_S)
            print("node3 stopped: down everywhere after %.2f s" % (time.monotonic() - t_stop))
            self.assertIn("/familyd/c1/members/node3", keys(etcd))
            self.assertNotIn("/familyd/c1/alive/node3", keys(etcd))

            # ForgetNode: refused for an up node (the embedded mode's words), done for a down
            # one, and gone everywhere.
            res = c.client(0).call("familyd.v1.MeshService/ForgetNode", node="node2")
            self.assertEqual(res.code, "FAILED_PRECONDITION")
            self.assertEqual(res.message, "node 'node2' is up; only a down node can be forgotten")
            self.assertEqual(c.client(0).error_details(res)[1][0].reason, "NODE_NOT_DOWN")
            res = c.client(0).call("familyd.v1.MeshService/ForgetNode", node="node0")
            self.assertEqual(res.message, "node 'node0' is this daemon's own node")
            res = c.client(0).call("familyd.v1.MeshService/ForgetNode", node="nope")
            self.assertEqual((res.code, res.message),
                             ("NOT_FOUND", "node 'nope' is not in the topology"))
            res = c.client(1).call("familyd.v1.MeshService/ForgetNode", node="node3")
            self.assertTrue(res.ok, res)
            self.assertNotIn("node3", c.states(1))   # at once on the daemon asked
            _, view = c.wait_agreement(states=["up"] * 3, among=[0, 1, 2])
            self.assertEqual(view[1], 6)
            self.assertNotIn("/familyd/c1/members/node3", keys(etcd))

            # A second daemon of a live name refuses to start, after waiting out a stale key.
            dup = c.make(1)
            try:
                dup.spawn()
                rc = dup.proc.wait(TTL_S + 20)
                self.assertNotEqual(rc, 0)
                self.assertIn("Another familyd holds the node name 'node1' in cluster 'c1' "
                              "(/familyd/c1/alive/node1 exists in etcd and is kept alive), "
                              "refusing to start.", dup.stderr())
            finally:
                dup.cleanup()
            c.wait_agreement(states=["up"] * 3, among=[0, 1, 2])

    def test_member_record_follows_a_reload(self):
        # node1 serves a copy of the conformance registry; replaced by the example registry and
        # reloaded, its record in etcd (and so every daemon's topology) carries the new digest.
        import shutil
        import signal
        tmp = H.short_tmpdir("fd-coord-")
        self.addCleanup(shutil.rmtree, tmp, True)
        reg = os.path.join(tmp, "registry")
        shutil.copytree(REGISTRY, reg)
        with EtcdServer() as etcd, EtcdDaemons(etcd.endpoint, 2) as c:
            c.daemons[1].cleanup()
            c.daemons[1] = H.Daemon(reg, host_devices=2, node_name="node1",
                                    extra_args=c.make(1).extra_args, protos=c.protos,
                                    state_dir=False)
            c.daemons[1].start()
            c.wait_agreement(states=["up"] * 2)

            # The record: its name, and no UCX worker address (etcd mode dials none:
            # docs/coordinator.md, "No UCX worker in etcd mode").
            record = wire_fields(etcd.get("/familyd/c1/members/node1"))
            self.assertEqual(record[1], [b"node1"])
            self.assertNotIn(5, record)

            def digests(i):
                return [n.registry_digest for n in c.topology(i).nodes]
            before = digests(1)[1]
            self.assertEqual(len(before), 64)
            self.assertEqual(digests(0), digests(1))
            shutil.rmtree(reg)
            shutil.copytree(os.path.join(H.SOURCE_ROOT, "deploy", "registry"), reg)
            c.daemons[1].signal(signal.SIGHUP)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and digests(0)[1] == before:
                time.sleep(0.1)
            after = digests(1)[1]
            self.assertNotEqual(after, before)
            self.assertEqual(digests(0)[1], after)

    def test_forget_after_ms_by_the_first_node_up(self):
        with EtcdServer() as etcd, \
                EtcdDaemons(etcd.endpoint, 3, extra_args=["--forget-after-ms", "1000"]) as c:
            c.wait_agreement(states=["up"] * 3)
            c.daemons[2].kill()
            c.wait_agreement(states=["up", "up", "down"], among=[0, 1])
            _, view = c.wait_agreement(states=["up", "up"], among=[0, 1], timeout=10)
            self.assertEqual(view[1], 4)
            self.assertEqual(keys(etcd), ["/familyd/c1/alive/node0", "/familyd/c1/alive/node1",
                                          "/familyd/c1/members/node0", "/familyd/c1/members/node1"])
            logs = [c.daemons[i].stderr().count("Forgot node node2: down for 1000 ms")
                    for i in range(2)]
            self.assertEqual(logs, [1, 0])   # node0 comes first in the order


class HealthWatch:
    """A live grpc.health.v1.Health/Watch: the statuses it sends, as they come."""

    def __init__(self, client, service):
        self.call = client.stream("grpc.health.v1.Health/Watch", {"service": service})
        self.statuses = []
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        try:
            for m in self.call:
                with self.cond:
                    self.statuses.append(m.status)
                    self.cond.notify_all()
        except Exception:  # cancelled at the end
            pass

    def wait_for(self, statuses, timeout=30):
        deadline = time.monotonic() + timeout
        with self.cond:
            while self.statuses != statuses and time.monotonic() < deadline:
                self.cond.wait(0.2)
            return list(self.statuses)

    def close(self):
        self.call.cancel()
        self.thread.join(10)


class TestOutage(unittest.TestCase):
    def test_etcd_stopped_for_ten_seconds(self):
        with EtcdServer() as etcd, EtcdDaemons(etcd.endpoint, 3) as c:
            _, before = c.wait_agreement(states=["up"] * 3)
            P = c.protos
            # Live health watches: familyd.cluster's sends each change (the health protocol),
            # the daemon's own ("") none, since its status never changes.
            cluster_watch = HealthWatch(c.client(0), "familyd.cluster")
            own_watch = HealthWatch(c.client(0), "")
            self.assertEqual(cluster_watch.wait_for([1]), [1])      # SERVING
            self.assertEqual(own_watch.wait_for([1]), [1])
            etcd.stop()
            t0 = time.monotonic()
            while time.monotonic() - t0 < 10:
                for i in range(3):
                    self.assertEqual(c.view(i), before)   # nobody down for etcd's outage
                time.sleep(0.5)
            # The watch saw the outage: NOT_SERVING, once.
            self.assertEqual(cluster_watch.wait_for([1, 2]), [1, 2])
            for i in range(3):
                cl = c.client(i)
                self.assertEqual(cl.health("familyd.cluster").reply.status, 2)  # NOT_SERVING
                self.assertEqual(cl.health("").reply.status, 1)                  # SERVING
                st = c.status(i).coordinator
                self.assertFalse(st.reachable)
                self.assertIn("from " + etcd.endpoint, st.last_error)
                # Local calls answer: a mesh over the whole cluster and a Build on it.
                mesh = cl.call("familyd.v1.MeshService/CreateMesh",
                               {"mesh": {"deviceMesh": [{"name": "dp", "size": 6}]}})
                self.assertTrue(mesh.ok, mesh)
                req = P.cls("familyd.v1.BuildRequest")(family=GE, mesh_id=mesh.reply.mesh_id)
                req.config.SetInParent()
                for k, v in GE_CFG.items():
                    req.config.fields[k].CopyFrom(P.value(v))
                res = cl.call("familyd.v1.FamilyService/Build", req)
                self.assertTrue(res.ok, res)
                self.assertEqual(c.daemons[i].stderr().count("etcd unreachable"), 1)
            # familyctl status says so too.
            out = subprocess.run([H.familyctl_bin(), "--socket", c.daemons[0].socket, "status"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 stdin=subprocess.DEVNULL, timeout=60)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertRegex(out.stdout.decode(), r"coordinator +etcd %s, cluster c1, "
                             r"unreachable: .*from %s" % (re.escape(etcd.endpoint),
                                                          re.escape(etcd.endpoint)))
            # ForgetNode needs etcd's word.
            res = c.client(0).call("familyd.v1.MeshService/ForgetNode", node="node2")
            self.assertEqual((res.code, res.message), (
                "UNAVAILABLE", "etcd is unreachable; a node can be forgotten once it is back"))
            self.assertEqual(c.client(0).error_details(res)[1][0].reason,
                             "COORDINATOR_UNAVAILABLE")
            etcd.members[0].start()
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and not all(
                    c.client(i).health("familyd.cluster").reply.status == 1 for i in range(3)):
                time.sleep(0.1)
            for i in range(3):
                self.assertEqual(c.client(i).health("familyd.cluster").reply.status, 1)
                self.assertTrue(c.status(i).coordinator.reachable)
                self.assertEqual(c.daemons[i].stderr().count("etcd reachable again"), 1)
            # ... and its end: SERVING again; the daemon's own status was never sent again.
            self.assertEqual(cluster_watch.wait_for([1, 2, 1]), [1, 2, 1])
            time.sleep(0.5)
            self.assertEqual(own_watch.statuses, [1])
            cluster_watch.close()
            own_watch.close()
            # The leases hold: every alive key is there past a TTL, and the watch goes on.
            time.sleep(TTL_S + 1)
            self.assertEqual(keys(etcd, "/familyd/c1/alive/"),
                             ["/familyd/c1/alive/node%d" % i for i in range(3)])
            c.wait_agreement(states=["up"] * 3)
            c.daemons[2].kill()
            c.wait_agreement(states=["up", "up", "down"], among=[0, 1], timeout=TTL_S + 3)

    def test_three_member_etcd_loses_one(self):
        with EtcdCluster(3, fast_elections=True) as etcd, EtcdDaemons(etcd.endpoints, 3) as c:
            _, before = c.wait_agreement(states=["up"] * 3)
            etcd.members[0].stop()
            t0 = time.monotonic()
            while time.monotonic() - t0 < 8:
                for i in range(3):
                    self.assertEqual([n[3] for n in c.view(i)[2]], ["up"] * 3)
                time.sleep(0.5)
            for i in range(3):
                self.assertEqual(c.client(i).health("familyd.cluster").reply.status, 1)
            # The watch and the leases live on the other members.
            c.daemons[2].stop()
            c.wait_agreement(states=["up", "up", "down"], among=[0, 1], timeout=5)
            self.assertEqual(sorted(k for k in etcd.through(etcd.members[1:]).etcdctl(
                "get", "--prefix", "/familyd/c1/alive/", "--keys-only").decode().split("\n") if k),
                ["/familyd/c1/alive/node0", "/familyd/c1/alive/node1"])


class TestBadRecords(unittest.TestCase):
    def test_each_refused_with_one_line(self):
        with EtcdServer() as etcd, EtcdDaemons(etcd.endpoint, 2) as c:
            _, before = c.wait_agreement(states=["up"] * 2)
            cases = (
                ("/familyd/c1/members/junk", b"\xff\xfe garbage \x00\x01",
                 "Refusing the member record /familyd/c1/members/junk (13 bytes): not a valid "
                 "familyd member of that name, ignoring"),
                ("/familyd/c1/members/dup", member_record("dup", node_rank=0),
                 "Refusing the member record /familyd/c1/members/dup: node rank 0 is held by "
                 "node0, whose record is older, ignoring"),
                ("/familyd/c1/members/other", member_record("other", node_rank=9, cluster="c2"),
                 "Refusing the member record /familyd/c1/members/other: it is of cluster 'c2', "
                 "not 'c1', ignoring"),
            )
            for key, value, line in cases:
                etcd.put(key, value)
                etcd.put(key.replace("members", "alive"), "1")
            time.sleep(1.5)
            for i in range(2):
                self.assertTrue(c.daemons[i].alive())
                log = c.daemons[i].stderr()
                for key, value, line in cases:
                    self.assertEqual(log.count(line), 1, (i, line, log[-3000:]))
                    self.assertEqual(log.count(key), 1, (i, key))
            _, after = c.wait_agreement(states=["up"] * 2)
            self.assertEqual(after[1:], before[1:])
            # A daemon's own record deleted by hand is written again.
            etcd.delete("/familyd/c1/members/node1")
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and etcd.get("/familyd/c1/members/node1") is None:
                time.sleep(0.1)
            self.assertIsNotNone(etcd.get("/familyd/c1/members/node1"))
            _, after = c.wait_agreement(states=["up"] * 2)
            self.assertEqual(after[1:], before[1:])
            # A good record by hand is taken (and the bad ones still are not).
            etcd.put("/familyd/c1/members/hand", member_record("hand", node_rank=5))
            _, view = c.wait_agreement(states=["up", "up", "down"])
            self.assertEqual([n[0] for n in view[2]], ["node0", "node1", "hand"])

    def test_records_past_max_nodes_wait(self):
        with EtcdServer() as etcd, EtcdDaemons(etcd.endpoint, 2, extra_args=["--max-nodes", "3"]) as c:
            c.wait_agreement(states=["up"] * 2)
            etcd.put("/familyd/c1/members/hand", member_record("hand", node_rank=5))
            _, view = c.wait_agreement(states=["up", "up", "down"])
            etcd.put("/familyd/c1/members/extra", member_record("extra", node_rank=6))
            line = ("Refusing the member record /familyd/c1/members/extra: the cluster has "
                    "--max-nodes 3 members with older records, ignoring")
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and not all(
                    line in c.daemons[i].stderr() for i in range(2)):
                time.sleep(0.1)
            for i in range(2):
                self.assertEqual(c.daemons[i].stderr().count(line), 1, i)
            _, view = c.wait_agreement(states=["up", "up", "down"])
            self.assertEqual([n[0] for n in view[2]], ["node0", "node1", "hand"])
            # A forgotten member frees its place: the waiting record takes it.
            etcd.delete("/familyd/c1/members/hand")
            deadline = time.monotonic() + 10
            names = None
            while time.monotonic() < deadline and names != ["node0", "node1", "extra"]:
                _, view = c.wait_agreement(states=["up", "up", "down"])
                names = [n[0] for n in view[2]]
            self.assertEqual(names, ["node0", "node1", "extra"])


if __name__ == "__main__":
    unittest.main()
