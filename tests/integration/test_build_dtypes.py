#!/usr/bin/python3
"""Per-parameter dtypes end to end: the registry's `dtype`, BuildRequest.parameter_dtypes.

docs/semantics.md (Build, steps 6 and 7, Layout, Values) and docs/registry.md (Parameters) are
normative. A family with a float32 norm weight, a float16 bias (written with the alias `fp16`)
and matrices in the build's dtype is built, laid out and materialised on several meshes; each
parameter's ParameterLayout.dtype, each slice's byte_length and the bytes themselves are
checked. The bytes are compared with a float32 build of the same seed, converted per parameter
(round to nearest even): every value is a function of the parameter's name, its logical index
and the seed only. The precedence (parameter_dtypes, then the registry, then
materialize.dtype, then float32), the errors, GetFamily and a restart with --state-dir that
keeps the per-parameter layout are checked too.

Daemons (real familyd, grpcio, the shard socket by hand):
  D  the registry below, --host-devices 8, one node
  K  the same registry with --state-dir on a tmpfs (restart case only)
"""

import array
import itertools
import math
import os
import shutil
import struct
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402
import shard_client as SC  # noqa: E402
import test_durability_util as U  # noqa: E402

FAMILY = "dtype_block"
REGISTRY_YAML = """\
name: dtype_block
baseline: itest.dtypes.Block
default_variant: plain
parallel_axis: tp
variants:
  plain:
    constructor: itest.dtypes.Plain
    accepts: [config, module, module_fqn, context]
parameters:
  norm_weight:
    shape: [hidden_size]
    dtype: float32
    init: {normal: {mean: 1, std: 0.25}}
  wq:
    shape: [hidden_size, hidden_size]
    placements: {tp: shard(0)}
    init: {uniform: {low: -1, high: 1}}
  wo:
    shape: [hidden_size, hidden_size]
    placements: {tp: shard(1)}
    init: {normal: {std: 0.5}}
  experts:
    shape: [num_experts, hidden_size, 3]
    placements: {ep: shard(0)}
    init: {uniform: {low: -2, high: 2}}
  bias:
    shape: [hidden_size]
    placements: {tp: shard(0)}
    dtype: fp16
    init: {uniform: {low: -3, high: 3}}
"""
NAMES = ["norm_weight", "wq", "wo", "experts", "bias"]
CONFIG = {"hidden_size": 6, "num_experts": 4}
SHAPES = {"norm_weight": [6], "wq": [6, 6], "wo": [6, 6], "experts": [4, 6, 3], "bias": [6]}
SIZE = {"float32": 4, "bfloat16": 2, "float16": 2}
CODE = {"float32": "I", "bfloat16": "H", "float16": "H"}
ALIGN = 64
SEED = 4242
ALL_F32 = {n: "float32" for n in NAMES}
UNSUPPORTED = "dtype %s of parameter %s is not supported; use float32, bfloat16 or float16"

P = None
D = None
TMP = None
REG = None


def setUpModule():
    global P, D, TMP, REG
    P = H.Protos()
    TMP = H.short_tmpdir("fd-dtypes-")
    REG = os.path.join(TMP, "registry")
    os.makedirs(REG)
    with open(os.path.join(REG, "dtypes.yaml"), "w") as f:
        f.write(REGISTRY_YAML)
    D = H.Daemon(registry=REG, host_devices=8, node_name="itest-dtypes", protos=P)
    D.start()


def tearDownModule():
    try:
        if D is not None:
            D.stop()
            err = D.stderr()
            for marker in ("runtime error:", "Sanitizer"):
                if marker in err:
                    raise AssertionError("familyd stderr has a sanitizer report:\n" + err[-4000:])
    finally:
        if D is not None:
            D.cleanup()
        if TMP:
            shutil.rmtree(TMP, ignore_errors=True)


# float32 -> bfloat16 / float16 bits, round to nearest even (finite values), as test_build.py.
_F32 = struct.Struct("<f")
_U32 = struct.Struct("<I")


def bits_f32(b):
    return _F32.unpack(_U32.pack(b))[0]


def bf16_bits(f32bits):
    b = f32bits
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF


def f16_bits(f32bits):
    return struct.unpack("<H", struct.pack("<e", bits_f32(f32bits)))[0]


CONVERT = {"float32": lambda b: b, "bfloat16": bf16_bits, "float16": f16_bits}


