#!/usr/bin/python3
"""familyd.torch.save_checkpoint and build_module(copy_weights=True), in one process against
the real daemon (the example registry, deploy/registry); the 4-worker round trip (tp=2 x dp=2
saved, tp=4 loaded, logits against plain torch) is test_checkpoint_torch.py's.

- save_checkpoint of modules built from a checkpoint written by the safetensors library
  (checkpoint_files.py: Llama names, and Mixtral experts, whose grouped parameters are stacked,
  concatenated and transposed) writes back exactly the tensors read: the same names, the same
  bytes (the maps undone), one file or several with an index, config.json; names="parameters"
  writes "<prefix>.<parameter>"; a tensor two modules share (a tied head) is written once.
- The rule "sharded before joined" undone: the parts of a concatenation regrouped from shard
  groups (familyd.torch.checkpoint._parts against the test's own interleaving).
- copy_weights=True: the replacement's values are exactly the source module's (whole
  parameters, and of a grouped member); without a module, or with a checkpoint too, ValueError.
"""

import json
import os
import shutil
import sys
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import familyd_harness as H  # noqa: E402
import checkpoint_files as CF  # noqa: E402

sys.path.insert(0, os.path.join(H.SOURCE_ROOT, "client", "python"))

REGISTRY = os.path.join(H.SOURCE_ROOT, "deploy", "registry")
CONFIG = {"vocab_size": 64, "hidden_size": 32, "num_attention_heads": 4,
          "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 48,
          "num_experts": 4, "moe_intermediate_size": 16, "initializer_range": 0.02,
          "rms_norm_eps": 1e-5}
D = None
TMP = None


def setUpModule():
    global D, TMP
    D = H.Daemon(registry=REGISTRY, host_devices=2, node_name="itest-ckpt-save")
    D.start()
    TMP = D.tmpdir


def tearDownModule():
    if D is not None:
        D.stop_checked()


