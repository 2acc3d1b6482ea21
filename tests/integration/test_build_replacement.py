#!/usr/bin/python3
"""A replacement Build's inits from BuildRequest.source_config (docs/semantics.md, Build).

A replacement (BuildRequest.module) names its parameters' shapes; an init number named by a
config field that those shapes do not bind (deploy/registry: `normal: {std:
initializer_range}`) takes BuildRequest.source_config's field. Through the Python client
(client/python/familyd) against the real daemon with deploy/registry: a replacement with the
source module's config has, bit for bit, the values of the direct build of that config (same
seed, fqn and names: the fill is a function of name, index and seed); without source_config
those parameters are zeros; the errors, with their texts, reasons and fields; two replacements
differing only in the source_config fields their inits take never share a build, also after a
restart (the sharing key is restored from the state dir).
"""

import os
import shutil
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402
import test_durability_util as U  # noqa: E402

PYDIR = os.path.join(H.SOURCE_ROOT, "client", "python")
sys.path.insert(0, PYDIR)

try:
    import numpy as np
except ImportError:  # pragma: no cover - depends on the machine
    sys.stderr.write("test_build_replacement: numpy missing (apt-get install python3-numpy)\n")
    sys.exit(1 if os.environ.get("CI") else H.SKIP)

os.environ.setdefault("FAMILYD_DESCRIPTORS", H.descriptor_set_path())
import familyd  # noqa: E402

REGISTRY = os.path.join(H.SOURCE_ROOT, "deploy", "registry")
GE = "grouped_experts"
FQN = "layers.0.mlp"
CONFIG = {"hidden_size": 64, "moe_intermediate_size": 32, "num_experts": 4,
          "initializer_range": 0.02}
# The source module of CONFIG, as the trainer's existing module describes itself.
SOURCE = {"fqn": FQN, "parameters": [
    {"name": "gate_up_proj", "shape": [4, 64, 64], "dtype": "float32"},
    {"name": "down_proj", "shape": [4, 32, 64], "dtype": "float32"}]}
MLP_CONFIG = {"hidden_size": 32, "intermediate_size": 48, "initializer_range": 0.05}
MLP_SOURCE = {"fqn": "layers.1.mlp", "parameters": [
    {"name": "gate_proj", "shape": [48, 32]}, {"name": "up_proj", "shape": [48, 32]},
    {"name": "down_proj", "shape": [32, 48]}]}
DIRECT_ONLY = ("source_config is only for a replacement (module); a direct build's config is "
               "BuildRequest.config")

D = None
C = None


def setUpModule():
    global D, C
    D = H.Daemon(registry=REGISTRY, host_devices=8, extra_args=["--build-grace-ms", "0"])
    D.start()
    C = familyd.Client(D.socket, timeout=30)


def tearDownModule():
    if C is not None:
        C.close()
    if D is not None:
        D.stop_checked()


def values(b):
    """{parameter: a copy of rank 0's array} of a build without a mesh."""
    return {name: np.array(a) for name, a in b.ranks[0].items()}


class TestValues(unittest.TestCase):
    def assert_same_bits(self, a, b):
        self.assertEqual(sorted(a), sorted(b))
        for name in a:
            self.assertEqual(a[name].shape, b[name].shape, name)
            self.assertEqual(a[name].tobytes(), b[name].tobytes(), name)

    def test_source_config_gives_the_direct_values(self):
        with C.build(GE, config=CONFIG, seed=11, module_fqn=FQN) as d:
            direct = values(d)
        with C.build(GE, module=SOURCE, source_config=CONFIG, seed=11) as r:
            self.assertEqual(r.message.info.origin, "replacement")
            self.assertFalse(r.message.info.HasField("config_snapshot"))
            repl = values(r)
        self.assert_same_bits(repl, direct)
        # The registry's init, not zeros: normal(0, initializer_range).
        std = float(repl["gate_up_proj"].std())
        self.assertLess(abs(std - 0.02), 0.003, std)

    def test_only_the_init_fields_are_needed(self):
        # The shapes bind the others; a field no init names changes nothing.
        with C.build(GE, config=CONFIG, seed=4, module_fqn=FQN) as d:
            direct = values(d)
        with C.build(GE, module=SOURCE, seed=4,
                     source_config={"initializer_range": 0.02, "vocab_size": 7}) as r:
            self.assert_same_bits(values(r), direct)
        # An int is a number too.
        with C.build(GE, module=SOURCE, seed=4, source_config={"initializer_range": 1}) as r:
            std = float(values(r)["down_proj"].std())
            self.assertLess(abs(std - 1.0), 0.1, std)

    def test_another_family(self):
        with C.build("mlp", config=MLP_CONFIG, seed=2, module_fqn="layers.1.mlp") as d:
            direct = values(d)
        with C.build("mlp", module=MLP_SOURCE, source_config=MLP_CONFIG, seed=2) as r:
            self.assert_same_bits(values(r), direct)

    def test_without_source_config_zeros(self):
        for sc in (None, {}, {"hidden_size": 64}):
            with self.subTest(source_config=sc):
                with C.build(GE, module=SOURCE, source_config=sc, seed=11) as r:
                    for name, a in values(r).items():
                        self.assertFalse(a.any(), name)


