#!/usr/bin/python3
"""familyd Build end to end: errors, layout, materialised values, and the shard handout.

docs/semantics.md (Build) is normative for every text and decision; proto/familyd/v1/*.proto for
the messages and the shard socket. Values are checked against an independent Python
implementation of Philox4x32-10 and the formulas of docs/semantics.md (numpy, float32 step by
step); layouts against an independent torch.chunk computation; shards are fetched over the shard
socket (shard_client.py), mapped with mmap and read with numpy, as a trainer would.

Daemons (all with --host-devices 8, one node):
  D     the conformance registry (errors, layout, invariance, handout)
  X     a temporary registry: the conformance families plus test-only families (uniform,
        constant, ones, an exact-division case, a member that does not accept config)
  small the conformance registry with a small --shm-budget and --max-builds (limits)
"""

import array
import fcntl
import math
import mmap
import os
import shutil
import struct
import sys
import itertools
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402
import shard_client as SC  # noqa: E402
from google.protobuf import json_format  # noqa: E402  (present: the harness imported it)

try:
    import torch  # noqa: F401  (used only when present)
except ImportError:
    torch = None

REGISTRY = os.path.join(H.CONFORMANCE, "registry")
NODE = "itest-build"
GE = "grouped_experts"
ATT = "attention"
ALIGN = 64   # layout.h LAYOUT_MIN_ALIGN: the daemon's documented slice alignment
STATUS_NOT_FOUND = 5

# A registry of test-only families, next to a copy of the conformance registry.
EXTRA_YAML = """\
families:
  - name: initcheck
    baseline: itest.InitCheck
    default_variant: plain
    parallel_axis: tp
    variants:
      plain:
        constructor: itest.InitCheckPlain
        accepts: [config, module, module_fqn, context]
    parameters:
      u:
        shape: [rows, 37]
        placements: {tp: shard(1)}
        init: {uniform: {low: -1, high: 1}}
      u2:
        shape: [rows, 5]
        init: {uniform: {low: lo, high: hi}}
      c:
        shape: [rows, 3]
        init: {constant: {value: 1.5}}
      o:
        shape: [7]
        init: ones
      z:
        shape: [2, 2]
      nrm:
        shape: [rows, 16]
        placements: {tp: shard(0)}
        init: {normal: {mean: 0.5, std: 2}}
  - name: divtest
    baseline: itest.DivTest
    default_variant: plain
    variants:
      plain:
        constructor: itest.DivTestPlain
        accepts: [config, module, module_fqn, context]
    parameters:
      wq:
        shape: [hidden_size / num_attention_heads, hidden_size]
  - name: nest
    baseline: itest.Nest
    default_variant: plain
    variants:
      plain:
        constructor: itest.NestPlain
        accepts: [config, context]
    parameters:
      w:
        shape: [n, 3]
        placements: {ep: shard(0), dp: shard(0), tp: shard(-1)}
        init: {uniform: {low: 0, high: 1}}
      v:
        shape: [5]
        init: {constant: {value: -2.5}}
  - name: jobplace
    baseline: itest.JobPlace
    default_variant: plain
    variants:
      plain:
        constructor: itest.JobPlacePlain
        accepts: [config]
      bad:
        constructor: itest.JobPlaceBad
        accepts: [config]
        parameters:
          w:
            shape: [4]
            placements:
              tp: [{when: 'tp_size / (cp_size - 1) > 1', placement: shard(0)}]
    selectors:
      pick: {type: string, default: plain}
    rules:
      - {when: {pick: bad}, variant: bad}
    parameters:
      head:
        shape: [vocab, hidden]
        placements:
          tp:
            - {when: 'loss_parallel', placement: shard(0)}
            - {when: 'tp_size > 1', placement: shard(-1)}
            - {placement: none}
        init: {uniform: {low: 0, high: 1}}
    layout:
      in_src: [{tp: shard(1), dp: replicate}]
      in_dst: [{tp: replicate}]
      out_src: [{tp: partial}]
      out_dst: [{tp: replicate}]
      out_names: [logits]
      boundary: true
  - name: noconfig
    baseline: itest.NoConfig
    default_variant: grouped
    variants:
      grouped:
        constructor: itest.NoConfigGrouped
        accepts: [module, module_fqn, context]
    parameters:
      w1:
        shape: [num_experts, hidden_size, inter]
"""

P = None
D = None
X = None
TMP = None


def setUpModule():
    global P, D, X, TMP
    P = H.Protos()
    TMP = H.short_tmpdir("fd-build-")
    reg = os.path.join(TMP, "registry")
    os.makedirs(reg)
    shutil.copy(os.path.join(REGISTRY, "families.yaml"), os.path.join(reg, "families.yaml"))
    with open(os.path.join(reg, "zz-extra.yaml"), "w") as f:
        f.write(EXTRA_YAML)
    D = H.Daemon(registry=REGISTRY, host_devices=8, node_name=NODE, protos=P,
                 extra_args=["--build-grace-ms", "0"])
    D.start()
    X = H.Daemon(registry=reg, host_devices=8, node_name=NODE, protos=P,
                 extra_args=["--build-grace-ms", "0"])
    try:
        X.start()
    except BaseException:
        D.kill()
        D.cleanup()
        raise


def check_sanitizers(d):
    """UBSan reports without aborting: a daemon's stderr must hold no sanitizer report."""
    err = d.stderr()
    for marker in ("runtime error:", "Sanitizer"):
        if marker in err:
            raise AssertionError("familyd stderr has a sanitizer report:\n%s"
                                 % "\n".join(err.splitlines()[-40:]))


def tearDownModule():
    try:
        for d in (X, D):
            if d is not None:
                d.stop()
                check_sanitizers(d)
    finally:
        for d in (X, D):
            if d is not None:
                d.cleanup()
        if TMP:
            shutil.rmtree(TMP, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Independent reference: Philox4x32-10, FNV-1a, the init formulas, torch.chunk layout.
# Pure Python (Debian's python3-numpy is not a dependency of these tests): float32 arithmetic is
# double arithmetic rounded to float32 after each operation, which is exact for one +, -, * or
# / of float32 operands (53 >= 2 * 24 + 2 bits: double rounding is innocuous).

MASK32 = 0xFFFFFFFF
_F32 = struct.Struct("<f")
_U32 = struct.Struct("<I")


def f32(x):
    """x rounded to float32 (nearest even), as a Python float."""
    return _F32.unpack(_F32.pack(x))[0]


def f32_bits(x):
    return _U32.unpack(_F32.pack(x))[0]


def bits_f32(b):
    return _F32.unpack(_U32.pack(b))[0]


def bf16_bits(x):
    """float32 value -> bfloat16 bits, round to nearest even (finite values)."""
    b = f32_bits(x)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF


def f16_bits(x):
    """float32 value -> float16 bits; struct's 'e' rounds to nearest even."""
    return struct.unpack("<H", struct.pack("<e", x))[0]


def philox4x32_10(counter, key):
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for rnd in range(10):
        if rnd:
            k0 = (k0 + 0x9E3779B9) & MASK32
            k1 = (k1 + 0xBB67AE85) & MASK32
        p0 = 0xD2511F53 * c0
        p1 = 0xCD9E8D57 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0, p1 & MASK32, (p0 >> 32) ^ c3 ^ k1, p0 & MASK32)
    return c0, c1, c2, c3


def fnv1a32(name):
    h = 0x811C9DC5
    for b in name.encode("utf-8"):
        h ^= b
        h = (h * 0x01000193) & MASK32
    return h


def philox_words(name, seed, n):
    h = fnv1a32(name)
    key = (seed & MASK32, (seed >> 32) & MASK32)
    return [philox4x32_10((i & MASK32, i >> 32, h, 0), key) for i in range(n)]


def ref_uniform(name, seed, n, low, high):
    """float32 values (as Python floats), step by step: u = (x0 >> 8) * 2^-24;
    low + (high - low) * u with low and high as float32, each operation rounded."""
    lo, hi = f32(low), f32(high)
    span = f32(hi - lo)
    out = []
    for x0, _, _, _ in philox_words(name, seed, n):
        u = f32((x0 >> 8) * 2.0 ** -24)
        out.append(f32(lo + f32(span * u)))
    return out


# normal: fill.c's float32 Box-Muller, as docs/semantics.md specifies it (coefficients there).
NORMAL_LN_Q = [float.fromhex(h) for h in (
    "-0x1.4136acp-4", "0x1.069f1ap-3", "-0x1.0c8b34p-3", "0x1.229882p-3", "-0x1.548196p-3",
    "0x1.99a3b6p-3", "-0x1.00022cp-2", "0x1.55554ep-2", "-0x1.fffffep-2")]
NORMAL_SIN_S = [float.fromhex(h) for h in (
    "0x1.413080p-13", "-0x1.328aeep-8", "0x1.466b8ap-4", "-0x1.4abbdap-1", "0x1.921fb6p+0")]
