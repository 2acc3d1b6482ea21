#!/usr/bin/python3
"""Expression inits and trunc_normal end to end (docs/registry.md "init", docs/semantics.md
Build failures and Values).

A real familyd (--host-devices 8, one node) loads a registry whose parameters use init
expressions (config fields, sqrt, fan_in) and trunc_normal. GetFamily shows the canonical
texts; Builds with no mesh and on a 4-way tp mesh are materialised and read from the shard
socket's memfds, as a trainer would:
- the normal parameters' values are bit for bit those of the independent Python reference of
  test_build.py with the std the expression means, computed here in Python (double), and their
  sample std is within tolerance of it;
- trunc_normal's values all lie within [a, b], match an independent inverse-CDF computation with
  Python's statistics.NormalDist to float32 precision, and their mean and std are the truncated
  distribution's;
- the sharded build's slices are exactly the 1-rank build's elements (layout invariance);
- the Build-time failures answer INVALID_ARGUMENT with reason INIT and the documented texts.
"""

import array
import math
import os
import shutil
import statistics
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402
import test_build as TB  # noqa: E402  (the Philox/FNV reference, the request and shard helpers)

FAMILY = "initexpr"
REGISTRY_YAML = """\
families:
  - name: initexpr
    baseline: itest.initexpr.Block
    default_variant: plain
    parallel_axis: tp
    variants:
      plain:
        constructor: itest.initexpr.Plain
        accepts: [config, module, module_fqn, context]
    parameters:
      proj:
        shape: [rows, cols]
        placements: {tp: shard(0)}
        init: {normal: {std: "initializer_range/sqrt(2 * num_layers)"}}
      fan:
        shape: [rows, cols, 3]
        placements: {tp: shard(1)}
        init: {normal: {mean: 0, std: "1 / sqrt(fan_in)"}}
      trunc:
        shape: [rows, cols]
        placements: {tp: shard(-1)}
        init: {trunc_normal: {mean: 0.1, std: 0.5, a: "-(20 * initializer_range)", b: upper}}
  - name: fan1d
    baseline: itest.initexpr.Fan1d
    default_variant: plain
    variants:
      plain:
        constructor: itest.initexpr.Fan1dPlain
        accepts: [config]
    parameters:
      bias:
        shape: [rows]
        init: {uniform: {low: "-1 / sqrt(fan_in)", high: "1 / sqrt(fan_in)"}}
"""

CFG = {"rows": 64, "cols": 96, "num_layers": 12, "initializer_range": 0.02, "upper": 0.6}
SEED = 20261207
D = None
TMP = None


def setUpModule():
    global D, TMP
    TB.P = H.Protos()
    TMP = H.short_tmpdir("fd-initexpr-")
    reg = os.path.join(TMP, "registry")
    os.makedirs(reg)
    with open(os.path.join(reg, "initexpr.yaml"), "w") as f:
        f.write(REGISTRY_YAML)
    D = H.Daemon(registry=reg, host_devices=8, node_name="itest-initexpr", protos=TB.P,
                 # Normal pages whatever the machine's hugetlb pool: the handout's sizes are then
                 # the layout's (test_build.py's fetch checks them).
                 extra_args=["--build-grace-ms", "0", "--huge-pages", "never"])
    D.start()


def tearDownModule():
    try:
        if D is not None:
            D.stop()
            TB.check_sanitizers(D)
    finally:
        if D is not None:
            D.cleanup()
        if TMP:
            shutil.rmtree(TMP, ignore_errors=True)


def floats(bits):
    return array.array("f", array.array("I", bits).tobytes()).tolist()


def normal_cdf(x):
    return 0.5 * math.erfc(-x / math.sqrt(2))


def ref_trunc(name, seed, n, mean, std, a, b):
    """Independent: u = (x0 + 1/2) 2^-32, p = Phi(alpha) + u (Phi(beta) - Phi(alpha)) (bounds
    above the mean mirrored), z = NormalDist().inv_cdf(p), mean + sign std z clamped."""
    alpha, beta, sign = (a - mean) / std, (b - mean) / std, 1.0
    if alpha > 0:
        alpha, beta, sign = -beta, -alpha, -1.0
    lo = normal_cdf(alpha)
    span = normal_cdf(beta) - lo
    nd = statistics.NormalDist()
    out = []
    for x0, _, _, _ in TB.philox_words(name, seed, n):
        p = lo + span * ((x0 + 0.5) * 2.0 ** -32)
        out.append(min(max(TB.f32(mean + sign * std * nd.inv_cdf(p)), TB.f32(a)), TB.f32(b)))
    return out


def trunc_moments(mean, std, a, b):
    al, be = (a - mean) / std, (b - mean) / std
    pa = math.exp(-al * al / 2) / math.sqrt(2 * math.pi)
    pb = math.exp(-be * be / 2) / math.sqrt(2 * math.pi)
    z = normal_cdf(be) - normal_cdf(al)
    m = mean + std * (pa - pb) / z
    var = std * std * (1 + (al * pa - be * pb) / z - ((pa - pb) / z) ** 2)
    return m, math.sqrt(var)