class TestErrors(unittest.TestCase):
    def fails(self, message, reason, field, **kw):
        with self.assertRaises(familyd.FamilydError) as cm:
            C.build(GE, **kw)
        e = cm.exception
        self.assertEqual((e.code_name, e.reason, e.message),
                         ("INVALID_ARGUMENT", reason, message))
        self.assertEqual(e.metadata.get("field"), field)

    def test_direct_refuses_source_config(self):
        self.fails(DIRECT_ONLY, "BINDING", "source_config", config=CONFIG, source_config=CONFIG)
        # An empty source_config is present too.
        self.fails(DIRECT_ONLY, "BINDING", "source_config", config=CONFIG, source_config={})
        # Neither config nor module: step 2's first error.
        self.fails("provide exactly one of config or module", "BINDING", None,
                   source_config=CONFIG)

    def test_bound_field_must_agree(self):
        self.fails("parameter 'gate_up_proj' of module 'layers.0.mlp' has shape [4, 64, 64], "
                   "which contradicts hidden_size=32", "SHAPE", "gate_up_proj",
                   module=SOURCE, source_config=dict(CONFIG, hidden_size=32))
        self.fails("parameter 'down_proj' of module 'layers.0.mlp' has shape [4, 32, 64], "
                   "which contradicts moe_intermediate_size=64", "SHAPE", "down_proj",
                   module=SOURCE, source_config=dict(CONFIG, moe_intermediate_size=64))
        self.fails("config field 'num_experts' must be int", "CONFIG", "num_experts",
                   module=SOURCE, source_config=dict(CONFIG, num_experts=4.0))

    def test_init_field_must_be_a_number(self):
        for bad in ("0.02", True):
            with self.subTest(value=bad):
                self.fails("config field 'initializer_range' must be float", "CONFIG",
                           "initializer_range", module=SOURCE,
                           source_config={"initializer_range": bad})

    def test_limits(self):
        many = {"f%d" % i: i for i in range(257)}
        self.fails("source_config has more than 256 entries", "LIMIT", "source_config",
                   module=SOURCE, source_config=many)
        self.fails("source_config: a key is longer than 256 bytes", "LIMIT", "source_config",
                   module=SOURCE, source_config={"k" * 257: 1})
        # At the limit it builds.
        ok = {"f%d" % i: i for i in range(255)}
        ok["initializer_range"] = 0.02
        with C.build(GE, module=SOURCE, source_config=ok, seed=1) as b:
            self.assertTrue(values(b)["down_proj"].any())


class TestSharing(unittest.TestCase):
    def build(self, sc, **kw):
        b = C.build(GE, module=SOURCE, source_config=sc, seed=21, **kw)
        self.addCleanup(b.release)
        self.addCleanup(b.close)
        return b

    def test_source_config_is_in_the_key(self):
        a = self.build(CONFIG)
        same = self.build(dict(CONFIG))
        self.assertTrue(same.shared)
        self.assertEqual(same.id, a.id)
        # Only the init's field differs: another build, other values.
        other = self.build(dict(CONFIG, initializer_range=0.05))
        self.assertFalse(other.shared)
        self.assertNotEqual(other.id, a.id)
        self.assertGreater(float(values(other)["gate_up_proj"].std()),
                           2 * float(values(a)["gate_up_proj"].std()))
        # Without source_config: zeros, a build of its own.
        zeros = self.build(None)
        self.assertFalse(zeros.shared)
        self.assertNotIn(zeros.id, (a.id, other.id))
        # A field no init takes leaves the fill, and so the build, as it was.
        extra = self.build(dict(CONFIG, vocab_size=9))
        self.assertTrue(extra.shared)
        self.assertEqual(extra.id, a.id)


class TestRestart(unittest.TestCase):
    """The sharing key of a kept replacement comes back with it from the state dir."""

    def test_key_survives_a_restart(self):
        state = U.tmpfs_dir("fd-repl-")
        if state is None:
            self.skipTest("no tmpfs to put a state dir on (/dev/shm, /run)")
        self.addCleanup(shutil.rmtree, state, True)
        tmp = H.short_tmpdir()
        self.addCleanup(shutil.rmtree, tmp, True)
        args = ["--state-dir", state]
        d1 = H.Daemon(registry=REGISTRY, host_devices=2, tmpdir=tmp, extra_args=args)
        d1.start()
        with familyd.Client(d1.socket, timeout=30) as c1:
            b1 = c1.build(GE, module=SOURCE, source_config=CONFIG, seed=5, map_shards=False)
        d1.stop()

        d2 = H.Daemon(registry=REGISTRY, host_devices=2, tmpdir=tmp, extra_args=args)
        d2.start()
        try:
            with familyd.Client(d2.socket, timeout=30) as c2:
                again = c2.build(GE, module=SOURCE, source_config=CONFIG, seed=5,
                                 map_shards=False)
                self.assertTrue(again.shared)
                self.assertEqual(again.id, b1.id)
                other = c2.build(GE, module=SOURCE, seed=5, map_shards=False,
                                 source_config=dict(CONFIG, initializer_range=0.5))
                self.assertFalse(other.shared)
                self.assertNotEqual(other.id, b1.id)
                other.release(force=True)
                again.release(force=True)
        finally:
            d2.stop()
            err = d1.stderr() + d2.stderr()
            self.assertNotIn("runtime error:", err)
            self.assertNotIn("Sanitizer", err)


if __name__ == "__main__":
    unittest.main()