class Base(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import familyd
        cls.client = familyd.Client(D.socket, shard_socket=D.shard_socket)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()

    def module(self, family, prefix, checkpoint, **kw):
        import familyd.torch as FT
        m = FT.build_module(self.client, family, CONFIG, fqn=prefix, checkpoint=checkpoint,
                            checkpoint_prefix=prefix, trainable=False, **kw)
        self.addCleanup(FT.release, m)
        return m


def read_all(directory):
    """{name: numpy array} of every tensor of a saved directory, read by the safetensors
    library; and the files' names."""
    from safetensors.numpy import load_file
    names = sorted(n for n in os.listdir(directory) if n.endswith(".safetensors"))
    out = {}
    for n in names:
        for k, v in load_file(os.path.join(directory, n)).items():
            assert k not in out, k
            out[k] = v
    return out, names


class TestSave(Base):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.tensors = CF.llama_tensors(CONFIG, layers=1, experts=True, seed=5)
        cls.src = os.path.join(TMP, "src")
        CF.write_checkpoint(cls.src, cls.tensors, "F32", files=2)

    def model(self):
        import torch
        model = torch.nn.Module()
        model.embed = self.module("embedding", "model.embed_tokens", self.src)
        model.attn = self.module("attention", "model.layers.0.self_attn", self.src)
        model.mlp = self.module("mlp", "model.layers.0.mlp", self.src)
        model.moe = self.module("grouped_experts", "model.layers.0.block_sparse_moe", self.src)
        model.norm = self.module("norm", "model.norm", self.src)
        model.extra = torch.nn.Parameter(torch.arange(6, dtype=torch.float32))
        return model

    def test_round_trip_same_names_same_bytes(self):
        import familyd.torch as FT
        out = os.path.join(TMP, "saved")
        written = FT.save_checkpoint(self.model(), out, config={"model_type": "llama"})
        got, files = read_all(out)
        self.assertEqual(files, ["model.safetensors"])
        want = {k: v for k, v in self.tensors.items()
                if not k.startswith(("lm_head", "model.layers.0.input_layernorm",
                                     "model.layers.0.post_attention_layernorm"))}
        want["extra"] = np.arange(6, dtype=np.float32)
        self.assertEqual(sorted(got), sorted(want))
        self.assertEqual(sorted(written), sorted(want))
        for k, v in want.items():
            self.assertEqual(got[k].tobytes(), v.tobytes(), k)
        with open(os.path.join(out, "config.json")) as f:
            self.assertEqual(json.load(f), {"model_type": "llama"})

    def test_several_files_and_an_index(self):
        import familyd.torch as FT
        out = os.path.join(TMP, "split")
        FT.save_checkpoint(self.model(), out, max_file_bytes=16 * 1024)
        got, files = read_all(out)
        self.assertGreater(len(files), 2)
        with open(os.path.join(out, "model.safetensors.index.json")) as f:
            index = json.load(f)
        self.assertEqual(sorted(index["weight_map"]), sorted(got))
        self.assertEqual(sorted(set(index["weight_map"].values())), files)
        self.assertEqual(got["model.layers.0.mlp.up_proj.weight"].tobytes(),
                         self.tensors["model.layers.0.mlp.up_proj.weight"].tobytes())

    def test_names_parameters(self):
        import familyd.torch as FT
        out = os.path.join(TMP, "by-name")
        FT.save_checkpoint(self.model(), out, names="parameters")
        got, _ = read_all(out)
        self.assertEqual(got["model.layers.0.mlp.gate_proj"].tobytes(),
                         self.tensors["model.layers.0.mlp.gate_proj.weight"].tobytes())
        # The grouped parameter whole, as the member holds it: [experts, hidden, 2 * moe].
        gu = got["model.layers.0.block_sparse_moe.gate_up_proj"]
        self.assertEqual(gu.shape, (4, 32, 32))
        w3 = self.tensors["model.layers.0.block_sparse_moe.experts.2.w3.weight"]
        self.assertEqual(gu[2, :, 16:].tobytes(), np.ascontiguousarray(w3.T).tobytes())
        with self.assertRaises(ValueError):
            FT.save_checkpoint(self.model(), out, names="fqn")

    def test_tied_tensor_written_once(self):
        import torch
        import familyd.torch as FT
        model = torch.nn.Module()
        model.embed = self.module("embedding", "model.embed_tokens", self.src)
        model.head = self.module("embedding", "model.embed_tokens", self.src, seed=1)
        out = os.path.join(TMP, "tied")
        self.assertEqual(FT.save_checkpoint(model, out), ["model.embed_tokens.weight"])

    def test_parts_regrouped_from_shard_groups(self):
        import torch
        from familyd.torch.checkpoint import _parts
        q, k = torch.arange(8.0), torch.arange(100.0, 108.0)
        # tp=2: the logical tensor is [q0 q1 q2 q3 k0 k1 k2 k3 | q4 .. q7 k4 .. k7].
        joined = torch.cat([q[:4], k[:4], q[4:], k[4:]])
        got = _parts("test", joined, 0, 2, 2)
        self.assertTrue(torch.equal(got[0], q) and torch.equal(got[1], k))
        got = _parts("test", torch.cat([q, k]), 0, 2, 1)
        self.assertTrue(torch.equal(got[0], q) and torch.equal(got[1], k))
        from familyd.torch.checkpoint import CheckpointSaveError
        with self.assertRaises(CheckpointSaveError):
            _parts("test", torch.arange(6.0), 0, 2, 2)


class TestShardSocket(Base):
    def test_default_is_the_daemons(self):
        """Without shard_socket= or $FAMILYD_SHARD_SOCKET a client deposits on the socket the
        daemon names (GetStatus.shard_socket), not shard.sock beside its API socket."""
        import familyd
        saved = os.environ.pop("FAMILYD_SHARD_SOCKET", None)
        try:
            c = familyd.Client(D.socket)
        finally:
            if saved is not None:
                os.environ["FAMILYD_SHARD_SOCKET"] = saved
        self.addCleanup(c.close)
        self.assertNotEqual(os.path.dirname(D.shard_socket) + "/shard.sock", D.shard_socket)
        self.assertEqual(c.default_shard_socket(), D.shard_socket)
        CF.write_checkpoint(os.path.join(TMP, "one"), {"weight": np.ones(32, np.float32)},
                            files=1)
        self.assertRegex(c.deposit_checkpoint(os.path.join(TMP, "one")), "^[0-9a-f]{32}$")


class TestCopyWeights(Base):
    def source(self, shapes, seed):
        import torch
        g = torch.Generator().manual_seed(seed)
        m = torch.nn.Module()
        for name, shape in shapes.items():
            setattr(m, name, torch.nn.Parameter(torch.randn(shape, generator=g)))
        m.config = dict(CONFIG)
        return m

    def test_values_are_the_sources(self):
        import torch
        import familyd.torch as FT
        src = self.source({"gate_proj": (48, 32), "up_proj": (48, 32), "down_proj": (32, 48)},
                          seed=3)
        m = FT.build_module(self.client, "mlp", module=src, fqn="copy.mlp", copy_weights=True)
        self.addCleanup(FT.release, m)
        for name, p in src.named_parameters():
            self.assertTrue(torch.equal(getattr(m, name).detach(), p.detach()), name)
        self.assertEqual(FT.build_info(m).origin, "replacement")

    def test_grouped_member(self):
        import torch
        import familyd.torch as FT
        src = self.source({"gate_up_proj": (4, 32, 32), "down_proj": (4, 16, 32)}, seed=4)
        m = FT.build_module(self.client, "grouped_experts", module=src, fqn="copy.moe",
                            copy_weights=True)
        self.addCleanup(FT.release, m)
        for name, p in src.named_parameters():
            self.assertTrue(torch.equal(getattr(m, name).detach(), p.detach()), name)

    def test_refusals(self):
        import familyd.torch as FT
        src = self.source({"gate_proj": (48, 32), "up_proj": (48, 32), "down_proj": (32, 48)},
                          seed=3)
        with self.assertRaises(ValueError):
            FT.build_module(self.client, "mlp", CONFIG, copy_weights=True)
        with self.assertRaises(ValueError):
            FT.build_module(self.client, "mlp", module=src, copy_weights=True,
                            checkpoint=os.path.join(TMP, "nothing"))


if __name__ == "__main__":
    unittest.main(verbosity=2)