LN2_HI, LN2_LO = float.fromhex("0x1.62e300p-1"), float.fromhex("0x1.2fefa4p-17")
F32_SQRT2 = float.fromhex("0x1.6a09e6p+0")


def horner_f32(coefs, x):
    acc = coefs[0]
    for c in coefs[1:]:
        acc = f32(f32(acc * x) + c)
    return acc


def normal_f32(x0, x1, mean, std):
    """One value, every operation rounded to float32, no fused multiply-add."""
    m, e = math.frexp((x0 >> 8) + 1)  # exact: (x0 >> 8) + 1 = m 2^e, m in [1/2, 1)
    f, k = (m, e - 24) if 2 * m > F32_SQRT2 else (2 * m, e - 25)
    t = f32(f - 1.0)
    q = horner_f32(NORMAL_LN_Q, t)
    lo = f32(f32(f32(t * t) * q) + f32(k * LN2_LO))
    ln_u1 = f32(f32(k * LN2_HI) + f32(t + lo))
    rad = f32(math.sqrt(f32(-2.0 * ln_u1)))
    g = (1 << 22) - (x1 >> 8)  # cos(2 pi u2) = sin((pi/2) g 2^-22), g folded into [-2^22, 2^22]
    if g < -(1 << 22):
        g = -(1 << 23) - g
    g = g * 2.0 ** -22
    c = f32(g * horner_f32(NORMAL_SIN_S, f32(g * g)))
    return f32(mean + f32(std * f32(rad * c)))


def ref_normal(name, seed, n, mean, std):
    """float32 values (as Python floats), bit for bit the daemon's."""
    mean, std = f32(mean), f32(std)
    return [normal_f32(x0, x1, mean, std) for x0, x1, _, _ in philox_words(name, seed, n)]


def ref_normal_libm(name, seed, n, mean, std):
    """In double (libm), rounded once: within a few float32 ulps of the daemon's."""
    out = []
    for x0, x1, _, _ in philox_words(name, seed, n):
        u1 = ((x0 >> 8) + 1) * 2.0 ** -24
        u2 = (x1 >> 8) * 2.0 ** -24
        z = math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)
        out.append(f32(mean + std * z))
    return out


def assert_close(test, got, want, rtol, atol, what):
    test.assertEqual(len(got), len(want), what)
    bad = [(i, g, w) for i, (g, w) in enumerate(zip(got, want))
           if not abs(g - w) <= atol + rtol * abs(w)]
    test.assertEqual(bad[:5], [], "%s: %d of %d values differ from the reference"
                     % (what, len(bad), len(got)))


def row_major_strides(shape):
    st, acc = [], 1
    for x in reversed(shape):
        st.append(acc)
        acc *= x
    return list(reversed(st))


