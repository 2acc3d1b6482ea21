#!/usr/bin/python3
"""Registry agreement across nodes: two daemons on loopback over UCX with their own registries.

Each daemon announces the digest of its loaded registry to its peers; GetTopology shows every
node's. What one daemon shows for the other must be what the other shows for itself (nothing
new is exposed to compute a digest from outside). A Build on a mesh whose nodes disagree fails
FAILED_PRECONDITION REGISTRY_MISMATCH naming the nodes and digests, Resolve still answers, and
once a reload (SIGHUP, or the Reload RPC) makes the registries agree the Build succeeds.
Registries that differ only in comments and file names have equal digests.
"""

import os
import re
import shutil
import signal
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402
from cluster_harness import Cluster, REGISTRY  # noqa: E402

GE = "grouped_experts"
GE_CFG = {"num_experts": 8, "hidden_size": 16, "moe_intermediate_size": 8,
          "initializer_range": 0.02}
DIGEST = re.compile(r"^[0-9a-f]{64}$")
SOURCE = os.path.join(REGISTRY, "families.yaml")
# A family only one node has: what Resolve or Build would do differs between the registries.
EXTRA = """name: extra
baseline: pkg.Extra
default_variant: plain
variants:
  plain:
    constructor: pkg.PlainExtra
    accepts: [config]
"""
TEXT = ("registry differs across the mesh's nodes: node '%s' has %s, node '%s' has %s; "
        "reload the registries so they agree")


def write(directory, name, text):
    with open(os.path.join(directory, name), "w") as f:
        f.write(text)


def commented(text):
    """The same YAML with comments added and blank lines moved: nothing Resolve reads."""
    out = ["# the same families, annotated", ""]
    for line in text.splitlines():
        out.append(line + ("   # note" if line.strip().startswith("baseline:") else ""))
        if line.strip().startswith("families:"):
            out.append("  # the families follow")
    return "\n".join(out) + "\n\n# end\n"


class TwoRegistries(Cluster):
    """A Cluster whose daemon i reads registries[i]."""

    def __init__(self, registries, **kwargs):
        self.registries = registries
        super().__init__(len(registries), **kwargs)

    def make(self, i, name=None, port=None, peers=None, extra_args=()):
        self.registry = self.registries[i]
        return super().make(i, name=name, port=port, peers=peers, extra_args=extra_args)


