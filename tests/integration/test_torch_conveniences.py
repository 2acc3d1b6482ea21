#!/usr/bin/python3
"""build_module's targets and provenance, as the original framework's build_family took them
(docs/torch.md, "build_module"), against the real daemon (deploy/registry) in one process:
a preserved request (build_info(m).request, or the BuildInfo) builds the same member again and
takes no further keywords; the family's public class is its baseline; anything else is a
TypeError; BuildInfo.config is a deep copy taken at the build."""

import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import familyd_harness as H  # noqa: E402

sys.path.insert(0, os.path.join(H.SOURCE_ROOT, "client", "python"))

CONFIG = {"hidden_size": 32, "intermediate_size": 48, "initializer_range": 0.02}
D = None


def setUpModule():
    global D
    D = H.Daemon(registry=os.path.join(H.SOURCE_ROOT, "deploy", "registry"), host_devices=1,
                 node_name="itest-conveniences")
    D.start()


def tearDownModule():
    if D is not None:
        D.stop_checked()


class TestTargets(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import familyd
        cls.client = familyd.Client(D.socket, shard_socket=D.shard_socket)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()

    def build(self, target, config=CONFIG, **kw):
        import familyd.torch as FT
        m = FT.build_module(self.client, target, config, fqn="blk.mlp", trainable=False, **kw)
        self.addCleanup(FT.release, m)
        return m

    def test_preserved_request_builds_the_same_member(self):
        import torch
        import familyd.torch as FT
        first = self.build("mlp", use_fused_swiglu=True)
        info = FT.build_info(first)
        for target in (info.request, info):
            again = self.build(target)
            self.assertEqual(FT.build_info(again).build_id, info.build_id)
            self.assertEqual(FT.build_info(again).member.variant, "fused")
            self.assertTrue(torch.equal(again.gate_proj, first.gate_proj))
        with self.assertRaisesRegex(ValueError, "request arguments cannot be combined with "
                                                "additional keywords"):
            self.build(info.request, use_fused_swiglu=False)

    def test_public_class_is_its_baseline(self):
        import familyd.torch as FT
        cls = type("SwiGLUMLP", (), {"__module__": "hyper_parallel.components.modules.mlp"})
        m = self.build(cls)
        self.assertEqual(FT.build_info(m).request.family,
                         "hyper_parallel.components.modules.mlp.SwiGLUMLP")
        self.assertEqual(FT.build_info(m).member.family, "mlp")

    def test_other_targets_are_refused(self):
        with self.assertRaisesRegex(TypeError, "must be a family name, a preserved request "
                                               "or a class"):
            self.build(42)

    def test_config_snapshot_is_a_deep_copy(self):
        import familyd.torch as FT
        config = dict(CONFIG, extra={"nested": [1, 2]})
        m = self.build("mlp", config=config)
        config["extra"]["nested"].append(3)
        config["hidden_size"] = 64
        self.assertEqual(FT.build_info(m).config["extra"], {"nested": [1, 2]})
        self.assertEqual(FT.build_info(m).config["hidden_size"], 32)


if __name__ == "__main__":
    unittest.main(verbosity=2)
