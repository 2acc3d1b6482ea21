#!/usr/bin/python3
"""Build's descriptor budget: one shard segment (one descriptor) per materialised rank."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402

REGISTRY = os.path.join(H.CONFORMANCE, "registry")
CONFIG = {"fields": {"num_experts": {"intValue": 4}, "hidden_size": {"intValue": 8},
                     "moe_intermediate_size": {"intValue": 4},
                     "initializer_range": {"doubleValue": 0.02}}}


class TestShardLimit(unittest.TestCase):
    def test_max_shards_refuses_whole_builds_and_frees_on_release(self):
        with H.Daemon(registry=REGISTRY, extra_args=["--max-shards", "2"]) as d:
            c = d.client
            mesh = c.call("familyd.v1.MeshService/CreateMesh",
                          {"mesh": {"deviceMesh": [{"name": "ep", "size": 4}],
                                    "ranks": [0, 1, 2, 3]}})
            self.assertTrue(mesh.ok, mesh)
            req = {"family": "grouped_experts", "config": CONFIG, "materialize": {"enabled": True}}

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


if __name__ == "__main__":
    unittest.main(verbosity=2)