class Base(TB.Base):
    @property
    def d(self):
        return D


class TestGetFamily(Base):
    def test_canonical_texts(self):
        f = self.assertOk(self.call("familyd.v1.FamilyService/GetFamily", family=FAMILY))
        got = {p.name: p.init for p in f.parameters}
        self.assertEqual(got, {
            "proj": "normal(mean=0, std=initializer_range / sqrt(2 * num_layers))",
            "fan": "normal(mean=0, std=1 / sqrt(fan_in))",
            "trunc": "trunc_normal(mean=0.1, std=0.5, a=-(20 * initializer_range), b=upper)",
        })


class TestValues(Base):
    def full(self, mesh_id=""):
        b = self.built(FAMILY, CFG, mesh_id=mesh_id, materialize={"seed": SEED})
        return self.assemble(b, "I")

    def test_values_and_layout_invariance(self):
        whole = self.full()
        mesh = self.mesh([("dp", 2), ("tp", 4)])
        sharded = self.full(mesh.mesh_id)
        # Layout invariance: every slice of the 4-rank build is the 1-rank build's elements.
        for name in ("proj", "fan", "trunc"):
            self.assertTrue(whole[name] == sharded[name], "%s differs between layouts" % name)

        n = CFG["rows"] * CFG["cols"]
        # proj: std = initializer_range / sqrt(2 * num_layers), in Python's double.
        std = CFG["initializer_range"] / math.sqrt(2 * CFG["num_layers"])
        self.assertEqual(whole["proj"], [TB.f32_bits(x) for x in TB.ref_normal("proj", SEED, n, 0.0, std)])
        v = floats(whole["proj"])
        sample = statistics.pstdev(v)
        self.assertLess(abs(sample / std - 1), 5 / math.sqrt(2 * n), "proj std %g, want %g" % (sample, std))

        # fan: fan_in of [rows, cols, 3] is cols * 3 (torch's: dim 1 times the receptive field).
        std = 1 / math.sqrt(CFG["cols"] * 3)
        self.assertEqual(whole["fan"], [TB.f32_bits(x) for x in TB.ref_normal("fan", SEED, 3 * n, 0.0, std)])
        sample = statistics.pstdev(floats(whole["fan"]))
        self.assertLess(abs(sample / std - 1), 5 / math.sqrt(6 * n), "fan std %g, want %g" % (sample, std))

        # trunc: a = -(20 * 0.02) = -0.4, b = 0.6 around mean 0.1, std 0.5.
        a, b = -(20 * CFG["initializer_range"]), 0.6
        t = floats(whole["trunc"])
        self.assertTrue(all(TB.f32(a) <= x <= TB.f32(b) for x in t), "trunc values outside [a, b]")
        TB.assert_close(self, t, ref_trunc("trunc", SEED, n, 0.1, 0.5, a, b), 2e-7, 1e-7, "trunc")
        want_mean, want_std = trunc_moments(0.1, 0.5, a, b)
        mean = statistics.fmean(t)
        self.assertLess(abs(mean - want_mean), 5 * want_std / math.sqrt(n), "trunc mean %g" % mean)
        self.assertLess(abs(statistics.pstdev(t) / want_std - 1), 0.02, "trunc std")


class TestErrors(Base):
    def assertInitFails(self, family, cfg, message, reason="INIT"):
        res = self.build(family, cfg, materialize={"seed": 1})
        self.assertEqual((res.code, res.message), ("INVALID_ARGUMENT", message), "%r" % res)
        self.assertErrorInfo(res, reason)

    def test_not_finite(self):
        self.assertInitFails(FAMILY, dict(CFG, num_layers=0),
                             "parameter 'proj': init std 'initializer_range / sqrt(2 * num_layers)' "
                             "is not finite")

    def test_sqrt_of_negative(self):
        self.assertInitFails(FAMILY, dict(CFG, num_layers=-1),
                             "parameter 'proj': init std 'initializer_range / sqrt(2 * num_layers)' "
                             "takes the square root of -2")

    def test_negative_std(self):
        self.assertInitFails(FAMILY, dict(CFG, initializer_range=-0.02),
                             "parameter 'proj': init std must not be negative, got "
                             + repr(-0.02 / math.sqrt(24)))

    def test_missing_field(self):
        cfg = dict(CFG)
        del cfg["num_layers"]
        self.assertInitFails(FAMILY, cfg, "parameter 'proj' needs config field 'num_layers'", "CONFIG")

    def test_bounds(self):
        self.assertInitFails(FAMILY, dict(CFG, upper=-1),
                             "parameter 'trunc': init bound a must be less than b, got a=-0.4, b=-1")

    def test_fans_of_one_dimension(self):
        self.assertInitFails("fan1d", {"rows": 8},
                             "parameter 'bias': init low '-1 / sqrt(fan_in)' uses fan_in, which needs "
                             "at least 2 dimensions; the parameter has 1")


if __name__ == "__main__":
    unittest.main()
