#!/usr/bin/python3
"""familyd.torch.build_module, build_info, derive_seed, bind_arguments and the model walk of
familyd.torch.validate, on a real familyd and real torch (Debian's 1.13, CPU).

One daemon (--host-devices 4, a short --build-grace-ms) serves the test's own registry
(torch_registry/: families whose constructors are classes of torch_members.py, each bad one
wrong in one way) together with the example registry (deploy/registry: the members its
selectors choose). Bad input gives a Python error naming the module (its fqn) and, where one
is at fault, the parameter; the daemon keeps answering and the failed build is released (no
reference of this process, gone after the grace period). Provenance, replacement, seeds,
zero-copy and copy-on-write (a second process, torch_build_worker.py, maps the same build),
argument binding, the model walk, and the order of process groups.
"""

import ctypes
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
SOURCE_ROOT = os.environ.get("FAMILYD_SOURCE_ROOT") or os.path.dirname(os.path.dirname(HERE))
PACKAGE = os.path.join(SOURCE_ROOT, "client", "python")
sys.path.insert(0, PACKAGE)
SKIP = 77

try:
    import torch
except ImportError:  # pragma: no cover - depends on the machine
    sys.stderr.write("test_torch_build: torch missing (apt-get install python3-torch)\n")
    sys.exit(1 if os.environ.get("CI") else SKIP)

import familyd  # noqa: E402
import familyd.torch as FT  # noqa: E402
import familyd_harness as H  # noqa: E402
import torch_members as TM  # noqa: E402
from familyd.torch import build as B  # noqa: E402
from familyd.torch import distributed as D  # noqa: E402
from familyd.torch import validate as V  # noqa: E402
from familyd.torch.modules import ParallelContext  # noqa: E402

GRACE_MS = 1000
WORKER_TIMEOUT = 60
CFG = {"hidden_size": 4, "out_size": 6, "initializer_range": 0.02}
ATTENTION = {"hidden_size": 8, "num_attention_heads": 2, "num_key_value_heads": 1,
             "head_dim": 4, "initializer_range": 0.02}
EXPERTS = {"hidden_size": 8, "num_experts": 2, "moe_intermediate_size": 4,
           "initializer_range": 0.02}
MLP = {"hidden_size": 8, "intermediate_size": 6, "initializer_range": 0.02}

daemon = None
client = None


def setUpModule():
    global daemon, client
    registry = H.short_tmpdir(prefix="fd-torch-reg-")
    for folder in (os.path.join(HERE, "torch_registry"),
                   os.path.join(SOURCE_ROOT, "deploy", "registry")):
        for name in sorted(os.listdir(folder)):
            if name.endswith(".yaml"):
                shutil.copy(os.path.join(folder, name), registry)
    daemon = H.Daemon(registry=registry, host_devices=4, node_name="itest-torch-build",
                      extra_args=["--build-grace-ms", str(GRACE_MS)])
    daemon.registry_copy = registry
    try:
        daemon.start()
    except BaseException:
        shutil.rmtree(registry, ignore_errors=True)
        raise
    client = familyd.Client(daemon.socket, protos=familyd.Protos(H.descriptor_set_path()))


def tearDownModule():
    try:
        if client is not None:
            client.close()
        daemon.stop_checked()
    finally:
        daemon.cleanup()
        shutil.rmtree(daemon.registry_copy, ignore_errors=True)


def status():
    return client.call("familyd.v1.AdminService/GetStatus",
                       client.protos.cls("familyd.v1.GetStatusRequest")())


def builds_of(family):
    return [b for b in client.list_builds() if b.info.resolved.family == family]


def where(family, fqn):
    return "familyd.torch.build_module(%r, fqn=%r)" % (family, fqn)


class Base(unittest.TestCase):
    def build(self, family, config=None, **kw):
        """build_module, its build released when the test ends."""
        m = FT.build_module(client, family, config, **kw)
        self.addCleanup(FT.release, m)
        return m


