#!/usr/bin/python3
"""Validate through the RPC: each violation kind with its reason and text, aliases, order."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402

REGISTRY = os.path.join(H.CONFORMANCE, "registry")
CFG = {"fields": {"num_experts": {"intValue": 8}, "hidden_size": {"intValue": 16},
                  "moe_intermediate_size": {"intValue": 8},
                  "initializer_range": {"doubleValue": 0.02}}}
TAIL = "; build it again on the job's mesh (familyd.torch.build_module with mesh=)"


class TestValidate(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = H.Daemon(registry=REGISTRY)
        cls.d.start()
        c = cls.c = cls.d.client
        mesh = lambda dims: c.call("familyd.v1.MeshService/CreateMesh",
                                   {"mesh": {"deviceMesh": [{"name": n, "size": s}
                                                            for n, s in dims]}}).reply.mesh_id
        cls.mesh = mesh([("dp", 2), ("ep", 4)])
        cls.other = mesh([("dp", 8)])
        cls.build = c.call("familyd.v1.FamilyService/Build",
                           {"family": "grouped_experts", "config": CFG,
                            "meshId": cls.mesh}).reply.build.build_id
        cls.plain = c.call("familyd.v1.FamilyService/Build",
                           {"family": "grouped_experts", "config": CFG}).reply.build.build_id

    @classmethod
    def tearDownClass(cls):
        cls.d.stop()
        cls.d.cleanup()

    def layout(self, mesh=None, shape=(8, 16, 16), dim=0, kind="shard"):
        return {"meshId": mesh or self.mesh,
                "parameters": [{"name": "gate_up_proj", "shape": list(shape),
                                "placements": [{"axis": "ep", "kind": kind, "dim": dim},
                                               {"axis": "dp", "kind": "replicate"}]}]}

    def validate(self, boundaries, context=None):
        r = self.c.call("familyd.v1.FamilyService/Validate",
                        {"boundaries": boundaries, "context": context or {}})
        self.assertTrue(r.ok, r)
        return r.reply, [(list(v.fqns), v.reason, v.message) for v in r.reply.violations]

    def test_clean_model_with_aliases(self):
        reply, v = self.validate([
            {"fqns": ["layers.0.moe", "model.layers.0.moe"], "buildId": self.build,
             "appliedLayout": self.layout()},
            # The same build reached again (shared parameters), same shapes; a negative dim
            # is the same placement; replicate entries do not count.
            {"fqns": ["layers.1.moe"], "buildId": self.build,
             "appliedLayout": self.layout(dim=-3)}],
            {"meshId": self.mesh})
        self.assertEqual(v, [])
        self.assertTrue(reply.ok)

    def test_unknown_build_only(self):
        reply, v = self.validate([{"fqns": ["a", "b"], "buildId": "bld-nope"}],
                                 {"epSize": 2})
        self.assertFalse(reply.ok)
        self.assertEqual(v, [(["a", "b"], "UNKNOWN_BUILD", "build 'bld-nope' not found")])

    def test_released_build_is_unknown(self):
        b = self.c.call("familyd.v1.FamilyService/Build",
                        {"family": "grouped_experts", "config": CFG}).reply.build.build_id
        self.assertTrue(self.c.call("familyd.v1.FamilyService/ReleaseBuild",
                                    {"buildId": b}).ok)
        _, v = self.validate([{"fqns": ["x"], "buildId": b}])
        self.assertEqual(v[0][1], "UNKNOWN_BUILD")

    def test_mesh_problems(self):
        _, v = self.validate([{"fqns": ["m"], "buildId": self.build}], {"meshId": self.other})
        self.assertIn((["m"], "MESH_MISMATCH", "context and mesh belong to different jobs"), v)
        _, v = self.validate([{"fqns": ["m"], "buildId": self.build}], {"tpSize": 2, "epSize": 4})
        self.assertEqual(v, [(["m"], "CONTEXT_MESH_DISAGREE",
                              "context and mesh disagree on tp_size")])
        _, v = self.validate([{"fqns": ["m"], "buildId": self.build,
                               "appliedLayout": self.layout(mesh=self.other)}],
                             {"meshId": self.mesh})
        self.assertEqual(v, [(["m"], "LAYOUT_MESH_MISMATCH",
                              "constructed families cannot be applied with a different job "
                              "mesh")])
        # A build made without a mesh has no mesh to disagree with.
        _, v = self.validate([{"fqns": ["p"], "buildId": self.plain}], {"tpSize": 2})
        self.assertEqual(v, [])

    def test_axis_sizes(self):
        _, v = self.validate([{"fqns": ["layers.0.moe"], "buildId": self.plain}],
                             {"epSize": 4, "cpSize": 2})
        self.assertEqual(v, [
            (["layers.0.moe"], "AXIS_SIZE_MISMATCH",
             "family at ('layers.0.moe',) was constructed with cp=1, job requires 2" + TAIL),
            (["layers.0.moe"], "AXIS_SIZE_MISMATCH",
             "family at ('layers.0.moe',) was constructed with ep=1, job requires 4" + TAIL)])
        # The job's sizes come from its mesh when it names one.
        _, v = self.validate([{"fqns": ["a", "b"], "buildId": self.plain}],
                             {"meshId": self.mesh})
        self.assertEqual(v, [(["a", "b"], "AXIS_SIZE_MISMATCH",
                              "family at ('a', 'b') was constructed with ep=1, job requires 4"
                              + TAIL)])

    def test_shared_shapes_reported_at_the_second(self):
        _, v = self.validate([
            {"fqns": ["l0"], "buildId": self.build, "appliedLayout": self.layout()},
            {"fqns": ["l1"], "buildId": self.build,
             "appliedLayout": self.layout(shape=(8, 16, 32))}], {"meshId": self.mesh})
        self.assertEqual(v, [(["l1"], "SHARED_PARAMETER_SHAPE",
                              "shared family parameter 'gate_up_proj' has conflicting logical "
                              "shapes")])

    def test_layout_conflict(self):
        for lay in (self.layout(dim=1), self.layout(kind="replicate"),
                    {"meshId": self.mesh, "parameters": [{"name": "nope", "shape": [1]}]}):
            _, v = self.validate([{"fqns": ["l0", "alias"], "buildId": self.build,
                                   "appliedLayout": lay}], {"meshId": self.mesh})
            self.assertEqual(v, [(["l0", "alias"], "LAYOUT_CONFLICT",
                                  "layout at 'l0' conflicts with its constructed family layout")])

    def test_every_violation_in_order(self):
        _, v = self.validate([
            {"fqns": ["u"], "buildId": "bld-gone"},
            {"fqns": ["a"], "buildId": self.build, "appliedLayout": self.layout()},
            {"fqns": ["b"], "buildId": self.build,
             "appliedLayout": self.layout(mesh=self.other, shape=(8, 16, 32), dim=2)}],
            {"meshId": self.other})
        self.assertEqual([(f, r) for f, r, _ in v], [
            (["u"], "UNKNOWN_BUILD"),
            (["a"], "MESH_MISMATCH"), (["a"], "AXIS_SIZE_MISMATCH"),
            (["b"], "MESH_MISMATCH"), (["b"], "LAYOUT_MESH_MISMATCH"),
            (["b"], "AXIS_SIZE_MISMATCH"), (["b"], "SHARED_PARAMETER_SHAPE"),
            (["b"], "LAYOUT_CONFLICT")])

    def test_bad_context_is_an_error_not_a_violation(self):
        r = self.c.call("familyd.v1.FamilyService/Validate",
                        {"boundaries": [], "context": {"meshId": "mesh-none"}})
        self.assertEqual((r.code, r.message), ("NOT_FOUND", "mesh 'mesh-none' not found"))
        r = self.c.call("familyd.v1.FamilyService/Validate", {"context": {"tpSize": 0}})
        self.assertEqual((r.code, r.message), ("INVALID_ARGUMENT",
                                               "tp_size must be a positive integer"))
        empty = self.c.call("familyd.v1.FamilyService/Validate", {})
        self.assertTrue(empty.ok and empty.reply.ok, empty)


if __name__ == "__main__":
    unittest.main(verbosity=2)