def build_request(mesh_id="", materialize=None, dtypes=None, config=None):
    req = P.cls("familyd.v1.BuildRequest")(family=FAMILY, mesh_id=mesh_id)
    req.config.SetInParent()
    for k, v in (CONFIG if config is None else config).items():
        req.config.fields[k].CopyFrom(P.value(v))
    if materialize is not None:
        req.materialize.enabled = True
        for k, v in materialize.items():
            setattr(req.materialize, k, v)
    for k, v in (dtypes or {}).items():
        req.parameter_dtypes[k] = v
    return req


class Base(unittest.TestCase):
    daemon = None

    @property
    def d(self):
        return self.daemon or D

    def call(self, rpc, request=None, **kw):
        return self.d.client.call(rpc, request, **kw)

    def ok(self, res):
        self.assertEqual(res.code, "OK", "%r" % res)
        return res.reply

    def build(self, **kw):
        return self.call("familyd.v1.FamilyService/Build", build_request(**kw))

    def built(self, **kw):
        b = self.ok(self.build(**kw)).build
        self.addCleanup(self.call, "familyd.v1.FamilyService/ReleaseBuild", build_id=b.build_id)
        return b

    def mesh(self, device):
        m = {"deviceMesh": [{"name": n, "size": str(s)} for n, s in device],
             "ranks": [str(r) for r in range(math.prod(s for _, s in device))]}
        return self.ok(self.call("familyd.v1.MeshService/CreateMesh", {"mesh": m})).mesh_id

    def dtypes(self, b):
        return {p.name: p.dtype for p in b.info.layout.parameters}

    def check_layout(self, b):
        """Each slice's bytes follow its own parameter's dtype; offsets 64-byte aligned and
        packed in parameter order."""
        dt = self.dtypes(b)
        for shard in b.shards:
            end = 0
            for sl in shard.slices:
                n = math.prod(sl.local_shape)
                self.assertEqual(sl.byte_length, n * SIZE[dt[sl.parameter]], sl.parameter)
                if n == 0:
                    self.assertEqual(sl.byte_offset, 0)
                    continue
                self.assertEqual(sl.byte_offset % ALIGN, 0)
                self.assertEqual(sl.byte_offset, -(-end // ALIGN) * ALIGN, sl.parameter)
                end = sl.byte_offset + sl.byte_length
            self.assertEqual(shard.size_bytes, -(-end // ALIGN) * ALIGN)

    def assemble(self, b, socket=None):
        """{name: flat row-major list of raw elements} from every rank's mapped shard, each
        parameter read in its own dtype's element size; replicas must agree."""
        dt = self.dtypes(b)
        full = {n: [None] * math.prod(SHAPES[n]) for n in dt}
        holders = [s for s in b.shards if s.token]
        reply, fds = SC.fetch(socket or b.shard_socket, P, [s.token for s in holders])
        self.assertEqual(reply.code, 0, reply.message)
        for shard, fd in zip(holders, fds):
            mm = SC.map_readonly(fd, shard.size_bytes)
            os.close(fd)
            try:
                for sl in shard.slices:
                    ls, off = list(sl.local_shape), list(sl.global_offset)
                    if math.prod(ls) == 0:
                        continue
                    local = array.array(CODE[dt[sl.parameter]],
                                        mm[sl.byte_offset:sl.byte_offset + sl.byte_length])
                    shape = SHAPES[sl.parameter]
                    strides = [math.prod(shape[i + 1:]) for i in range(len(shape))]
                    for k, idx in enumerate(itertools.product(*[range(x) for x in ls])):
                        g = sum((i + o) * t for i, o, t in zip(idx, off, strides))
                        cur = full[sl.parameter][g]
                        if cur is not None and cur != local[k]:
                            self.fail("replicas of %r disagree" % sl.parameter)
                        full[sl.parameter][g] = local[k]
            finally:
                mm.close()
        for n, v in full.items():
            self.assertNotIn(None, v, "parameter %r not covered" % n)
        return full


class TestRegistry(Base):
    def test_get_family_shows_each_parameter_dtype(self):
        f = self.ok(self.call("familyd.v1.FamilyService/GetFamily", family=FAMILY))
        got = {p.name: p.dtype for p in f.parameters}
        # Canonical names; a parameter that names none shows "" (the Build's).
        self.assertEqual(got, {"norm_weight": "float32", "wq": "", "wo": "", "experts": "",
                               "bias": "float16"})
        listed = self.ok(self.call("familyd.v1.FamilyService/ListFamilies"))
        fam = [x for x in listed.families if x.name == FAMILY][0]
        self.assertEqual({p.name: p.dtype for p in fam.parameters}, got)


class TestPrecedence(Base):
    def test_registry_over_build_dtype(self):
        b = self.built(materialize={"dtype": "bf16"})
        self.assertEqual(self.dtypes(b), {"norm_weight": "float32", "wq": "bfloat16",
                                          "wo": "bfloat16", "experts": "bfloat16",
                                          "bias": "float16"})
        self.check_layout(b)

    def test_build_dtype_over_float32(self):
        # Without a dtype anywhere: float32, except what the registry names.
        b = self.built()
        self.assertEqual(self.dtypes(b), {"norm_weight": "float32", "wq": "float32",
                                          "wo": "float32", "experts": "float32",
                                          "bias": "float16"})
        self.check_layout(b)
        b = self.built(materialize={"dtype": "float16"})
        self.assertEqual(self.dtypes(b)["wq"], "float16")
        self.assertEqual(self.dtypes(b)["norm_weight"], "float32")

    def test_map_over_registry_and_build_dtype(self):
        b = self.built(materialize={"dtype": "bf16"},
                       dtypes={"norm_weight": "bf16", "bias": "f32", "wo": "fp16"})
        self.assertEqual(self.dtypes(b), {"norm_weight": "bfloat16", "wq": "bfloat16",
                                          "wo": "float16", "experts": "bfloat16",
                                          "bias": "float32"})
        self.check_layout(b)
        # Layout-only builds follow the same rule: the layout's byte sizes depend on it.
        b = self.built(dtypes={"wq": "bfloat16"})
        self.assertEqual(self.dtypes(b)["wq"], "bfloat16")
        self.assertEqual(self.dtypes(b)["wo"], "float32")
        self.check_layout(b)
        self.assertEqual([s.token for s in b.shards], [""])


class TestValues(Base):
    """A bfloat16 build with a float32 norm: layout and bytes on two meshes against a float32
    build of the same seed, converted per parameter."""

    @classmethod
    def setUpClass(cls):
        cls.reference = None

    def float32_reference(self):
        if TestValues.reference is None:
            b = self.built(materialize={"seed": SEED, "dtype": "float32"}, dtypes=ALL_F32)
            self.assertEqual(set(self.dtypes(b).values()), {"float32"})
            TestValues.reference = self.assemble(b)
        return TestValues.reference

    def check_on(self, device):
        mesh_id = self.mesh(device)
        b = self.built(mesh_id=mesh_id, materialize={"seed": SEED, "dtype": "bf16"})
        want = {"norm_weight": "float32", "wq": "bfloat16", "wo": "bfloat16",
                "experts": "bfloat16", "bias": "float16"}
        self.assertEqual(self.dtypes(b), want)
        self.assertEqual(len(b.shards), math.prod(s for _, s in device))
        self.assertTrue(all(s.token for s in b.shards))
        self.check_layout(b)
        got = self.assemble(b)
        ref = self.float32_reference()
        for name in NAMES:
            conv = CONVERT[want[name]]
            self.assertEqual(got[name], [conv(x) for x in ref[name]], name)
        return b

    def test_tp2(self):
        b = self.check_on([("tp", 2)])
        # wq rows split 3 + 3: 18 bfloat16 elements; the norm whole: 6 float32.
        s0 = {sl.parameter: sl for sl in b.shards[0].slices}
        self.assertEqual((list(s0["wq"].local_shape), s0["wq"].byte_length), ([3, 6], 36))
        self.assertEqual((list(s0["norm_weight"].local_shape), s0["norm_weight"].byte_length),
                         ([6], 24))
        self.assertEqual(s0["bias"].byte_length, 6)

    def test_ep2(self):
        b = self.check_on([("ep", 2)])
        s1 = {sl.parameter: sl for sl in b.shards[1].slices}
        self.assertEqual(list(s1["experts"].global_offset), [2, 0, 0])
        self.assertEqual(s1["experts"].byte_length, 2 * 6 * 3 * 2)

    def test_dp_by_tp(self):
        self.check_on([("dp", 2), ("tp", 2)])

    def test_values_do_not_depend_on_the_dtype_source(self):
        # The same parameter in the same dtype has the same bits whether the registry, the
        # map or materialize.dtype chose it.
        a = self.assemble(self.built(materialize={"seed": SEED, "dtype": "bf16"}))
        b = self.assemble(self.built(materialize={"seed": SEED},
                                     dtypes={n: "bfloat16" for n in NAMES[1:4]}))
        for name in NAMES:
            self.assertEqual(a[name], b[name], name)


class TestErrors(Base):
    def fails(self, code, reason, message, field, **kw):
        before = self.ok(self.call("familyd.v1.AdminService/GetStatus")).builds
        res = self.build(**kw)
        self.assertEqual((res.code, res.message), (code, message), "%r" % res)
        st, infos = self.d.client.error_details(res)
        self.assertEqual(len(infos), 1)
        self.assertEqual(infos[0].reason, reason)
        self.assertEqual(dict(infos[0].metadata).get("field", ""), field)
        self.assertEqual(self.ok(self.call("familyd.v1.AdminService/GetStatus")).builds, before)

    def test_unknown_parameter(self):
        self.fails("INVALID_ARGUMENT", "DTYPE",
                   "parameter_dtypes names 'nope', which is not a parameter of member 'plain'",
                   "parameter_dtypes", dtypes={"wq": "bf16", "nope": "bf16"},
                   materialize={})
        # Entries are checked in the byte order of their names, whatever the wire order.
        self.fails("INVALID_ARGUMENT", "DTYPE", UNSUPPORTED % ("'x'", "'bias'"),
                   "parameter_dtypes", dtypes={"zz": "bf16", "wq": "y", "bias": "x"})

    def test_bad_values(self):
        for value in ("int8", "", "BF16", "float64"):
            with self.subTest(value=value):
                self.fails("INVALID_ARGUMENT", "DTYPE", UNSUPPORTED % (repr(value), "'wq'"),
                           "parameter_dtypes", dtypes={"wq": value})

    def test_materialize_dtype_is_checked_first(self):
        self.fails("INVALID_ARGUMENT", "DTYPE",
                   "dtype 'f64' is not supported; use float32, bfloat16 or float16",
                   "materialize.dtype", dtypes={"nope": "bf16"}, materialize={"dtype": "f64"})

    def test_limits(self):
        many = {"p%d" % i: "bf16" for i in range(4097)}
        self.fails("INVALID_ARGUMENT", "LIMIT", "parameter_dtypes has more than 4096 entries",
                   "parameter_dtypes", dtypes=many)
        self.fails("INVALID_ARGUMENT", "LIMIT", "parameter_dtypes: a key is longer than 256 bytes",
                   "parameter_dtypes", dtypes={"k" * 257: "bf16"})
        self.fails("INVALID_ARGUMENT", "LIMIT", "parameter_dtypes is longer than 32 bytes",
                   "parameter_dtypes", dtypes={"wq": "b" * 33})
        # 4096 entries are allowed: then each must name a parameter, checked in name order.
        many = {"p%d" % i: "bf16" for i in range(4095)}
        many["wq"] = "bf16"
        self.fails("INVALID_ARGUMENT", "DTYPE",
                   "parameter_dtypes names 'p0', which is not a parameter of member 'plain'",
                   "parameter_dtypes", dtypes=many)


class TestRestart(unittest.TestCase):
    """A kept build (--state-dir) comes back with the same per-parameter layout and bytes."""

    def test_kept_build_keeps_its_dtypes(self):
        state = U.tmpfs_dir("fd-dtypes-state-")
        if state is None:
            self.skipTest("no tmpfs to put a state dir on (/dev/shm, /run)")
        self.addCleanup(shutil.rmtree, state, True)
        tmp = H.short_tmpdir()
        self.addCleanup(shutil.rmtree, tmp, True)

        def start():
            d = H.Daemon(registry=REG, host_devices=8, node_name="itest-dtypes", tmpdir=tmp,
                         protos=P, extra_args=["--state-dir", state])
            d.shard_socket = os.path.join(tmp, "shard.sock")
            d.start()
            self.addCleanup(lambda: d.alive() and d.stop())
            return d

        d1 = start()
        mesh_id = U.create_mesh(self, d1.client, {"deviceMesh": [{"name": "tp", "size": "2"}],
                                                        "ranks": ["0", "1"]})
        b = U.ok(self, d1.client.call("familyd.v1.FamilyService/Build", build_request(
            mesh_id=mesh_id, materialize={"seed": 9, "dtype": "bf16"},
            dtypes={"wo": "float16"}))).build
        before = U.read_shards(self, d1, b)
        d1.stop()

        d2 = start()
        got = d2.client.call("familyd.v1.FamilyService/GetBuild", build_id=b.build_id)
        self.assertEqual(got.code, "OK", got)
        g = got.reply
        self.assertEqual({p.name: p.dtype for p in g.info.layout.parameters},
                         {"norm_weight": "float32", "wq": "bfloat16", "wo": "float16",
                          "experts": "bfloat16", "bias": "float16"})
        self.assertEqual(g.info.layout.SerializeToString(deterministic=True),
                         b.info.layout.SerializeToString(deterministic=True))
        self.assertEqual([s.SerializeToString(deterministic=True) for s in g.shards],
                         [s.SerializeToString(deterministic=True) for s in b.shards])
        self.assertEqual(U.read_shards(self, d2, g), before)
        d2.stop()


if __name__ == "__main__":
    unittest.main()