class TestBadInput(Base):
    """Each a clear error naming the module; the daemon untouched, the build released."""

    def fails(self, family, exc, message, config=CFG, fqn="layers.0.bad", **kw):
        """build_module raises exc with exactly `message` after the module's location; the
        build was made (one fill), this process holds no reference, it goes after grace."""
        fills = status().fills_started
        with self.assertRaises(exc) as cm:
            FT.build_module(client, family, config, fqn=fqn, **kw)
        self.assertEqual(str(cm.exception), where(family, fqn) + ": " + message)
        self.assertEqual(status().fills_started, fills + 1)
        self.assert_released(family)
        return cm.exception

    def assert_released(self, family):
        self.assertIn(family, [f.name for f in client.list_families()])   # still answers
        for b in builds_of(family):                                     # held by no one
            self.assertEqual([r.pid for r in b.references], [], b.build_id)
            self.assertGreater(b.grace_deadline_unix_ms, 0)
        deadline = time.monotonic() + GRACE_MS / 1000 + 10
        while builds_of(family) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.assertEqual(builds_of(family), [], "the failed build outlived its grace period")

    def test_constructor_module_missing(self):
        self.fails("tb_no_module", FT.ModuleBuildError,
                   "member 'missing' (torch_members_nowhere.Linear): cannot import the member's "
                   "constructor 'torch_members_nowhere.Linear': No module named "
                   "'torch_members_nowhere' (register a class with familyd.torch.register("
                   "'torch_members_nowhere.Linear', cls))")

    def test_constructor_class_missing(self):
        self.fails("tb_no_class", FT.ModuleBuildError,
                   "member 'missing_class' (torch_members.NoSuchClass): cannot import the "
                   "member's constructor 'torch_members.NoSuchClass': module 'torch_members' "
                   "has no attribute 'NoSuchClass' (register a class with "
                   "familyd.torch.register('torch_members.NoSuchClass', cls))")

    def test_constructor_does_not_accept_config(self):
        # docs/semantics.md, Build step 5: member '<variant>' must explicitly accept <origin>
        self.fails("tb_no_config", TypeError,
                   "member 'no_config' (torch_members.NoConfig): member 'no_config' must "
                   "explicitly accept config")

    def test_constructor_does_not_accept_an_argument(self):
        # The registry says it accepts scale; the signature does not.
        self.fails("tb_no_argument", TypeError,
                   "member 'no_argument' (torch_members.NoScale): member 'no_argument' does not "
                   "accept ['scale']", scale=2.0)

    def test_constructor_returns_no_module(self):
        self.fails("tb_not_module", TypeError,
                   "member 'not_module' (torch_members.not_a_module): a family constructor "
                   "must return nn.Module (member 'not_module' returned dict)")

    def test_shard_shape_disagrees(self):
        self.fails("tb_wrong_shape", FT.ModuleBuildError,
                   "member 'wrong_shape' (torch_members.WrongShape): parameter 'weight': the "
                   "module's shape [4, 6] is not the shard's local shape [6, 4]",
                   fqn="layers.3.proj")

    def test_dtype_disagrees(self):
        self.fails("tb_float32_only", FT.ModuleBuildError,
                   "member 'float32_only' (torch_members.Float32Only): parameter 'weight': the "
                   "module's dtype torch.float32 is not the layout's float16", dtype="float16")

    def test_module_parameter_not_in_layout(self):
        self.fails("tb_extra", FT.ModuleBuildError,
                   "member 'extra' (torch_members.ExtraParameter): parameter 'inner.bias' of the "
                   "constructed module is not in the build's layout (weight)")

    def test_layout_parameter_not_in_module(self):
        self.fails("tb_no_parameter", FT.ModuleBuildError,
                   "member 'no_parameter' (torch_members.NoParameters): the build's parameter "
                   "'weight' is not a parameter of the constructed NoParameters")

    def test_daemon_refuses_the_binding(self):
        """The registry's accepts refused by the daemon (docs/semantics.md, Build step 5): a
        FamilydError with the documented text, and no build made."""
        fills = status().fills_started
        for kw, text, field in (({"scale": 2.0}, "member 'narrow' does not accept ['scale']",
                                 "arguments"),
                                ({"module": TM.Source(dict(CFG))},
                                 "member 'narrow' must explicitly accept module", "module")):
            with self.subTest(text=text):
                config = None if "module" in kw else CFG
                with self.assertRaises(familyd.FamilydError) as cm:
                    FT.build_module(client, "tb_binding", config, fqn="layers.0.narrow", **kw)
                e = cm.exception
                self.assertEqual((e.code.name, e.reason, e.message),
                                 ("INVALID_ARGUMENT", "BINDING", text))
                self.assertEqual(e.metadata.get("field"), field)
        self.assertEqual(builds_of("tb_binding"), [])
        self.assertEqual(status().fills_started, fills)

    def test_untouched_after_all(self):
        # After a failure the same process builds a good module on the same daemon.
        with self.assertRaises(FT.ModuleBuildError):
            FT.build_module(client, "tb_wrong_shape", CFG, fqn="x")
        m = self.build("tb_linear", CFG, fqn="after.bad")
        self.assertEqual(tuple(m.weight.shape), (6, 4))

    def test_flash_mxfp8_fused_and_ring_members(self):
        """The selectors' members (deploy/registry) build: flash, mxfp8 and fused on no mesh,
        ring on a mesh with cp=2 (this process its rank 0; the cp group is forward's need, not
        the constructor's), each with the registry's parameters, filled (normal init), and
        the first three compute. Their maths: test_torch_members.py."""
        cases = [("attention", ATTENTION, {"use_flash": True}, "FlashGQAAttention",
                  {"wq": (8, 8), "wk": (4, 8), "wv": (4, 8), "wo": (8, 8)}, (3, 8)),
                 ("grouped_experts", EXPERTS, {"use_mxfp8": True}, "MXFP8GroupedSwiGLU",
                  {"gate_up_proj": (2, 8, 8), "down_proj": (2, 4, 8)}, None),
                 ("mlp", MLP, {"use_fused_swiglu": True}, "FusedSwiGLUMLP",
                  {"gate_proj": (6, 8), "up_proj": (6, 8), "down_proj": (8, 6)}, (3, 8))]
        for family, config, selectors, member, shapes, x in cases:
            with self.subTest(member=member):
                m = self.build(family, config, fqn="layers.0.x", **selectors)
                self.assertEqual(type(m).__name__, member)
                self.assertEqual({n: tuple(p.shape) for n, p in m.named_parameters()}, shapes)
                for n, p in m.named_parameters():
                    self.assertGreater(float(p.detach().abs().sum()), 0.0, n)
                if x is not None:
                    self.assertEqual(tuple(m(torch.randn(*x)).shape), x)
                else:
                    y = m(torch.randn(3, 8), torch.tensor([[0], [1], [1]]), torch.ones(3, 1))
                    self.assertEqual(tuple(y.shape), (3, 8))
        mesh = client.create_mesh({"cp": 2}, ranks=[0, 1])
        job = D.Job(rank=0, world_size=2, local_rank=0, local_world_size=2, familyd_rank=0,
                    familyd_ranks=[0, 1])
        jm = D.JobMesh(job=job, mesh=mesh, groups={}, context=ParallelContext(cp_size=2))
        m = self.build("attention", ATTENTION, mesh=jm, fqn="layers.0.attn")
        self.assertEqual((type(m).__name__, m.cp_size), ("RingGQAAttention", 2))
        self.assertEqual([n for n, _ in m.named_parameters()], ["wq", "wk", "wv", "wo"])

    def test_refused_arguments(self):
        for kw, exc, text in (({"module": TM.Source(CFG)}, ValueError,
                               "provide exactly one of config or module"),
                              ({"mesh": "mesh-1"}, TypeError, "mesh must be a "
                               "familyd.torch.JobMesh"),
                              ({"seed": -1}, ValueError, "seed must be an integer")):
            with self.subTest(text=text), self.assertRaisesRegex(exc, text):
                FT.build_module(client, "tb_linear", CFG, fqn="refused", **kw)
        self.assertEqual(builds_of("tb_linear"), [])