def chunk_piece(L, n, c):
    """torch.chunk: chunk = ceil(L/n); piece c is [min(L, c*chunk), min(L, (c+1)*chunk))."""
    if n <= 1:
        return 0, L
    chunk = -(-L // n)
    return min(L, c * chunk), min(L, (c + 1) * chunk)


def unravel(pos, dims):
    coords = []
    for _, size in reversed(dims):
        coords.append(pos % size)
        pos //= size
    return list(reversed(coords))


def expected_layout(shape, placements, device_dims, expert_dims, ranks):
    """{rank: (local_shape, global_offset)} and the view name, computed independently."""
    dev_names = [n for n, _ in device_dims]
    exp_names = [n for n, _ in expert_dims]
    view = "device"
    for axis, kind, _ in placements:
        if axis in exp_names and axis not in dev_names:
            view = "expert"
    dims = expert_dims if view == "expert" else device_dims
    out = {}
    for pos, rank in enumerate(ranks):
        coords = dict(zip([n for n, _ in dims], unravel(pos, dims)))
        start = [0] * len(shape)
        end = list(shape)
        for name, size in dims:   # nest in the view's dimension order
            for axis, kind, d in placements:
                if axis != name or kind != "shard":
                    continue
                d = d % len(shape)
                L = end[d] - start[d]
                s, e = chunk_piece(L, size, coords[name])
                start[d], end[d] = start[d] + s, start[d] + e
        out[rank] = ([e - s for s, e in zip(start, end)], start)
    return out, view


# ---------------------------------------------------------------------------------------------
# Requests

def build_request(family, config=None, module=None, args=None, mesh_id="", context=None,
                  materialize=None, module_fqn="", writable=False):
    req = P.cls("familyd.v1.BuildRequest")(family=family, mesh_id=mesh_id, module_fqn=module_fqn,
                                           writable=writable)
    for k, v in (args or {}).items():
        req.arguments[k].CopyFrom(P.value(v))
    if config is not None:
        req.config.SetInParent()
        for k, v in config.items():
            req.config.fields[k].CopyFrom(P.value(v))
    if module is not None:
        fqn, params = module
        req.module.SetInParent()
        req.module.fqn = fqn
        for name, shape in params:
            sp = req.module.parameters.add()
            sp.name = name
            sp.shape.extend(shape)
            sp.dtype = "float32"
    for k, v in (context or {}).items():
        setattr(req.context, k, v)
    if materialize is not None:
        req.materialize.enabled = True
        # Each materialising Build here is its own build (not shared with an identical one:
        # test_build_sharing.py covers sharing), released at once (--build-grace-ms 0).
        req.private_build = True
        for k, v in materialize.items():
            if k == "ranks":
                req.materialize.ranks.extend(v)
            else:
                setattr(req.materialize, k, v)
    return req


GE_SMALL = {"num_experts": 4, "hidden_size": 8, "moe_intermediate_size": 4,
            "initializer_range": 0.02}
ATT_CFG = {"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "hidden_size": 32,
           "initializer_range": 0.02}


class Base(unittest.TestCase):
    daemon = None   # D unless a class says otherwise

    @property
    def d(self):
        return self.daemon or D

    def call(self, rpc, request=None, **kw):
        return self.d.client.call(rpc, request, **kw)

    def assertOk(self, res):
        self.assertEqual(res.code, "OK", "%r" % res)
        return res.reply

    def assertErrorInfo(self, res, reason):
        st, infos = self.d.client.error_details(res)
        self.assertIsNotNone(st, "no grpc-status-details-bin trailer on %r" % res)
        self.assertEqual(st.message, res.message)
        self.assertEqual(len(infos), 1, "expected one ErrorInfo in %s" % st)
        self.assertEqual(infos[0].domain, "familyd")
        self.assertEqual(infos[0].reason, reason, "%r" % res)

    def state(self):
        st = self.assertOk(self.call("familyd.v1.AdminService/GetStatus"))
        ids = sorted(b.build_id for b in
                     self.assertOk(self.call("familyd.v1.FamilyService/ListBuilds")).builds)
        return st.builds, st.shm_bytes_in_use, ids

    def mesh(self, device, expert=(), ranks=None, **sizes):
        m = {"deviceMesh": [{"name": n, "size": s} for n, s in device]}
        if expert:
            m["expertMesh"] = [{"name": n, "size": s} for n, s in expert]
        if ranks is not None:
            m["ranks"] = [str(r) for r in ranks]
        for k, v in sizes.items():
            m[k] = str(v)
        return self.assertOk(self.call("familyd.v1.MeshService/CreateMesh", {"mesh": m}))

    def build(self, *a, **kw):
        return self.call("familyd.v1.FamilyService/Build", build_request(*a, **kw))

    def built(self, *a, **kw):
        b = self.assertOk(self.build(*a, **kw)).build
        self.addCleanup(self.release_quietly, b.build_id)
        return b

    def release_quietly(self, build_id):
        self.call("familyd.v1.FamilyService/ReleaseBuild", build_id=build_id)

    def release(self, build_id):
        self.assertOk(self.call("familyd.v1.FamilyService/ReleaseBuild", build_id=build_id))

    def assertBuildFails(self, req_args, code, message, reason, **kw):
        """The Build fails with code/message/reason; nothing was half-built; still serving."""
        before = self.state()
        res = self.build(*req_args, **kw)
        self.assertEqual((res.code, res.message), (code, message), "%r" % res)
        self.assertErrorInfo(res, reason)
        self.assertEqual(self.state(), before, "a failed Build left state behind")
        self.assertOk(self.d.client.health(""))
        return res

    # Shards ---------------------------------------------------------------------------------

    def fetch(self, build, writable=False):
        """{rank: (RankShard, fd)} for every rank with a token, from one shard request."""
        holders = [s for s in build.shards if s.token]
        if not holders:
            return {}
        reply, fds = SC.fetch(build.shard_socket, P, [s.token for s in holders], writable)
        for fd in fds:
            self.addCleanup(os.close, fd)
        self.assertEqual(reply.code, 0, reply.message)
        self.assertEqual(len(fds), len(holders))
        self.assertEqual(list(reply.sizes), [s.size_bytes for s in holders])
        self.assertEqual(list(reply.device_kinds), ["host"] * len(holders))
        self.assertEqual(list(reply.devices), [s.local_device for s in holders])
        for s, fd in zip(holders, fds):
            self.assertEqual(os.fstat(fd).st_size, s.size_bytes)
        return {s.rank: (s, fd) for s, fd in zip(holders, fds)}

    def assemble(self, build, code):
        """Full tensors, flat row-major lists of raw elements (array code 'I': 4 bytes, 'H': 2),
        from every rank's mapped shard; replicas must agree and every element be covered."""
        shapes = {p.name: list(p.shape) for p in build.info.layout.parameters}
        full = {n: [None] * math.prod(shape) for n, shape in shapes.items()}
        itemsize = array.array(code).itemsize
        for rank, (shard, fd) in self.fetch(build).items():
            mm = SC.map_readonly(fd, shard.size_bytes)
            self.addCleanup(mm.close)
            for sl in shard.slices:
                ls, off = list(sl.local_shape), list(sl.global_offset)
                n = math.prod(ls)
                if n == 0:
                    continue
                self.assertEqual(sl.byte_length, n * itemsize)
                self.assertLessEqual(sl.byte_offset + sl.byte_length, shard.size_bytes)
                local = array.array(code, mm[sl.byte_offset:sl.byte_offset + sl.byte_length])
                st = row_major_strides(shapes[sl.parameter])
                row = ls[-1] if ls else 1
                dst = full[sl.parameter]
                for k, idx in enumerate(itertools.product(*[range(x) for x in ls[:-1]])):
                    g = sum((i + o) * t for i, o, t in zip(idx, off, st)) + (off[-1] if ls else 0)
                    src = local[k * row:(k + 1) * row].tolist()
                    cur = dst[g:g + row]
                    if any(x is not None and x != y for x, y in zip(cur, src)):
                        self.fail("replicas of %r disagree (rank %d)" % (sl.parameter, rank))
                    dst[g:g + row] = src
        for n, v in full.items():
            self.assertNotIn(None, v, "parameter %r not fully covered by shards" % n)
        return full


# ---------------------------------------------------------------------------------------------
# 1. Errors

class TestBuildErrors(Base):
    def test_target_errors(self):
        self.assertBuildFails(("nope", GE_SMALL), "NOT_FOUND",
                              "family name 'nope' must identify exactly one registration",
                              "UNKNOWN_FAMILY")
        self.assertBuildFails(("norm", {"hidden_size": 4}), "INVALID_ARGUMENT",
                              "family name 'norm' must identify exactly one registration",
                              "AMBIGUOUS_FAMILY")
        self.assertBuildFails(("engram", {}), "INVALID_ARGUMENT",
                              "FamilyRequest requires a family with a concrete default_variant",
                              "NO_DEFAULT_VARIANT")

    def test_resolve_errors_through_build(self):
        self.assertBuildFails((GE, GE_SMALL), "INVALID_ARGUMENT",
                              "grouped_experts: unknown arguments: ['bogus', 'zz']",
                              "UNKNOWN_ARGUMENTS", args={"zz": 1, "bogus": 2, "config": 3})
        self.assertBuildFails((GE, GE_SMALL), "INVALID_ARGUMENT",
                              "selector 'use_mxfp8' must be bool", "ARGUMENT_TYPE",
                              args={"use_mxfp8": 1})
        self.assertBuildFails((GE, GE_SMALL), "NOT_FOUND", "mesh 'no-such' not found",
                              "MESH_NOT_FOUND", mesh_id="no-such")
        self.assertBuildFails((GE, GE_SMALL), "INVALID_ARGUMENT",
                              "use_fused_mxfp8 requires use_mxfp8=True", "RULE_ERROR",
                              args={"use_fused_mxfp8": True})
        self.assertBuildFails((GE, GE_SMALL), "FAILED_PRECONDITION",
                              "variant 'mxfp8' requires ep in [1, 2]; job has ep=4",
                              "REQUIREMENT", args={"use_mxfp8": True}, context={"ep_size": 4})

    def test_config_in_arguments(self):
        self.assertBuildFails((GE, GE_SMALL), "INVALID_ARGUMENT", "config was supplied twice",
                              "CONFIG", args={"config": 1})
        self.assertBuildFails((GE,), "INVALID_ARGUMENT",
                              "config must be given in BuildRequest.config", "CONFIG",
                              args={"config": 1})

    def test_exactly_one_origin(self):
        self.assertBuildFails((GE,), "INVALID_ARGUMENT",
                              "provide exactly one of config or module", "BINDING")
        self.assertBuildFails((GE, GE_SMALL, ("m", [("gate_up_proj", [4, 8, 8])])),
                              "INVALID_ARGUMENT", "provide exactly one of config or module",
                              "BINDING")
        # An empty Config message is present: presence, not content, counts.
        self.assertBuildFails((GE, {}, ("m", [])), "INVALID_ARGUMENT",
                              "provide exactly one of config or module", "BINDING")

    def test_module_fqn_disagrees(self):
        self.assertBuildFails((GE, None, ("b", [("gate_up_proj", [4, 8, 8]),
                                                ("down_proj", [4, 4, 8])])),
                              "INVALID_ARGUMENT", "module_fqn 'a' disagrees with module.fqn 'b'",
                              "BINDING", module_fqn="a")

    def test_context_and_mesh_different_jobs(self):
        m1 = self.mesh([("dp", 2), ("ep", 4)])
        m2 = self.mesh([("dp", 8)])
        self.assertBuildFails((GE, GE_SMALL), "INVALID_ARGUMENT",
                              "context and mesh belong to different jobs", "MESH_MISMATCH",
                              mesh_id=m1.mesh_id, context={"mesh_id": m2.mesh_id})
        # The same mesh in both places is one job.
        b = self.built(GE, GE_SMALL, mesh_id=m1.mesh_id, context={"mesh_id": m1.mesh_id})
        self.assertEqual(b.info.layout.mesh_id, m1.mesh_id)

    def test_binding(self):
        # attention's mxfp8 member accepts config but not module.
        self.assertBuildFails((ATT, None, ("layers.0.attn", [("wq", [32, 32])])),
                              "INVALID_ARGUMENT", "member 'mxfp8' must explicitly accept module",
                              "BINDING", args={"use_mxfp8": True})
        self.assertBuildFails((GE, GE_SMALL), "INVALID_ARGUMENT",
                              "member 'mxfp8' does not accept ['activation']", "BINDING",
                              args={"use_mxfp8": True, "activation": "gelu"})

    def test_binding_must_accept_config(self):
        self.daemon = X
        self.assertBuildFails(("noconfig", {"num_experts": 2, "hidden_size": 2, "inter": 2}),
                              "INVALID_ARGUMENT", "member 'grouped' must explicitly accept config",
                              "BINDING")

    def test_direct_shape_errors(self):
        cfg = dict(ATT_CFG)
        del cfg["head_dim"]
        self.assertBuildFails((ATT, cfg), "INVALID_ARGUMENT",
                              "parameter 'wq' needs config field 'head_dim'", "CONFIG")
        self.assertBuildFails((ATT, dict(ATT_CFG, head_dim=64.0)), "INVALID_ARGUMENT",
                              "config field 'head_dim' must be int", "CONFIG")
        self.assertBuildFails((ATT, dict(ATT_CFG, head_dim=True)), "INVALID_ARGUMENT",
                              "config field 'head_dim' must be int", "CONFIG")
        # Dimensions are numbered from 0, as shard(d) counts: wq = [heads * head_dim, hidden].
        self.assertBuildFails((ATT, dict(ATT_CFG, hidden_size=-3)), "INVALID_ARGUMENT",
                              "parameter 'wq': dimension 1 must be positive, got -3", "SHAPE")
        self.assertBuildFails((ATT, dict(ATT_CFG, num_attention_heads=-1)), "INVALID_ARGUMENT",
                              "parameter 'wq': dimension 0 must be positive, got -8", "SHAPE")
        self.assertBuildFails((ATT, dict(ATT_CFG, hidden_size=0)), "INVALID_ARGUMENT",
                              "parameter 'wq': dimension 1 must be positive, got 0", "SHAPE")

    def test_init_field_must_be_number(self):
        # docs/semantics.md gives no text for this one: a number type, named by the field.
        res = self.build(GE, dict(GE_SMALL, initializer_range="big"))
        self.assertEqual(res.code, "INVALID_ARGUMENT", "%r" % res)
        self.assertIn("'initializer_range'", res.message)
        self.assertErrorInfo(res, "CONFIG")
        # An int is a number.
        self.built(GE, dict(GE_SMALL, initializer_range=1))

    def test_divide_exactly(self):
        self.daemon = X
        self.assertBuildFails(("divtest", {"hidden_size": 4096, "num_attention_heads": 30}),
                              "INVALID_ARGUMENT",
                              "parameter 'wq': 4096 / 30 does not divide exactly", "SHAPE")
        b = self.built("divtest", {"hidden_size": 4096, "num_attention_heads": 32})
        self.assertEqual(list(b.info.layout.parameters[0].shape), [128, 4096])

    def test_replacement_errors(self):
        self.daemon = X
        self.assertBuildFails(("noconfig", None, ("layers.0.mlp", [("w2", [2, 2, 2])])),
                              "INVALID_ARGUMENT", "module 'layers.0.mlp' has no parameter 'w1'",
                              "SHAPE")
        self.assertBuildFails(("noconfig", None, ("layers.0.mlp", [("w1", [2, 2])])),
                              "INVALID_ARGUMENT",
                              "parameter 'w1' of module 'layers.0.mlp' has 2 dimensions, "
                              "expected 3", "SHAPE")
        # module_fqn defaults to module.fqn; naming it the same is fine too.
        b = self.built("noconfig", None, ("layers.0.mlp", [("w1", [2, 3, 4]), ("extra", [9])]),
                       module_fqn="layers.0.mlp")
        self.assertEqual(b.info.origin, "replacement")
        self.assertEqual(list(b.info.layout.parameters[0].shape), [2, 3, 4])

    def test_replacement_contradictions(self):
        mod = ("layers.0.mlp", [("gate_up_proj", [4, 32, 32]), ("down_proj", [8, 16, 32])])
        self.assertBuildFails((GE, None, mod), "INVALID_ARGUMENT",
                              "parameter 'down_proj' of module 'layers.0.mlp' has shape "
                              "[8, 16, 32], which contradicts num_experts=4", "SHAPE")
        # A non-lone expression, checked once its fields are bound (daemon's wording: the
        # bound fields it names).
        mod = ("layers.0.mlp", [("gate_up_proj", [4, 32, 30]), ("down_proj", [4, 16, 32])])
        self.assertBuildFails((GE, None, mod), "INVALID_ARGUMENT",
                              "parameter 'gate_up_proj' of module 'layers.0.mlp' has shape "
                              "[4, 32, 30], which contradicts moe_intermediate_size=16", "SHAPE")
        mod = ("layers.0.mlp", [("gate_up_proj", [4, 32, 32]), ("down_proj", [4, 16, 32])])
        b = self.built(GE, None, mod)
        self.assertEqual(b.info.origin, "replacement")
        self.assertFalse(b.info.reset_after_materialization)

    def test_rank_not_local(self):
        m = self.mesh([("dp", 4)], ranks=[0, 1, 2, 3])
        self.assertBuildFails((GE, GE_SMALL), "INVALID_ARGUMENT",
                              "rank 5 is not local to this node", "RANK_NOT_LOCAL",
                              mesh_id=m.mesh_id, materialize={"ranks": [5]})
        self.assertBuildFails((GE, GE_SMALL), "INVALID_ARGUMENT",
                              "rank 5 is not local to this node", "RANK_NOT_LOCAL",
                              mesh_id=m.mesh_id, materialize={"ranks": [1, 5]})
        # Only the ranks asked for get a token.
        b = self.built(GE, GE_SMALL, mesh_id=m.mesh_id, materialize={"ranks": [2]})
        self.assertEqual([s.rank for s in b.shards], [0, 1, 2, 3])
        self.assertEqual([bool(s.token) for s in b.shards], [False, False, True, False])

    def test_unknown_dtype(self):
        res = self.build(GE, GE_SMALL, materialize={"dtype": "int8"})
        self.assertEqual(res.code, "INVALID_ARGUMENT", "%r" % res)

    def test_get_release_unknown(self):
        for rpc in ("GetBuild", "ReleaseBuild"):
            before = self.state()
            res = self.call("familyd.v1.FamilyService/" + rpc, build_id="bld-nope")
            self.assertEqual((res.code, res.message), ("NOT_FOUND", "build 'bld-nope' not found"))
            self.assertErrorInfo(res, "BUILD_NOT_FOUND")
            self.assertEqual(self.state(), before)
        b = self.assertOk(self.build(GE, GE_SMALL, materialize={})).build
        got = self.assertOk(self.call("familyd.v1.FamilyService/GetBuild", build_id=b.build_id))
        self.assertEqual(got, b)
        self.release(b.build_id)
        for rpc in ("GetBuild", "ReleaseBuild"):
            res = self.call("familyd.v1.FamilyService/" + rpc, build_id=b.build_id)
            self.assertEqual((res.code, res.message),
                             ("NOT_FOUND", "build '%s' not found" % b.build_id))
            self.assertErrorInfo(res, "BUILD_NOT_FOUND")

    def test_delete_mesh_in_use(self):
        m = self.mesh([("ep", 4), ("dp", 2)])
        b = self.assertOk(self.build(GE, GE_SMALL, mesh_id=m.mesh_id)).build
        res = self.call("familyd.v1.MeshService/DeleteMesh", mesh_id=m.mesh_id)
        self.assertEqual((res.code, res.message),
                         ("FAILED_PRECONDITION", "mesh '%s' is used by 1 builds" % m.mesh_id))
        self.assertErrorInfo(res, "MESH_IN_USE")
        self.assertOk(self.call("familyd.v1.MeshService/GetMesh", mesh_id=m.mesh_id))
        self.release(b.build_id)
        self.assertOk(self.call("familyd.v1.MeshService/DeleteMesh", mesh_id=m.mesh_id))
        res = self.call("familyd.v1.MeshService/GetMesh", mesh_id=m.mesh_id)
        self.assertEqual(res.code, "NOT_FOUND")

    def test_mesh_use_count(self):
        m = self.mesh([("dp", 2), ("ep", 4)])
        b1 = self.assertOk(self.build(GE, GE_SMALL, mesh_id=m.mesh_id)).build
        b2 = self.assertOk(self.build(GE, GE_SMALL, context={"mesh_id": m.mesh_id},
                                      materialize={})).build
        res = self.call("familyd.v1.MeshService/DeleteMesh", mesh_id=m.mesh_id)
        self.assertEqual((res.code, res.message),
                         ("FAILED_PRECONDITION", "mesh '%s' is used by 2 builds" % m.mesh_id))
        self.release(b1.build_id)
        res = self.call("familyd.v1.MeshService/DeleteMesh", mesh_id=m.mesh_id)
        self.assertEqual(res.message, "mesh '%s' is used by 1 builds" % m.mesh_id)
        self.release(b2.build_id)
        self.assertOk(self.call("familyd.v1.MeshService/DeleteMesh", mesh_id=m.mesh_id))

    def test_context_mesh_disagree(self):
        m = self.mesh([("dp", 2), ("ep", 4)])
        self.assertBuildFails((GE, GE_SMALL), "INVALID_ARGUMENT",
                              "context and mesh disagree on ep_size", "CONTEXT_MESH_DISAGREE",
                              mesh_id=m.mesh_id, context={"ep_size": 2})
        self.assertBuildFails((GE, GE_SMALL), "INVALID_ARGUMENT", "tp_size must be a positive "
                              "integer", "AXIS_SIZE", context={"tp_size": 0})
        self.assertBuildFails((GE, GE_SMALL), "INVALID_ARGUMENT",
                              "ep_size is required when ep is active", "AXIS_REQUIRED",
                              context={"ep": True})

    def test_failed_builds_do_not_hold_the_mesh(self):
        m = self.mesh([("dp", 2), ("ep", 2), ("tp", 2)])
        self.assertBuildFails((GE, GE_SMALL), "INVALID_ARGUMENT",
                              "rank 9 is not local to this node", "RANK_NOT_LOCAL",
                              mesh_id=m.mesh_id, materialize={"ranks": [9]})
        self.assertBuildFails((GE, dict(GE_SMALL, hidden_size=-1)), "INVALID_ARGUMENT",
                              "parameter 'gate_up_proj': dimension 1 must be positive, got -1",
                              "SHAPE", mesh_id=m.mesh_id)
        self.assertOk(self.call("familyd.v1.MeshService/DeleteMesh", mesh_id=m.mesh_id))


class TestLimits(Base):
    """A daemon of its own: --shm-budget 65536 --max-builds 3."""

    BUDGET = 65536

    @classmethod
    def setUpClass(cls):
        cls.daemon = H.Daemon(registry=REGISTRY, host_devices=8, node_name=NODE, protos=P,
                              extra_args=["--shm-budget", str(cls.BUDGET), "--max-builds", "3",
                                          "--build-grace-ms", "0"])
        cls.daemon.start()

    @classmethod
    def tearDownClass(cls):
        try:
            cls.daemon.stop()
            check_sanitizers(cls.daemon)
        finally:
            cls.daemon.cleanup()

    def test_budget_and_build_limit(self):
        # gate_up 4*32*64 + down 4*32*32 floats = 49152 bytes, one rank, no mesh.
        cfg = dict(GE_SMALL, hidden_size=32, moe_intermediate_size=32)
        need = 4 * 32 * 64 * 4 + 4 * 32 * 32 * 4
        st = self.assertOk(self.call("familyd.v1.AdminService/GetStatus"))
        self.assertEqual(st.shm_budget_bytes, self.BUDGET)
        self.assertEqual(st.shm_bytes_in_use, 0)
        a = self.built(GE, cfg, materialize={})
        self.assertEqual(a.shards[0].size_bytes, need)
        self.assertEqual(self.state()[:2], (1, need))
        self.assertBuildFails((GE, cfg), "RESOURCE_EXHAUSTED",
                              "shm budget exceeded: build needs %d bytes, %d of %d in use"
                              % (need, need, self.BUDGET), "SHM_BUDGET", materialize={})
        # Larger than the whole budget, on a mesh: the mesh is not held afterwards. Its eight
        # dp ranks are replicas of one shard, counted once (docs/sharing.md, "Replicas").
        m = self.mesh([("dp", 8)])
        big = dict(cfg, num_experts=16)
        self.assertBuildFails((GE, big), "RESOURCE_EXHAUSTED",
                              "shm budget exceeded: build needs %d bytes, %d of %d in use"
                              % (4 * need, need, self.BUDGET), "SHM_BUDGET",
                              mesh_id=m.mesh_id, materialize={})
        self.assertOk(self.call("familyd.v1.MeshService/DeleteMesh", mesh_id=m.mesh_id))
        # Builds that materialise nothing still count against --max-builds.
        self.built(GE, cfg)
        small = self.built(GE, GE_SMALL, materialize={}).shards[0].size_bytes
        self.assertEqual(self.state()[:2], (3, need + small))
        self.assertBuildFails((GE, GE_SMALL), "RESOURCE_EXHAUSTED",
                              "build limit reached: 3 builds", "BUILD_LIMIT")
        # Releasing frees both.
        self.release(a.build_id)
        self.assertEqual(self.state()[:2], (2, small))
        b = self.built(GE, cfg, materialize={})
        self.assertEqual(b.shards[0].size_bytes, need)


    def test_concurrent_builds_respect_the_budget(self):
        """Eight Builds at once, each needing 3/4 of the budget: exactly one is made."""
        import threading
        cfg = dict(GE_SMALL, hidden_size=32, moe_intermediate_size=32)
        before = self.state()
        self.assertEqual(before[:2], (0, 0))
        results = [None] * 8
        clients = [H.Client(self.d.socket, P) for _ in results]
        for c in clients:
            self.addCleanup(c.close)

        def one(k):
            results[k] = clients[k].call("familyd.v1.FamilyService/Build",
                                         build_request(GE, cfg, materialize={}))
        threads = [threading.Thread(target=one, args=(k,)) for k in range(len(results))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        ok = [r for r in results if r.ok]
        self.assertEqual(len(ok), 1, [r for r in results])
        self.addCleanup(self.release_quietly, ok[0].reply.build.build_id)
        for r in results:
            if not r.ok:
                self.assertEqual(r.code, "RESOURCE_EXHAUSTED", "%r" % r)
                self.assertTrue(r.message.startswith("shm budget exceeded: build needs 49152 "
                                                     "bytes, 49152 of 65536 in use"), r.message)
        self.assertEqual(self.state()[:2], (1, 49152))


# ---------------------------------------------------------------------------------------------
# 2. Layout

LAYOUT_MESHES = [
    # (device view, expert view, rank list or None)
    ([("dp", 2), ("ep", 4)], [], None),
    ([("dp", 8)], [("edp_shard", 2), ("ep", 4)], [7, 6, 5, 4, 3, 2, 1, 0]),
    ([("ep", 4), ("dp", 2)], [], [1, 3, 5, 7, 0, 2, 4, 6]),
]


class TestLayout(Base):
    def check_layout(self, b, cfg, device, expert, ranks, elem):
        ranks = list(range(8)) if ranks is None else ranks
        H_, M = cfg["hidden_size"], cfg["moe_intermediate_size"]
        E = cfg["num_experts"]
        shapes = {"gate_up_proj": [E, H_, 2 * M], "down_proj": [E, M, H_]}
        pl = [p for p in b.info.layout.parameters]
        self.assertEqual([p.name for p in pl], ["gate_up_proj", "down_proj"])
        exp = {}
        for p in pl:
            self.assertEqual(list(p.shape), shapes[p.name])
            self.assertEqual([(x.axis, x.kind, x.dim) for x in p.placements], [("ep", "shard", 0)])
            exp[p.name], view = expected_layout(shapes[p.name], [("ep", "shard", 0)],
                                                device, expert, ranks)
            self.assertEqual(p.mesh_view, view, p.name)
        self.assertEqual([s.rank for s in b.shards], ranks, "Build.shards: every rank, in order")
        for s in b.shards:
            self.assertEqual(s.node, NODE)
            self.assertEqual(s.local_device, s.rank)
            self.assertEqual([sl.parameter for sl in s.slices], ["gate_up_proj", "down_proj"])
            end = 0
            for sl in s.slices:
                want_shape, want_off = exp[sl.parameter][s.rank]
                self.assertEqual((list(sl.local_shape), list(sl.global_offset)),
                                 (want_shape, want_off), "rank %d %s" % (s.rank, sl.parameter))
                n = math.prod(want_shape)
                self.assertEqual(sl.byte_length, n * elem)
                if n:
                    # layout.h: packed in parameter order, each aligned.
                    self.assertEqual(sl.byte_offset, -(-end // ALIGN) * ALIGN)
                    end = sl.byte_offset + sl.byte_length
                else:
                    self.assertEqual(sl.byte_offset, 0)
            self.assertEqual(s.size_bytes, -(-end // ALIGN) * ALIGN)
        return exp

    def test_layout_on_meshes(self):
        for E in (8, 4, 12):
            cfg = dict(GE_SMALL, num_experts=E)
            for device, expert, ranks in LAYOUT_MESHES:
                with self.subTest(E=E, device=device, expert=expert, ranks=ranks):
                    m = self.mesh(device, expert, ranks)
                    b = self.built(GE, cfg, mesh_id=m.mesh_id)
                    self.assertEqual(b.info.resolved.variant, "grouped_ep")
                    self.assertEqual(b.info.resolved.axis_sizes["ep"], 4)
                    self.check_layout(b, cfg, device, expert, ranks, 4)
                    # Not materialised: no tokens.
                    self.assertFalse(any(s.token for s in b.shards))
                    self.release(b.build_id)

    def test_experts_that_do_not_divide_over_ep_are_refused(self):
        """semantics.md, Layout: experts divide over ep; an uneven split is refused, on every
        mesh (the ep dimension in the device view or in the expert view), materialised or not."""
        for E in (6, 3, 9):
            for device, expert, ranks in LAYOUT_MESHES:
                for materialize in (None, {}):
                    with self.subTest(E=E, device=device, expert=expert, materialize=materialize):
                        m = self.mesh(device, expert, ranks)
                        res = self.assertBuildFails(
                            (GE, dict(GE_SMALL, num_experts=E)), "INVALID_ARGUMENT",
                            "parameter 'gate_up_proj': %d experts (dimension 0) do not divide over "
                            "ep=4; each ep rank must hold the same number of experts" % E,
                            "EXPERTS_UNEVEN", mesh_id=m.mesh_id,
                            **({} if materialize is None else {"materialize": materialize}))
                        infos = self.d.client.error_details(res)[1]
                        self.assertEqual(dict(infos[0].metadata).get("field"), "gate_up_proj")

    def test_empty_ranks_have_no_token(self):
        """tp may split unevenly: attention's 3 rows over tp=4 leave tp coordinate 3 empty."""
        cfg = dict(ATT_CFG, num_attention_heads=3, num_key_value_heads=3, head_dim=1, hidden_size=8)
        shapes = {"wq": ([3, 8], 0), "wk": ([3, 8], 0), "wv": ([3, 8], 0), "wo": ([8, 3], 1)}
        for device, ranks in (([("dp", 2), ("tp", 4)], None),
                              ([("tp", 4), ("dp", 2)], [1, 3, 5, 7, 0, 2, 4, 6])):
            with self.subTest(device=device):
                m = self.mesh(device, [], ranks)
                in_use = self.state()[1]
                b = self.built(ATT, cfg, mesh_id=m.mesh_id, materialize={"dtype": "bf16"})
                exp = {}
                for p in b.info.layout.parameters:
                    shape, dim = shapes[p.name]
                    exp[p.name], _ = expected_layout(shape, [("tp", "shard", dim)], device, [],
                                                     ranks if ranks is not None else range(8))
                empties = 0
                for s in b.shards:
                    for sl in s.slices:
                        self.assertEqual((list(sl.local_shape), list(sl.global_offset)),
                                         exp[sl.parameter][s.rank])
                    empty = all(0 in exp[n][s.rank][0] for n in shapes)
                    if empty:
                        empties += 1
                        self.assertEqual(s.size_bytes, 0, "rank %d" % s.rank)
                        self.assertEqual(s.token, "", "rank %d holds no bytes" % s.rank)
                    else:
                        self.assertGreater(s.size_bytes, 0)
                        self.assertTrue(s.token, "rank %d holds bytes: needs a token" % s.rank)
                    self.assertEqual(s.device_kind, "host")
                self.assertEqual(empties, 2)   # tp coordinate 3, two replicas
                # Replicas (the same slices) share one segment, counted once (docs/sharing.md).
                distinct = {tuple(x.SerializeToString(deterministic=True) for x in s.slices):
                            s.size_bytes for s in b.shards}
                self.assertEqual(self.state()[1] - in_use, sum(distinct.values()))
                self.release(b.build_id)
        self.assertTrue(b.shard_socket)

    def test_nested_shards_and_missing_axes(self):
        """nest.w: {ep: shard(0), dp: shard(0), tp: shard(-1)}: axes on one dim nest in the
        view's order, not the placements' order; an axis the view lacks has size 1."""
        self.daemon = X
        cases = [([("dp", 2), ("tp", 2), ("ep", 2)], [], None),
                 ([("ep", 2), ("dp", 2), ("tp", 2)], [], [4, 5, 6, 7, 0, 1, 2, 3]),
                 ([("dp", 2), ("tp", 4)], [("dp", 2), ("ep", 4)], None)]
        # n is a multiple of 8, so ep divides it however the other axes nest around it
        # (semantics.md, Layout); tp's 3 columns still split unevenly, some over tp=4 empty.
        for n in (8, 16):
            for device, expert, ranks in cases:
                with self.subTest(n=n, device=device, expert=expert):
                    m = self.mesh(device, expert, ranks)
                    b = self.built("nest", {"n": n}, mesh_id=m.mesh_id,
                                   materialize={"seed": 3})
                    w = b.info.layout.parameters[0]
                    self.assertEqual([(p.axis, p.kind, p.dim) for p in w.placements],
                                     [("ep", "shard", 0), ("dp", "shard", 0), ("tp", "shard", 1)])
                    exp, view = expected_layout([n, 3], [("ep", "shard", 0), ("dp", "shard", 0),
                                                         ("tp", "shard", -1)],
                                                device, expert,
                                                ranks if ranks is not None else range(8))
                    self.assertEqual(w.mesh_view, view)
                    for s in b.shards:
                        sl = s.slices[0]
                        self.assertEqual((list(sl.local_shape), list(sl.global_offset)),
                                         exp[s.rank], "rank %d" % s.rank)
                        self.assertEqual(bool(s.token), s.size_bytes > 0)
                    full = self.assemble(b, "I")
                    self.assertEqual(full["w"], [f32_bits(x) for x in
                                                 ref_uniform("w", 3, n * 3, 0, 1)])
                    self.assertEqual(full["v"], [f32_bits(-2.5)] * 5)
                    self.release(b.build_id)
        # dp splits 6 as 3 + 3 before ep=2 splits each piece: 3 experts do not divide over ep
        m = self.mesh(cases[0][0], [], None)
        self.assertBuildFails(("nest", {"n": 6}), "INVALID_ARGUMENT",
                              "parameter 'w': 3 experts (dimension 0) do not divide over ep=2; "
                              "each ep rank must hold the same number of experts",
                              "EXPERTS_UNEVEN", mesh_id=m.mesh_id)

    def test_dtype_aliases(self):
        for given, canon, size in (("", "float32", 4), ("f32", "float32", 4),
                                   ("fp32", "float32", 4), ("float32", "float32", 4),
                                   ("bf16", "bfloat16", 2), ("bfloat16", "bfloat16", 2),
                                   ("f16", "float16", 2), ("fp16", "float16", 2),
                                   ("float16", "float16", 2)):
            with self.subTest(dtype=given):
                b = self.built(GE, GE_SMALL, materialize={"dtype": given})
                self.assertEqual([p.dtype for p in b.info.layout.parameters], [canon] * 2)
                self.assertEqual([sl.byte_length for sl in b.shards[0].slices],
                                 [4 * 8 * 8 * size, 4 * 4 * 8 * size])
                self.release(b.build_id)

    def test_no_mesh_one_rank(self):
        b = self.built(GE, GE_SMALL, materialize={})
        self.assertEqual(len(b.shards), 1)
        s = b.shards[0]
        self.assertEqual((s.rank, s.node, s.local_device), (0, NODE, 0))
        self.assertTrue(s.token)
        self.assertEqual(b.info.layout.mesh_id, "")
        self.assertEqual(b.info.origin, "direct")
        self.assertTrue(b.info.reset_after_materialization)
        self.assertEqual(b.info.resolved.variant, "grouped")
        self.assertEqual({k: P.py(v) for k, v in b.info.config_snapshot.fields.items()}, GE_SMALL)
        for sl in s.slices:
            self.assertEqual(list(sl.global_offset), [0, 0, 0])
        self.assertTrue(b.shard_socket)


class TestJobPlacements(Base):
    """registry.md, "Placements that depend on the job": GetFamily shows the cases; Build decides
    each placement by the first case that holds over the job (the mesh's sizes and flags), lays
    it out and fills the same values whatever the layout; a condition that cannot be evaluated
    is refused."""
    daemon = None

    def setUp(self):
        self.daemon = X

    def flagged_mesh(self, device, **flags):
        m = {"deviceMesh": [{"name": n, "size": s} for n, s in device]}
        m.update(flags)
        return self.assertOk(self.call("familyd.v1.MeshService/CreateMesh", {"mesh": m}))

    def test_get_family_shows_the_cases(self):
        f = self.assertOk(self.call("familyd.v1.FamilyService/GetFamily", family="jobplace"))
        head = [p for p in f.parameters if p.name == "head"][0]
        self.assertEqual([(p.axis, p.kind, p.dim) for p in head.placements], [("tp", "cases", 0)])
        self.assertEqual([(c.when, c.kind, c.dim) for c in head.placements[0].cases],
                         [("loss_parallel", "shard", 0), ("tp_size > 1", "shard", -1),
                          ("", "none", 0)])

    def test_build_decides_by_the_job(self):
        cfg = {"vocab": 8, "hidden": 6}
        want_full = None
        for flags, device, want in (
                ({"lossParallel": True}, [("dp", 2), ("tp", 4)], [("tp", "shard", 0)]),
                ({}, [("dp", 2), ("tp", 4)], [("tp", "shard", 1)]),
                ({"sequenceParallel": True}, [("dp", 8)], [])):
            with self.subTest(flags=flags, device=device):
                m = self.flagged_mesh(device, **flags)
                b = self.built("jobplace", cfg, mesh_id=m.mesh_id, materialize={"seed": 5})
                head = b.info.layout.parameters[0]
                self.assertEqual([(x.axis, x.kind, x.dim) for x in head.placements], want)
                exp, _ = expected_layout([8, 6], want, device, [], range(8))
                for sh in b.shards:
                    sl = sh.slices[0]
                    self.assertEqual((list(sl.local_shape), list(sl.global_offset)), exp[sh.rank])
                full = self.assemble(b, "I")["head"]
                if want_full is None:
                    want_full = full
                self.assertEqual(full, want_full, "the values do not depend on the layout")
                self.release(b.build_id)
        # without a mesh: the context's flags and sizes
        b = self.built("jobplace", cfg, context={"loss_parallel": True})
        self.assertEqual([(x.axis, x.kind, x.dim) for x in b.info.layout.parameters[0].placements],
                         [("tp", "shard", 0)])

    def test_a_condition_that_cannot_be_evaluated(self):
        self.assertBuildFails(("jobplace", {}, None, {"pick": "bad"}), "INVALID_ARGUMENT",
                              "parameter 'w': the placement over 'tp' cannot be decided: case 1's "
                              "condition 'tp_size / (cp_size - 1) > 1' division by zero",
                              "PLACEMENT")


class TestActivationLayout(Base):
    """registry.md, "Activation layouts": GetFamily shows the family's `layout`, the Build reply
    carries it (Layout.activations), and Validate refuses a model whose applied activation
    layout differs, field by field (semantics.md, Validate)."""

    def setUp(self):
        self.daemon = X

    WANT = {"inSrc": [{"placements": [{"axis": "tp", "kind": "shard", "dim": "1"},
                                      {"axis": "dp", "kind": "replicate"}]}],
            "inDst": [{"placements": [{"axis": "tp", "kind": "replicate"}]}],
            "outSrc": [{"placements": [{"axis": "tp", "kind": "partial"}]}],
            "outDst": [{"placements": [{"axis": "tp", "kind": "replicate"}]}],
            "outNames": ["logits"], "isBoundary": True}

    def as_json(self, msg):
        return json_format.MessageToDict(msg)

    def test_declared_shown_and_carried(self):
        f = self.assertOk(self.call("familyd.v1.FamilyService/GetFamily", family="jobplace"))
        self.assertEqual(self.as_json(f.layout), self.WANT)
        noconfig = self.assertOk(self.call("familyd.v1.FamilyService/GetFamily", family="noconfig"))
        self.assertFalse(noconfig.HasField("layout"))
        b = self.built("jobplace", {"vocab": 8, "hidden": 6})
        self.assertEqual(self.as_json(b.info.layout.activations), self.WANT)
        got = self.assertOk(self.call("familyd.v1.FamilyService/GetBuild", build_id=b.build_id))
        self.assertEqual(self.as_json(got.info.layout.activations), self.WANT)

    def validate(self, build_id, activations):
        layout = {"parameters": []}
        if activations is not None:
            layout["activations"] = activations
        req = {"boundaries": [{"fqns": ["lm_head", "tied"], "buildId": build_id,
                               "appliedLayout": layout}]}
        return self.assertOk(self.call("familyd.v1.FamilyService/Validate", req))

    def test_validate_compares_each_field(self):
        b = self.built("jobplace", {"vocab": 8, "hidden": 6})
        self.assertEqual(list(self.validate(b.build_id, None).violations), [])
        self.assertEqual(list(self.validate(b.build_id, self.WANT).violations), [])
        # another axis order inside one activation is the same placement
        same = dict(self.WANT, inSrc=[{"placements": list(reversed(self.WANT["inSrc"][0]["placements"]))}])
        self.assertEqual(list(self.validate(b.build_id, same).violations), [])
        changed = dict(self.WANT, outSrc=[{"placements": [{"axis": "tp", "kind": "replicate"}]}],
                       outNames=["y"], isBoundary=False)
        res = self.validate(b.build_id, changed)
        self.assertFalse(res.ok)
        self.assertEqual([(v.reason, list(v.fqns), v.message) for v in res.violations], [
            ("ACTIVATION_LAYOUT_CONFLICT", ["lm_head", "tied"],
             "%s at 'lm_head' conflicts with its constructed family layout" % field)
            for field in ("out_src", "out_names", "is_boundary")])
        # a family that declares none: an applied one that states any field conflicts
        n = self.built("nest", {"n": 8})
        self.assertEqual(list(self.validate(n.build_id, {}).violations), [])
        res = self.validate(n.build_id, {"inSrc": [{}]})
        self.assertEqual([v.message for v in res.violations],
                         ["in_src at 'lm_head' conflicts with its constructed family layout"])


# ---------------------------------------------------------------------------------------------
# 3. Invariance across meshes

INV_CFG = {"num_experts": 8, "hidden_size": 16, "moe_intermediate_size": 8,
           "initializer_range": 0.02}
INV_MESHES = [None, ([("dp", 2), ("ep", 4)], []),
              ([("dp", 8)], [("edp_shard", 2), ("ep", 4)], [3, 1, 4, 0, 5, 2, 6, 7])]


class TestInvariance(Base):
    def full_on(self, mesh_def, seed, dtype, code, cfg=INV_CFG):
        kw = {}
        if mesh_def is not None:
            kw["mesh_id"] = self.mesh(*mesh_def).mesh_id
        b = self.built(GE, cfg, materialize={"seed": seed, "dtype": dtype}, **kw)
        return self.assemble(b, code)

    def test_same_seed_same_bits_on_every_mesh(self):
        f32full = None
        for dtype, code in (("float32", "I"), ("bf16", "H")):
            fulls = [self.full_on(m, 12345, dtype, code) for m in INV_MESHES]
            for name in ("gate_up_proj", "down_proj"):
                for k, other in enumerate(fulls[1:], 1):
                    self.assertTrue(fulls[0][name] == other[name],
                                    "%s %s: mesh %r differs from no mesh"
                                    % (dtype, name, INV_MESHES[k]))
            if dtype == "float32":
                f32full = fulls[0]
            else:
                # bf16 is the float32 value rounded to nearest even.
                for name in f32full:
                    self.assertEqual(fulls[0][name],
                                     [bf16_bits(bits_f32(b)) for b in f32full[name]], name)
        other_seed = self.full_on(INV_MESHES[1], 12346, "float32", "I")
        for name in f32full:
            same = sum(a == b for a, b in zip(other_seed[name], f32full[name]))
            self.assertLess(same, len(f32full[name]) // 100, name)
        # Different parameter names give different streams.
        a = f32full["gate_up_proj"][:16]
        b = f32full["down_proj"][:16]
        self.assertTrue(all(x != y for x, y in zip(a, b)), "gate_up_proj and down_proj share "
                        "values: %s / %s" % (a, b))
        # ... and the values are the normal formula's: bit for bit the float32 one, and within
        # float32 rounding error (a few ulps) of libm's.
        vals = [bits_f32(x) for x in f32full["down_proj"]]
        self.assertEqual(f32full["down_proj"],
                         [f32_bits(x) for x in ref_normal("down_proj", 12345, len(vals), 0.0, 0.02)])
        assert_close(self, vals, ref_normal_libm("down_proj", 12345, len(vals), 0.0, 0.02),
                     1e-6, 1e-9, "down_proj")

    def test_default_seed_is_zero(self):
        b0 = self.built(GE, GE_SMALL, materialize={})
        b1 = self.built(GE, GE_SMALL, materialize={"seed": 0})
        self.assertEqual(self.assemble(b0, "I"), self.assemble(b1, "I"))

    def test_normal_statistics(self):
        cfg = {"num_experts": 8, "hidden_size": 64, "moe_intermediate_size": 64,
               "initializer_range": 0.02}
        full = self.full_on(INV_MESHES[1], 7, "float32", "I", cfg)
        for name, bits in full.items():
            v = array.array("f", array.array("I", bits).tobytes()).tolist()
            n = len(v)
            self.assertTrue(all(math.isfinite(x) for x in v), name)
            mean = math.fsum(v) / n
            std = math.sqrt(math.fsum((x - mean) ** 2 for x in v) / n)
            self.assertLess(abs(mean), 5 * 0.02 / math.sqrt(n), "%s mean %g" % (name, mean))
            self.assertLess(abs(std / 0.02 - 1), 5 / math.sqrt(2 * n), "%s std %g" % (name, std))
            # Tails: about 4.55% beyond 2 sigma.
            tail = sum(abs(x) > 0.04 for x in v) / n
            self.assertLess(abs(tail - 0.0455), 0.006, "%s tail %g" % (name, tail))


# ---------------------------------------------------------------------------------------------
# 4. Bit-exact values against the reference

ROWS = 20
SEED = 0x0123456789ABCDEF


class TestPhiloxReference(unittest.TestCase):
    def test_known_answers(self):
        self.assertEqual(philox4x32_10((0, 0, 0, 0), (0, 0)),
                         (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8))
        self.assertEqual(philox4x32_10((MASK32,) * 4, (MASK32, MASK32)),
                         (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD))

    def test_fnv1a(self):
        self.assertEqual(fnv1a32(""), 0x811C9DC5)
        self.assertEqual(fnv1a32("a"), 0xE40C292C)
        self.assertEqual(fnv1a32("foobar"), 0xBF9CF968)

    def test_float32_rounding(self):
        self.assertEqual(f32_bits(1.5), 0x3FC00000)
        self.assertEqual(f32(0.1), 0.10000000149011612)
        self.assertEqual(bf16_bits(1.0), 0x3F80)
        self.assertEqual(bf16_bits(bits_f32(0x3F808000)), 0x3F80)   # tie: to even
        self.assertEqual(bf16_bits(bits_f32(0x3F818000)), 0x3F82)   # tie: to even (up)
        self.assertEqual(bf16_bits(bits_f32(0x3F808001)), 0x3F81)
        self.assertEqual(f16_bits(1.5), 0x3E00)


class TestValues(Base):
    def setUp(self):
        self.daemon = X

    def values(self, seed=SEED, dtype="float32", code="I", mesh=None):
        cfg = {"rows": ROWS, "lo": -0.25, "hi": 3}
        kw = {}
        if mesh is not None:
            kw["mesh_id"] = self.mesh(*mesh).mesh_id
        b = self.built("initcheck", cfg, materialize={"seed": seed, "dtype": dtype}, **kw)
        return b, self.assemble(b, code)

    def test_uniform_constant_ones_zeros_exact(self):
        b, full = self.values()
        self.assertTrue(b.info.reset_after_materialization)
        u = full["u"]
        self.assertEqual(len(u), ROWS * 37)   # 740 elements
        ref = ref_uniform("u", SEED, len(u), -1, 1)
        self.assertEqual(u, [f32_bits(x) for x in ref])
        self.assertTrue(all(-1 <= bits_f32(x) < 1 for x in u))
        ref2 = ref_uniform("u2", SEED, ROWS * 5, -0.25, 3)
        self.assertEqual(full["u2"], [f32_bits(x) for x in ref2])
        self.assertEqual(full["c"], [f32_bits(1.5)] * (ROWS * 3))
        self.assertEqual(full["o"], [f32_bits(1.0)] * 7)
        self.assertEqual(full["z"], [0] * 4)
        nrm = [bits_f32(x) for x in full["nrm"]]
        self.assertEqual(full["nrm"],
                         [f32_bits(x) for x in ref_normal("nrm", SEED, len(nrm), 0.5, 2.0)])

    def test_uniform_sharded_and_other_dtypes(self):
        # u is tp-sharded on dim 1: 37 over tp=3 is 13, 13, 11; nrm on dim 0: 20 is 7, 7, 6.
        mesh = ([("tp", 3)], [], [2, 0, 1])
        b, full = self.values(mesh=mesh)
        self.assertEqual([list(s.slices[0].local_shape) for s in b.shards],
                         [[ROWS, 13], [ROWS, 13], [ROWS, 11]])
        ref = ref_uniform("u", SEED, ROWS * 37, -1, 1)
        self.assertEqual(full["u"], [f32_bits(x) for x in ref])
        _, bf = self.values(dtype="bfloat16", code="H", mesh=mesh)
        self.assertEqual(bf["u"], [bf16_bits(x) for x in ref])
        self.assertEqual(bf["c"], [bf16_bits(1.5)] * (ROWS * 3))
        _, h = self.values(dtype="fp16", code="H")
        self.assertEqual(h["u"], [f16_bits(x) for x in ref])
        self.assertEqual(h["o"], [f16_bits(1.0)] * 7)

    def test_largest_seed(self):
        seed = (1 << 64) - 1
        _, full = self.values(seed=seed)
        self.assertEqual(full["u"], [f32_bits(x) for x in ref_uniform("u", seed, ROWS * 37, -1, 1)])

    def test_seed_high_bits_matter(self):
        _, a = self.values(seed=SEED)
        _, b = self.values(seed=SEED & MASK32)
        self.assertLess(sum(x == y for x, y in zip(a["u"], b["u"])), 10)
        ref = ref_uniform("u", SEED & MASK32, ROWS * 37, -1, 1)
        self.assertEqual(b["u"], [f32_bits(x) for x in ref])


# ---------------------------------------------------------------------------------------------
# 5. Handout

class TestHandout(Base):
    def one(self, writable=False, **mat):
        b = self.built(GE, GE_SMALL, materialize=mat, writable=writable)
        s = b.shards[0]
        self.assertTrue(s.token)
        return b, s

    def test_read_values(self):
        b, s = self.one(seed=99)
        (shard, fd), = self.fetch(b).values()
        mm = SC.map_readonly(fd, s.size_bytes)
        self.addCleanup(mm.close)
        sl = s.slices[1]
        self.assertEqual(sl.parameter, "down_proj")
        mv = memoryview(mm)[sl.byte_offset:sl.byte_offset + sl.byte_length].cast("f")
        try:
            vals = mv.tolist()
            if torch is not None:
                t = torch.frombuffer(mm, dtype=torch.float32, count=len(vals),
                                     offset=sl.byte_offset)
                self.assertEqual(t.tolist(), vals)
                del t
        finally:
            mv.release()
        self.assertEqual(len(vals), 4 * 4 * 8)
        self.assertEqual(vals, ref_normal("down_proj", 99, len(vals), 0, 0.02), "down_proj")

    def test_readonly_descriptor(self):
        b, s = self.one()
        (shard, fd), = self.fetch(b).values()
        with self.assertRaises(PermissionError):
            mmap.mmap(fd, s.size_bytes, flags=mmap.MAP_SHARED,
                      prot=mmap.PROT_READ | mmap.PROT_WRITE)
        with self.assertRaises(OSError):
            os.ftruncate(fd, 0)
        with self.assertRaises(OSError):
            os.ftruncate(fd, s.size_bytes * 2)
        with self.assertRaises(OSError):
            os.write(fd, b"x")
        self.assertEqual(os.fstat(fd).st_size, s.size_bytes)
        seals = fcntl.fcntl(fd, getattr(fcntl, "F_GET_SEALS", 1034))
        # F_SEAL_SEAL, F_SEAL_SHRINK, F_SEAL_GROW, F_SEAL_WRITE: immutable for everyone.
        self.assertEqual(seals & 0x000f, 0x000f, "read-only memfd seals: %#x" % seals)
        # A process that may ignore the inode's mode 0400 (root: CAP_DAC_OVERRIDE) reopens the
        # descriptor writable, but the write seal refuses it every write.
        self.assertEqual(os.geteuid(), 0, "this check needs root")
        rw = os.open("/proc/self/fd/%d" % fd, os.O_RDWR)
        self.addCleanup(os.close, rw)
        with self.assertRaises(PermissionError):
            os.pwrite(rw, b"x", 0)
        with self.assertRaises(PermissionError):
            mmap.mmap(rw, s.size_bytes, flags=mmap.MAP_SHARED,
                      prot=mmap.PROT_READ | mmap.PROT_WRITE)
        # Copy-on-write stays the trainer's way to change its own copy.
        cow = mmap.mmap(rw, s.size_bytes, flags=mmap.MAP_PRIVATE,
                        prot=mmap.PROT_READ | mmap.PROT_WRITE)
        self.addCleanup(cow.close)
        first = os.pread(fd, 1, 0)
        cow[0:1] = bytes([first[0] ^ 0xff])
        self.assertEqual(os.pread(fd, 1, 0), first)

    def test_writable_descriptor(self):
        # Only a build made writable hands out writable descriptors (test_mappings.py has the
        # refusal); its bytes are every user's.
        b, s = self.one(writable=True)
        self.assertTrue(b.writable)
        (_, fd_ro), = self.fetch(b).values()
        view = SC.map_readonly(fd_ro, s.size_bytes)
        self.addCleanup(view.close)
        (_, fd_w), = self.fetch(b, writable=True).values()
        w = SC.map_writable(fd_w, s.size_bytes)
        self.addCleanup(w.close)
        off = s.slices[0].byte_offset
        pattern = b"\x01\x02\x03\x04\x05\x06\x07\x08"
        w[off:off + 8] = pattern
        self.assertEqual(view[off:off + 8], pattern)
        # A descriptor fetched afterwards sees it too: one memory.
        (_, fd2), = self.fetch(b).values()
        self.assertEqual(os.pread(fd2, 8, off), pattern)
        # Sealed: even the writable descriptor cannot resize, nor seal writes off for others.
        seals = fcntl.fcntl(fd_w, getattr(fcntl, "F_GET_SEALS", 1034))
        self.assertEqual(seals & 0x000f, 0x0007, "writable memfd seals: %#x" % seals)
        with self.assertRaises(PermissionError):
            fcntl.fcntl(fd_w, getattr(fcntl, "F_ADD_SEALS", 1033), 0x0010)  # F_SEAL_FUTURE_WRITE
        with self.assertRaises(OSError):
            os.ftruncate(fd_w, 0)
        with self.assertRaises(OSError):
            os.ftruncate(fd_w, s.size_bytes + 4096)
        self.assertEqual(os.fstat(fd_w).st_size, s.size_bytes)

    def test_bad_tokens(self):
        b, s = self.one()
        with SC.ShardClient(b.shard_socket, P) as sc:
            reply, fds = sc.request(["not-a-token"])
            self.assertEqual((reply.code, len(fds)), (STATUS_NOT_FOUND, 0), reply.message)
            self.assertEqual(reply.message, "shard token 1 of 1 is unknown or released")
            self.assertEqual(list(reply.sizes), [])
            # All or nothing; the connection lives on after a refused request.
            wrong = s.token[:-1] + ("0" if s.token[-1] != "0" else "1")
            reply, fds = sc.request([s.token, wrong])
            self.assertEqual((reply.code, len(fds)), (STATUS_NOT_FOUND, 0), reply.message)
            self.assertNotIn(s.token, reply.message)
            reply, fds = sc.request([s.token])
            for fd in fds:
                os.close(fd)
            self.assertEqual((reply.code, len(fds)), (0, 1))

    def test_too_many_tokens(self):
        b, s = self.one()
        with SC.ShardClient(b.shard_socket, P) as sc:
            reply, fds = sc.request([s.token] * 254)
            for fd in fds:
                os.close(fd)
            self.assertEqual((reply.code, len(fds)), (3, 0), reply.message)   # INVALID_ARGUMENT
            reply, fds = sc.request([s.token] * 253)
            for fd in fds:
                os.close(fd)
            self.assertEqual((reply.code, len(fds)), (0, 253), reply.message)

    def test_release(self):
        b = self.assertOk(self.build(GE, GE_SMALL, materialize={"seed": 5})).build
        s = b.shards[0]
        reply, fds = SC.fetch(b.shard_socket, P, [s.token])
        for fd in fds:
            self.addCleanup(os.close, fd)
        self.assertEqual((reply.code, len(fds)), (0, 1))
        mm = SC.map_readonly(fds[0], s.size_bytes)
        self.addCleanup(mm.close)
        before = mm[:s.size_bytes]
        in_use = self.state()[1]
        self.release(b.build_id)
        self.assertEqual(self.state()[1], in_use - s.size_bytes)
        reply, fds = SC.fetch(b.shard_socket, P, [s.token])
        for fd in fds:
            os.close(fd)
        self.assertEqual((reply.code, len(fds)), (STATUS_NOT_FOUND, 0), reply.message)
        # The mapping made before the release stays readable, with the same bytes.
        self.assertEqual(mm[:s.size_bytes], before)
        sl = s.slices[0]
        vals = array.array("f", mm[sl.byte_offset:sl.byte_offset + sl.byte_length]).tolist()
        self.assertEqual(vals, ref_normal("gate_up_proj", 5, len(vals), 0, 0.02),
                         "gate_up_proj after release")


if __name__ == "__main__":
    unittest.main(verbosity=2)