class TestRegistryAgreement(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="fd-digest-")
        self.dirs = [os.path.join(self.tmp, "node%d" % i) for i in (0, 1)]
        for d in self.dirs:
            os.makedirs(d)
            shutil.copy(SOURCE, d)
        write(self.dirs[1], "extra.yaml", EXTRA)

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    # --- helpers ---

    def digests(self, c, i):
        """What daemon i shows: {node name: digest}."""
        return {n.name: n.registry_digest for n in c.topology(i).nodes}

    def wait_digests(self, c, expect, timeout=15.0):
        """Until both daemons show `expect` ({node: digest}) for both nodes."""
        deadline = time.monotonic() + timeout
        seen = None
        while time.monotonic() < deadline:
            seen = [self.digests(c, i) for i in (0, 1)]
            if all(s == expect for s in seen):
                return
            time.sleep(0.05)
        self.fail("digests never became %r; seen %r" % (expect, seen))

    def own_digests(self, c):
        """Each daemon's digest as it shows it for itself, once the other shows the same."""
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            views = [self.digests(c, i) for i in (0, 1)]
            own = [views[i]["node%d" % i] for i in (0, 1)]
            if views[0] == views[1] and all(DIGEST.match(d) for d in own):
                return own
            time.sleep(0.05)
        self.fail("the daemons never agreed on what they show: %r" % views)

    def build(self, client, mesh_id):
        req = client.protos.cls("familyd.v1.BuildRequest")(family=GE, mesh_id=mesh_id)
        req.config.SetInParent()
        for k, v in GE_CFG.items():
            req.config.fields[k].CopyFrom(client.protos.value(v))
        return client.call("familyd.v1.FamilyService/Build", req)

    def assert_mismatch(self, res, client, text):
        self.assertEqual(res.code, "FAILED_PRECONDITION", res)
        self.assertEqual(res.message, text)
        _, infos = client.error_details(res)
        self.assertEqual(len(infos), 1, res)
        self.assertEqual((infos[0].domain, infos[0].reason), ("familyd", "REGISTRY_MISMATCH"))
        self.assertEqual(dict(infos[0].metadata), {})

    def create_mesh(self, c, i, mesh):
        res = c.client(i).call("familyd.v1.MeshService/CreateMesh", {"mesh": mesh})
        self.assertTrue(res.ok, res)
        return res.reply.mesh_id

    # --- the test ---

    def test_disagreement_refuses_builds_until_a_reload(self):
        with TwoRegistries(self.dirs, host_devices=2) as c:
            c.wait_agreement(world_size=4, states=["up", "up"], timeout=20)

            # Each node's digest, as it computes it, reaches the other.
            d0, d1 = self.own_digests(c)
            self.assertNotEqual(d0, d1)
            self.wait_digests(c, {"node0": d0, "node1": d1})

            mesh = self.create_mesh(c, 0, {"deviceMesh": [{"name": "dp", "size": 4}]})
            self.assertEqual(self.create_mesh(c, 1, {"deviceMesh": [{"name": "dp", "size": 4}]}),
                             mesh)
            # A Build over both nodes fails on either, naming both nodes and digests.
            self.assert_mismatch(self.build(c.client(0), mesh), c.client(0),
                                 TEXT % ("node0", d0, "node1", d1))
            self.assert_mismatch(self.build(c.client(1), mesh), c.client(1),
                                 TEXT % ("node1", d1, "node0", d0))
            # Resolve still answers locally, on the same mesh.
            req = c.client(0).protos.cls("familyd.v1.ResolveRequest")(family=GE)
            req.context.mesh_id = mesh
            res = c.client(0).call("familyd.v1.FamilyService/Resolve", req)
            self.assertTrue(res.ok, res)
            # A mesh of this node's ranks alone builds: only the mesh's nodes must agree.
            alone = self.create_mesh(c, 0, {"deviceMesh": [{"name": "dp", "size": 2}],
                                            "ranks": [0, 1]})
            res = self.build(c.client(0), alone)
            self.assertTrue(res.ok, res)

            # node1 reloads on SIGHUP a registry that differs from node0's only in comments,
            # blank lines and its file's name: the digests agree and the Build succeeds.
            os.remove(os.path.join(self.dirs[1], "extra.yaml"))
            os.remove(os.path.join(self.dirs[1], "families.yaml"))
            with open(SOURCE) as f:
                write(self.dirs[1], "00-renamed.yml", commented(f.read()))
            c.daemons[1].signal(signal.SIGHUP)
            self.wait_digests(c, {"node0": d0, "node1": d0})
            for i in (0, 1):
                res = self.build(c.client(i), mesh)
                self.assertTrue(res.ok, res)
                self.assertEqual(sorted(s.node for s in res.reply.build.shards),
                                 ["node0", "node0", "node1", "node1"])

            # node0 takes a new family with the Reload RPC: its own digest changes at once,
            # and its Builds over both nodes are refused again straight away.
            write(self.dirs[0], "extra.yaml", EXTRA)
            res = c.client(0).call("familyd.v1.AdminService/Reload")
            self.assertTrue(res.ok, res)
            self.assertEqual(self.digests(c, 0)["node0"], d1)
            self.assert_mismatch(self.build(c.client(0), mesh), c.client(0),
                                 TEXT % ("node0", d1, "node1", d0))
            # Within a heartbeat node1 sees it too, and refuses as well.
            self.wait_digests(c, {"node0": d1, "node1": d0})
            self.assert_mismatch(self.build(c.client(1), mesh), c.client(1),
                                 TEXT % ("node1", d0, "node0", d1))

    def test_single_daemon_shows_its_digest(self):
        """Without peers GetTopology shows this node's digest, the one a peer would see, and a
        reload that changes nothing Resolve reads keeps it."""
        with H.Daemon(self.dirs[0], host_devices=2, node_name="solo") as d:
            t = d.client.call("familyd.v1.MeshService/GetTopology")
            self.assertTrue(t.ok, t)
            before = t.reply.nodes[0].registry_digest
            self.assertRegex(before, DIGEST)
            with open(SOURCE) as f:
                write(self.dirs[0], "families.yaml", commented(f.read()))
            self.assertTrue(d.client.call("familyd.v1.AdminService/Reload").ok)
            t = d.client.call("familyd.v1.MeshService/GetTopology")
            self.assertEqual(t.reply.nodes[0].registry_digest, before)
            write(self.dirs[0], "extra.yaml", EXTRA)
            self.assertTrue(d.client.call("familyd.v1.AdminService/Reload").ok)
            t = d.client.call("familyd.v1.MeshService/GetTopology")
            self.assertRegex(t.reply.nodes[0].registry_digest, DIGEST)
            self.assertNotEqual(t.reply.nodes[0].registry_digest, before)

    def test_build_reply_and_sharing_key_carry_the_digest(self):
        """A Build answers the digest of the registry it was made from, and the digest is
        part of the sharing key: the same request after a reload that changed the registry
        makes a new build, after one that changed nothing it shares the old one."""
        with H.Daemon(self.dirs[0], host_devices=2, node_name="solo") as d:
            def build():
                req = {"family": GE, "config": {"fields": {
                    k: ({"doubleValue": v} if isinstance(v, float) else {"intValue": v})
                    for k, v in GE_CFG.items()}}, "materialize": {"enabled": True}}
                res = d.client.call("familyd.v1.FamilyService/Build", req)
                self.assertTrue(res.ok, res)
                return res.reply

            def digest():
                t = d.client.call("familyd.v1.MeshService/GetTopology")
                return t.reply.nodes[0].registry_digest

            first = build()
            self.assertEqual(first.build.registry_digest, digest())
            self.assertFalse(first.shared)
            with open(SOURCE) as f:
                write(self.dirs[0], "families.yaml", commented(f.read()))
            self.assertTrue(d.client.call("familyd.v1.AdminService/Reload").ok)
            same = build()
            self.assertTrue(same.shared)
            self.assertEqual(same.build.build_id, first.build.build_id)
            write(self.dirs[0], "extra.yaml", EXTRA)
            self.assertTrue(d.client.call("familyd.v1.AdminService/Reload").ok)
            other = build()
            self.assertFalse(other.shared)
            self.assertNotEqual(other.build.build_id, first.build.build_id)
            self.assertEqual(other.build.registry_digest, digest())
            self.assertNotEqual(other.build.registry_digest, first.build.registry_digest)
            got = d.client.call("familyd.v1.FamilyService/GetBuild",
                                {"buildId": first.build.build_id})
            self.assertEqual(got.reply.registry_digest, first.build.registry_digest)


if __name__ == "__main__":
    unittest.main(verbosity=2)