class TestProvenance(Base):
    def test_build_info(self):
        fqn = "layers.0.proj"
        m = self.build("tb_linear", CFG, fqn=fqn, seed=11, scale=2.0)
        info = FT.build_info(m)
        self.assertIsInstance(info, FT.BuildInfo)
        self.assertEqual(info.request.DESCRIPTOR.full_name, "familyd.v1.BuildRequest")
        self.assertEqual(info.request.family, "tb_linear")
        self.assertEqual(info.request.module_fqn, fqn)
        self.assertEqual(info.request.materialize.seed, FT.derive_seed(11, fqn))
        self.assertEqual(list(info.request.materialize.ranks), [0])
        self.assertEqual((info.member.variant, info.member.constructor),
                         ("good", "torch_members.GoodLinear"))
        # A snapshot: equal, and not the caller's object (a later change does not reach it).
        self.assertEqual(info.config, CFG)
        self.assertIsNot(info.config, CFG)
        self.assertEqual(info.origin, "direct")
        self.assertEqual([(p.name, list(p.shape)) for p in info.layout.parameters],
                         [("weight", [6, 4]), ("bias", [6])])
        got = client.get_build(info.build_id)
        self.assertEqual(got.build_id, info.build_id)
        self.assertEqual(got.info.layout, info.layout)
        self.assertIn(os.getpid(), [r.pid for r in got.references])
        self.assertEqual((info.fqn, info.seed, info.mesh_id, info.rank),
                         (fqn, FT.derive_seed(11, fqn), "", 0))
        self.assertEqual(info.local_shapes, {"weight": (6, 4), "bias": (6,)})
        # the runtime names and the argument reached the constructor
        self.assertEqual((m.module_fqn, m.scale, m.config), (fqn, 2.0, CFG))
        x = torch.ones(2, 4)
        self.assertTrue(torch.allclose(m(x), (x @ m.weight.t() + m.bias) * 2.0))
        # not familyd's: None, also for a container holding a built module
        self.assertIsNone(FT.build_info(torch.nn.Linear(2, 2)))
        self.assertIsNone(FT.build_info(TM.Block(m, torch.nn.Identity())))
        self.assertIsNone(FT.build_info(object()))

    def test_release(self):
        a = FT.build_module(client, "tb_linear", CFG, fqn="rel.a", seed=1)
        b = FT.build_module(client, "tb_linear", CFG, fqn="rel.b", seed=1)
        model = torch.nn.Module()
        model.a, model.b, model.alias = a, b, a
        before = a.weight.detach().clone()
        ids = [FT.build_info(m).build_id for m in (a, b)]
        self.assertEqual(FT.release(model), ids)           # each build once
        for build_id in ids:
            self.assertEqual([r.pid for r in client.get_build(build_id).references], [])
        self.assertTrue(torch.equal(a.weight, before))      # the parameters stay valid
        self.assertEqual(FT.release(model), ids)            # again: nothing more to drop

    def test_replacement(self):
        fqn = "layers.1.proj"
        source = TM.Source(dict(CFG))
        r = self.build("tb_linear", module=source, fqn=fqn, seed=3)
        info = FT.build_info(r)
        self.assertEqual(info.origin, "replacement")
        self.assertEqual(info.config, source.config)        # taken from the existing module
        self.assertIsNot(info.config, source.config)        # as a snapshot
        self.assertIs(r.config, source.config)
        self.assertEqual(info.request.module.fqn, fqn)
        self.assertEqual([(p.name, list(p.shape)) for p in info.request.module.parameters],
                         [("weight", [6, 4]), ("bias", [6])])
        direct = self.build("tb_linear", dict(CFG), fqn=fqn, seed=3)
        # bias (init uniform(-0.5, 0.5), numbers only): the registry's init, the same as a
        # direct build's with the same fqn and seed, not the source's 5.0
        self.assertTrue(torch.equal(r.bias, direct.bias))
        self.assertFalse(torch.any(r.bias == 5.0))
        self.assertFalse(torch.any(r.weight == 5.0))
        other = self.build("tb_linear", dict(CFG), fqn=fqn, seed=4)
        self.assertFalse(torch.equal(r.bias, other.bias))
        # a replacement of a familyd-built module takes the config familyd built it from
        again = self.build("tb_linear", module=direct, fqn=fqn, seed=3)
        self.assertEqual(FT.build_info(again).config, direct.config)

    def test_replacement_init_from_config_fields(self):
        """A replacement's weights are the registry's init also where the init names a config
        field (weight: normal(std=initializer_range)): build_module sends the config it takes
        from the existing module as BuildRequest.source_config (without it the daemon fills
        such a parameter with zeros), so they equal the direct build's, not zeros."""
        fqn = "layers.2.proj"
        r = self.build("tb_linear", module=TM.Source(dict(CFG)), fqn=fqn, seed=3)
        direct = self.build("tb_linear", dict(CFG), fqn=fqn, seed=3)
        self.assertTrue(torch.equal(r.weight, direct.weight), r.weight)
        self.assertGreater(float(r.weight.abs().sum()), 0.0)

    def test_buffers_are_materialised(self):
        """A member's buffers, made on meta with it, are on the parameters' device with the
        values the member computes; its parameters are the build's."""
        m = FT.build_module(client, "tb_buffers", dict(CFG), fqn="b.0")
        self.addCleanup(FT.release, m)
        hidden = CFG["hidden_size"]
        self.assertFalse(any(b.is_meta for b in m.buffers()))
        self.assertEqual(m.scale.device, m.weight.device)
        self.assertTrue(torch.equal(m.scale, torch.arange(hidden) * 0.5))
        self.assertTrue(torch.equal(m.inner.table, torch.arange(hidden) ** 2))
        self.assertTrue(torch.equal(m.weight.detach(), torch.ones(hidden)))

    def test_replacement_copy_weights(self):
        """copy_weights=True: the source's values, not the registry's init."""
        source = TM.Source(dict(CFG))
        with torch.no_grad():
            source.weight.copy_(torch.arange(24.0).reshape(6, 4))
            source.bias.fill_(5.0)
        r = FT.build_module(client, "tb_linear", module=source, fqn="l.0", copy_weights=True)
        self.addCleanup(FT.release, r)
        self.assertTrue(torch.equal(r.weight.detach(), source.weight.detach()))
        self.assertTrue(torch.equal(r.bias.detach(), source.bias.detach()))


class TestSeeds(Base):
    def test_derive_seed(self):
        def blake(seed, fqn):       # the documented definition, written here independently
            d = hashlib.blake2b(str(seed).encode() + b"\0" + fqn.encode(), digest_size=8)
            return int.from_bytes(d.digest(), "little")

        for seed, fqn in ((0, ""), (7, "layers.0.mlp"), (2 ** 64 - 1, "héad")):
            self.assertEqual(FT.derive_seed(seed, fqn), blake(seed, fqn))
            self.assertEqual(FT.derive_seed(seed, fqn), FT.derive_seed(seed, fqn))
            self.assertTrue(0 <= FT.derive_seed(seed, fqn) < 2 ** 64)
        seeds = {FT.derive_seed(s, f) for s in (0, 1, 2) for f in ("a", "b", "layers.0",
                                                                   "layers.1")}
        self.assertEqual(len(seeds), 12)          # differs per fqn and per seed
        for bad in (-1, 2 ** 64, True, "1", 1.0):
            with self.subTest(seed=bad), self.assertRaisesRegex(ValueError, "seed must be"):
                FT.derive_seed(bad, "a")

    def test_identical_blocks_get_their_own_builds(self):
        fills = status().fills_started
        a = self.build("tb_linear", CFG, fqn="layers.0.mlp", seed=1, trainable=False)
        b = self.build("tb_linear", CFG, fqn="layers.1.mlp", seed=1, trainable=False)
        ia, ib = FT.build_info(a), FT.build_info(b)
        self.assertNotEqual(ia.build_id, ib.build_id)
        self.assertNotEqual(ia.seed, ib.seed)
        self.assertFalse(torch.equal(a.weight, b.weight))
        self.assertFalse(torch.equal(a.bias, b.bias))
        # the same fqn and seed again: the live build answers, the same weights, no new fill
        again = self.build("tb_linear", CFG, fqn="layers.0.mlp", seed=1, trainable=False)
        self.assertEqual(FT.build_info(again).build_id, ia.build_id)
        self.assertTrue(FT.build_info(again).build.shared)
        self.assertFalse(ia.build.shared)
        self.assertTrue(torch.equal(again.weight, a.weight))
        self.assertEqual(status().fills_started, fills + 2)

    def test_trainable_builds_are_each_process_own(self):
        # a training handout per build_module call: never shared, the same seeded values
        fills = status().fills_started
        a = self.build("tb_linear", CFG, fqn="layers.0.mlp", seed=1)
        again = self.build("tb_linear", CFG, fqn="layers.0.mlp", seed=1)
        ia, ig = FT.build_info(a), FT.build_info(again)
        self.assertNotEqual(ia.build_id, ig.build_id)
        self.assertFalse(ig.build.shared)
        self.assertTrue(ia.trainable)
        self.assertTrue(torch.equal(again.weight, a.weight))
        self.assertTrue(all(p.requires_grad for p in a.parameters()))
        b = client.get_build(ia.build_id)
        self.assertEqual((b.writable, b.private_build), (True, True))
        self.assertEqual(status().fills_started, fills + 2)
        frozen = self.build("tb_linear", CFG, fqn="layers.0.mlp", seed=1, trainable=False)
        self.assertFalse(any(p.requires_grad for p in frozen.parameters()))
        self.assertTrue(torch.equal(frozen.weight, a.weight))

    def test_two_processes_share_one_build(self):
        fills = status().fills_started
        m = self.build("tb_linear", CFG, fqn="shared.proj", seed=9, trainable=False)
        info = FT.build_info(m)
        w = Worker(self)
        got = w.ask(op="build", family="tb_linear", config=CFG, fqn="shared.proj", seed=9,
                    trainable=False)
        self.assertEqual(got["build_id"], info.build_id)
        self.assertTrue(got["shared"])
        self.assertEqual(got["params"], params(m))
        self.assertEqual(status().fills_started, fills + 1)
        holders = sorted(r.pid for r in client.get_build(info.build_id).references)
        self.assertEqual(holders, sorted([os.getpid(), got["pid"]]))
        w.ask(op="exit")
        self.assertEqual([r.pid for r in client.get_build(info.build_id).references],
                         [os.getpid()])


def params(module):
    return {name: p.detach().reshape(-1).tolist() for name, p in module.named_parameters()}


class Worker:
    """torch_build_worker.py in its own process, answering one JSON line per command."""

    def __init__(self, test):
        env = dict(os.environ, PYTHONPATH=PACKAGE, FAMILYD_DESCRIPTORS=H.descriptor_set_path(),
                   OMP_NUM_THREADS="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-X", "faulthandler", os.path.join(HERE, "torch_build_worker.py"),
             daemon.socket], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
        test.addCleanup(self.close)

    def ask(self, **cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError("the worker died (status %s)" % self.proc.wait(WORKER_TIMEOUT))
        return json.loads(line)

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(WORKER_TIMEOUT)
        self.proc.stdin.close()
        self.proc.stdout.close()


class TestZeroCopy(Base):
    def test_parameters_are_the_shard_mapping(self):
        for trainable, mode in ((True, "shared"), (False, "private")):
            self.check_mapping(trainable, mode)

    def check_mapping(self, trainable, mode):
        m = self.build("tb_linear", CFG, fqn="zero.copy", seed=2, trainable=trainable)
        info = FT.build_info(m)
        rank = info.build.ranks[0]
        buf = (ctypes.c_char * rank.size).from_buffer(rank.mmap)
        try:
            base = ctypes.addressof(buf)
        finally:
            del buf
        offsets = {s.parameter: s.byte_offset for s in rank.slices}
        for name, p in m.named_parameters():
            self.assertIsInstance(p, torch.nn.Parameter)
            self.assertEqual(p.data_ptr(), base + offsets[name], name)     # no copy
            self.assertLessEqual(p.data_ptr() + p.numel() * p.element_size(), base + rank.size)
        self.assertEqual(rank.mode, mode)

    def test_writes_stay_in_the_writing_process(self):
        # frozen modules' shared build, mapped copy-on-write, trained here all the same
        m = self.build("tb_linear", CFG, fqn="cow.proj", seed=5, trainable=False)
        for p in m.parameters():
            p.requires_grad_(True)
        before = params(m)
        w = Worker(self)
        self.assertEqual(w.ask(op="build", family="tb_linear", config=CFG, fqn="cow.proj",
                               seed=5, trainable=False)["params"], before)
        stepped = w.ask(op="step")["params"]          # the other process's optimizer step
        self.assertNotEqual(stepped, before)
        self.assertEqual(params(m), before)
        fresh = client.open_build(FT.build_info(m).build_id, mode="private")
        self.addCleanup(fresh.close)
        self.assertEqual({k: v.reshape(-1).tolist() for k, v in fresh.torch(0).items()}, before)
        # this process's in-place step: the other still sees its own weights
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        m(torch.full((3, 4), 2.0)).sum().backward()
        opt.step()
        self.assertNotEqual(params(m), before)
        self.assertEqual(w.ask(op="read")["params"], stepped)
        self.assertEqual({k: v.reshape(-1).tolist() for k, v in fresh.torch(0).items()}, before)

    def test_reset_parameters_is_never_called(self):
        TM.RESET_CALLS.clear()
        m = self.build("tb_resets", {"hidden_size": 64, "initializer_range": 0.02}, fqn="norm")
        self.assertEqual(TM.RESET_CALLS, ["meta"])      # its own call on meta, none after
        self.assertFalse(torch.any(m.weight == TM.RESET_VALUE))
        self.assertTrue(torch.all((m.weight > 2.5) & (m.weight < 3.5)))    # the fill, mean 3


class TestRegister(Base):
    PATH = "torch_build_registered.Overridden"

    def test_register_overrides_the_path(self):
        self.addCleanup(FT.register, self.PATH, None)
        with self.assertRaisesRegex(FT.ModuleBuildError, "cannot import the member's constructor "
                                    "'torch_build_registered.Overridden'"):
            FT.build_module(client, "tb_registered", CFG, fqn="r")
        FT.register(self.PATH, TM.Float32Only)
        m = self.build("tb_registered", CFG, fqn="r")
        self.assertIs(type(m), TM.Float32Only)
        FT.register(self.PATH, None)
        with self.assertRaises(FT.ModuleBuildError):
            FT.build_module(client, "tb_registered", CFG, fqn="r")

    def test_register_refuses(self):
        with self.assertRaisesRegex(ValueError, "path must be a non-empty dotted path"):
            FT.register("", TM.GoodLinear)
        with self.assertRaisesRegex(TypeError, "3 is not callable"):
            FT.register("a.b", 3)


class TestBindArguments(unittest.TestCase):
    """bind_arguments alone: a real familyd.v1.ResolvedFamily, real constructors."""

    def setUp(self):
        self.member = client.protos.cls("familyd.v1.ResolvedFamily")(
            family="f", variant="v", constructor="m.C")
        self.ctx = ParallelContext(tp_size=2)
        self.runtime = {"config": CFG, "module": None, "module_fqn": "a.b", "context": self.ctx}

    def bind(self, ctor, accepts, arguments=None, replacement=False, runtime=None):
        return B.bind_arguments(self.member, ctor, accepts, arguments or {},
                                runtime or self.runtime, replacement)

    def test_runtime_names_filtered(self):
        def ctor(config, module_fqn="", *, device=None):
            pass

        # module: not in the signature; context: neither; device: meta
        self.assertEqual(self.bind(ctor, ["config", "module", "module_fqn", "context"]),
                         {"config": CFG, "module_fqn": "a.b", "device": torch.device("meta")})
        # module_fqn in the signature but not in accepts: not passed
        self.assertEqual(self.bind(ctor, ["config"]),
                         {"config": CFG, "device": torch.device("meta")})

    def test_context_and_arguments(self):
        def ctor(config, context=None, scale=1.0):
            pass

        got = self.bind(ctor, ["config", "context", "scale"], {"scale": 0.5})
        self.assertEqual(got, {"config": CFG, "context": self.ctx, "scale": 0.5})
        self.assertNotIn("device", got)                 # no device in the signature

    def test_device_meta_only_when_taken(self):
        self.assertEqual(self.bind(TM.GoodLinear, ["config"])["device"], torch.device("meta"))
        self.assertEqual(self.bind(TM.not_a_module, ["config"])["device"], torch.device("meta"))

        def nodevice(config):
            pass

        self.assertEqual(self.bind(nodevice, ["config"]), {"config": CFG})

    def test_replacement_takes_module(self):
        src = TM.Source(dict(CFG))
        runtime = dict(self.runtime, config=None, module=src)
        got = self.bind(TM.GoodLinear, ["config", "module", "module_fqn"], replacement=True,
                        runtime=runtime)
        self.assertIs(got["module"], src)
        self.assertIsNone(got["config"])

    def test_errors(self):
        def noconfig(module=None):
            pass

        def config_only(config):
            pass

        def needs_size(config, size):
            pass

        with self.assertRaisesRegex(TypeError, "^member 'v' must explicitly accept config$"):
            self.bind(noconfig, ["config"])
        with self.assertRaisesRegex(TypeError, "^member 'v' must explicitly accept module$"):
            self.bind(config_only, ["config", "module"], replacement=True)
        with self.assertRaisesRegex(TypeError,
                                    r"^member 'v' does not accept \['alpha', 'zeta'\]$"):
            self.bind(config_only, ["config", "alpha", "zeta"], {"zeta": 1, "alpha": 2})
        with self.assertRaisesRegex(TypeError, "missing a required argument: 'size'"):
            self.bind(needs_size, ["config"])


class TestModelWalk(Base):
    def test_alias_is_one_boundary(self):
        shared = self.build("tb_linear", CFG, fqn="enc.proj", seed=1)
        other = self.build("tb_linear", CFG, fqn="dec.proj", seed=1)
        model = torch.nn.Module()
        model.enc = TM.Block(shared, torch.nn.Identity())
        model.dec = TM.Block(other, torch.nn.Linear(6, 6))
        model.tied = shared                            # the same module, a second name
        got = V.model_boundaries(model)
        self.assertEqual([(b.fqns, b.build_id) for b in got],
                         [(("enc.first", "tied"), FT.build_info(shared).build_id),
                          (("dec.first",), FT.build_info(other).build_id)])
        self.assertIs(got[0].module, shared)
        self.assertEqual(V.model_boundaries(torch.nn.Linear(2, 2)), [])
        self.assertEqual([b.fqns for b in V.model_boundaries(shared)], [("",)])   # the root
        self.assertEqual(V.shared_parameters(got), [])

    def test_parameter_tied_between_builds(self):
        embed = self.build("tb_linear", CFG, fqn="embed", seed=1)
        head = self.build("tb_linear", CFG, fqn="head", seed=1)
        head.weight = embed.weight                     # tied weights across two builds
        model = torch.nn.Module()
        model.embed = embed
        model.layers = TM.Block(torch.nn.Identity(), torch.nn.Identity())
        model.head = head
        ids = FT.build_info(embed).build_id, FT.build_info(head).build_id
        self.assertEqual(V.shared_parameters(V.model_boundaries(model)),
                         [[{"fqn": "embed.weight", "build_id": ids[0], "parameter": "weight"},
                           {"fqn": "head.weight", "build_id": ids[1], "parameter": "weight"}]])

    def test_parameter_tied_within_one_build(self):
        m = self.build("tb_linear", CFG, fqn="one", seed=1)
        model = torch.nn.Module()
        model.block = TM.Block(m, torch.nn.Identity())
        m.alias = m.weight                             # the same build uses it twice
        self.assertEqual(V.shared_parameters(V.model_boundaries(model)), [])

    def test_applied_layout_follows_a_cast(self):
        m = self.build("tb_linear", CFG, fqn="cast.me", seed=1)
        info = FT.build_info(m)
        layout = V.applied_layout(m)
        self.assertEqual(layout, {"meshId": "", "parameters": [
            {"name": "weight", "placements": [{"axis": "tp", "kind": "shard", "dim": "0"}],
             "shape": ["6", "4"], "dtype": "float32"},
            {"name": "bias", "placements": [{"axis": "tp", "kind": "shard", "dim": "0"}],
             "shape": ["6"], "dtype": "float32"}]})
        boundary = {"fqns": ["cast.me"], "build_id": info.build_id}
        self.assertTrue(client.validate([dict(boundary, applied_layout=layout)]).ok)
        m.half()
        cast = V.applied_layout(m)
        self.assertEqual([p["dtype"] for p in cast["parameters"]], ["float16", "float16"])
        got = client.validate([dict(boundary, applied_layout=cast)])
        self.assertFalse(got.ok)
        self.assertEqual({v.reason for v in got.violations}, {"LAYOUT_CONFLICT"})
        with self.assertRaisesRegex(ValueError, "was not built by familyd"):
            V.applied_layout(torch.nn.Linear(2, 2))


class TestValidateModel(Base):
    """validate_model on the live model (needs Validate's shared_parameters)."""

    def test_fits_then_cast_conflicts(self):
        m = self.build("tb_linear", CFG, fqn="v.proj", seed=1)
        model = TM.Block(m, torch.nn.Identity())
        self.assertEqual(FT.validate_model(client, model), [])
        m.half()
        got = FT.validate_model(client, model)
        self.assertEqual([(v.reason, list(v.fqns)) for v in got],
                         [("LAYOUT_CONFLICT", ["first"])])
        with self.assertRaises(FT.ModelValidationError) as cm:
            FT.validate_model(client, model, raise_errors=True)
        self.assertEqual(cm.exception.violations[0].reason, "LAYOUT_CONFLICT")

    def test_tied_across_builds_with_different_shapes(self):
        # The same local shape [4, 4], different logical shapes: out_size 4 whole, and
        # out_size 8 split over tp=2 (this process its rank 0).
        mesh = client.create_mesh({"tp": 2}, ranks=[0, 1])
        job = D.Job(rank=0, world_size=2, local_rank=0, local_world_size=2, familyd_rank=0,
                    familyd_ranks=[0, 1])
        jm = D.JobMesh(job=job, mesh=mesh, groups={},
                       context=ParallelContext(tp_size=2, ranks={"tp": 0}))
        small = self.build("tb_linear", dict(CFG, out_size=4), fqn="a", seed=1)
        big = self.build("tb_linear", dict(CFG, out_size=8), mesh=jm, fqn="b", seed=1)
        self.assertEqual(tuple(big.weight.shape), (4, 4))
        model = torch.nn.Module()
        model.a = small
        model.b = big
        self.assertEqual(FT.validate_model(client, model), [])
        big.weight = small.weight
        got = FT.validate_model(client, model)
        self.assertEqual([v.reason for v in got], ["SHARED_PARAMETER_CONFLICT"])
        self.assertRegex(got[0].message, "^shared parameter 'b.weight' has shape ")


class TestActivationLayouts(Base):
    """Activation layouts (docs/torch.md, validate_model): the family's declared one comes with
    its build; one the trainer applies otherwise is ACTIVATION_LAYOUT_CONFLICT per field (the
    daemon's Validate); neighbours whose out_dst and in_src disagree are
    ACTIVATION_NEIGHBOUR_MISMATCH (validate_model's own)."""

    def model(self, *families):
        model = torch.nn.Module()
        for i, family in enumerate(families):
            setattr(model, "c%d" % i, self.build(family, CFG, fqn="c%d" % i, seed=1))
        return model

    def test_declared_layout_comes_with_the_build(self):
        m = self.build("tb_row", CFG, fqn="r", seed=1)
        got = FT.activation_layout(m)
        self.assertEqual(got["outNames"], ["hidden"])
        self.assertTrue(got["isBoundary"])
        self.assertEqual(got["outSrc"], [{"placements": [{"axis": "tp", "kind": "partial"}]}])
        self.assertIsNone(FT.activation_layout(self.build("tb_linear", CFG, fqn="l", seed=1)))
        # nothing applied: nothing sent
        self.assertNotIn("activations", V.applied_layout(m))

    def test_neighbours(self):
        # column then row: the split output is what the row-parallel linear takes in
        self.assertEqual(FT.validate_model(client, self.model("tb_col", "tb_row")), [])
        # row then row: a replicated output into a split input
        got = FT.validate_model(client, self.model("tb_row", "tb_row"))
        self.assertEqual([(v.reason, list(v.fqns), v.message) for v in got], [
            ("ACTIVATION_NEIGHBOUR_MISMATCH", ["c0", "c1"],
             "out_dst at 'c0' [{tp: replicate}] disagrees with in_src at 'c1' [{tp: shard(-1)}], "
             "the next component")])
        with self.assertRaises(FT.ModelValidationError):
            FT.validate_model(client, self.model("tb_row", "tb_col", "tb_col"), raise_errors=True)
        # a family that declares none has no neighbours to compare
        self.assertEqual(FT.validate_model(client, self.model("tb_row", "tb_linear", "tb_col")), [])

    def test_applied_layout_that_differs(self):
        model = self.model("tb_col", "tb_row")
        row = model.c1
        applied = FT.activation_layout(row)
        applied["inSrc"] = [{"placements": [{"axis": "tp", "kind": "replicate"}]}]
        applied["isBoundary"] = False
        FT.set_activation_layout(row, applied)
        got = FT.validate_model(client, model)
        self.assertEqual([(v.reason, list(v.fqns), v.message) for v in got], [
            ("ACTIVATION_LAYOUT_CONFLICT", ["c1"],
             "in_src at 'c1' conflicts with its constructed family layout"),
            ("ACTIVATION_LAYOUT_CONFLICT", ["c1"],
             "is_boundary at 'c1' conflicts with its constructed family layout"),
            ("ACTIVATION_NEIGHBOUR_MISMATCH", ["c0", "c1"],
             "out_dst at 'c0' [{tp: shard(-1)}] disagrees with in_src at 'c1' [{tp: replicate}], "
             "the next component")])
        # the same as built, applied explicitly: nothing
        FT.set_activation_layout(row, FT.build_info(row).layout.activations)
        self.assertEqual(FT.validate_model(client, model), [])
        FT.set_activation_layout(row, None)
        self.assertEqual(FT.validate_model(client, model), [])
        with self.assertRaisesRegex(ValueError, "was not built by familyd"):
            FT.set_activation_layout(torch.nn.Linear(2, 2), {})


class TestProcessGroupOrder(unittest.TestCase):
    """The groups every rank creates, in the order it creates them (pure functions)."""

    def mesh(self, device, expert=()):
        m = client.protos.cls("familyd.v1.Mesh")()
        for name, size in device:
            m.device_mesh.add(name=name, size=size)
        for name, size in expert:
            m.expert_mesh.add(name=name, size=size)
        return m

    def test_axis_groups(self):
        self.assertEqual(D.axis_groups([("dp", 2), ("tp", 2)]),
                         [("dp", [[0, 2], [1, 3]]), ("tp", [[0, 1], [2, 3]])])
        self.assertEqual(D.axis_groups([("tp", 2), ("dp", 2)]),
                         [("tp", [[0, 2], [1, 3]]), ("dp", [[0, 1], [2, 3]])])
        self.assertEqual(D.axis_groups([("dp", 1), ("tp", 3)]),
                         [("dp", [[0], [1], [2]]), ("tp", [[0, 1, 2]])])
        self.assertEqual(D.axis_groups([]), [])

    def test_mesh_groups_with_an_expert_view(self):
        dp_tp = [("dp", 2), ("tp", 2)]
        # edp_shard and ep: new names, after the device axes
        self.assertEqual(D.mesh_groups(self.mesh(dp_tp, [("edp_shard", 2), ("ep", 2)])),
                         [("dp", [[0, 2], [1, 3]]), ("tp", [[0, 1], [2, 3]]),
                          ("edp_shard", [[0, 2], [1, 3]]), ("ep", [[0, 1], [2, 3]])])
        # ep over all four
        self.assertEqual(D.mesh_groups(self.mesh(dp_tp, [("ep", 4)])),
                         [("dp", [[0, 2], [1, 3]]), ("tp", [[0, 1], [2, 3]]),
                          ("ep", [[0, 1, 2, 3]])])
        # an expert axis named like a device axis: the same groups once, others as expert.NAME
        self.assertEqual(D.mesh_groups(self.mesh(dp_tp, [("dp", 2), ("tp", 2)])),
                         [("dp", [[0, 2], [1, 3]]), ("tp", [[0, 1], [2, 3]])])
        self.assertEqual(D.mesh_groups(self.mesh(dp_tp, [("tp", 2), ("ep", 2)])),
                         [("dp", [[0, 2], [1, 3]]), ("tp", [[0, 1], [2, 3]]),
                          ("expert.tp", [[0, 2], [1, 3]]), ("ep", [[0, 1], [2, 3]])])

    def test_the_daemons_mesh(self):
        mesh = client.create_mesh({"dp": 2, "tp": 2}, {"edp_shard": 2, "ep": 2},
                                  ranks=[0, 1, 2, 3])
        self.assertEqual([name for name, _ in D.mesh_groups(mesh)],
                         ["dp", "tp", "edp_shard", "ep"])


if __name__ == "__main__":
    unittest.main()
