#!/usr/bin/python3
"""Validate's shared parameters (docs/semantics.md, Validate step 6) through familyd.Client.

A model ties a parameter across builds of different families (an embedding's `weight` used as
an output head's `weight`): the real daemon, layout-only builds of two families on one tp mesh,
and the Python client's validate(shared_parameters=...). Equal shape, placements and dtype are
ok; a different shape (another config), placements (another family's layout), dtype
(parameter_dtypes), an unknown build and an unknown parameter name are SHARED_PARAMETER_CONFLICT
violations with the documented texts; malformed lists are INVALID_ARGUMENT errors. Then
`familyctl validate` with a model file's sharedParameters: the table and --json, the loader's
usage errors (exit 2) and the daemon's refusal (exit 1).
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402

sys.path.insert(0, os.path.join(H.SOURCE_ROOT, "client", "python"))
os.environ.setdefault("FAMILYD_DESCRIPTORS", H.descriptor_set_path())
import familyd  # noqa: E402

FAMILY_YAML = """\
name: {name}
baseline: itest.tied.{cls}
default_variant: plain
parallel_axis: tp
variants:
  plain:
    constructor: itest.tied.{cls}Plain
    accepts: [config]
parameters:
  weight:
    shape: [vocab_size, hidden_size]
    placements: {{tp: shard({dim})}}
    init: {{normal: {{std: 0.02}}}}
  bias:
    shape: [vocab_size]
    init: zeros
"""
CONFIG = {"vocab_size": 32, "hidden_size": 8}
CONFLICT = "SHARED_PARAMETER_CONFLICT"

D = None
C = None
TMP = None


def setUpModule():
    global D, C, TMP
    TMP = tempfile.mkdtemp(prefix="familyd-vshared-")
    for name, cls, dim in (("tied_embedding", "Embedding", 0), ("tied_head", "Head", 0),
                           ("tied_columns", "Columns", 1)):
        with open(os.path.join(TMP, name + ".yaml"), "w") as f:
            f.write(FAMILY_YAML.format(name=name, cls=cls, dim=dim))
    D = H.Daemon(registry=TMP)
    D.start()
    C = familyd.Client(D.socket, timeout=30)


def tearDownModule():
    if C is not None:
        C.close()
    if D is not None:
        try:
            D.stop()
        finally:
            D.cleanup()
    if TMP:
        shutil.rmtree(TMP, ignore_errors=True)


class TestValidateShared(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.mesh = C.create_mesh([("dp", 2), ("tp", 4)]).mesh_id

        def build(family, config=CONFIG, **kw):
            return C.build(family, config=config, mesh_id=cls.mesh, materialize=False,
                           map_shards=False, private_build=True, **kw)

        cls.embed = build("tied_embedding")
        cls.head = build("tied_head")                              # same shape and layout
        cls.wide = build("tied_head", config={"vocab_size": 48, "hidden_size": 8})
        cls.columns = build("tied_columns")                        # weight shard(1)
        cls.bf16 = build("tied_head", parameter_dtypes={"weight": "bfloat16"})

    def validate(self, shared, boundaries=()):
        r = C.validate(list(boundaries), {"mesh_id": self.mesh}, shared_parameters=shared)
        return r.ok, [(list(v.fqns), v.reason, v.message) for v in r.violations]

    def tie(self, other, parameter="weight", fqn="head.weight"):
        return [[{"fqn": "embed.weight", "build": self.embed, "parameter": "weight"},
                 (fqn, other, parameter)]]

    def test_equal_ties_are_ok(self):
        self.assertEqual(self.validate(self.tie(self.head)), (True, []))
        # every spelling of a use: dicts with build or build_id, tuples, messages
        P = D.protos
        use = P.cls("familyd.v1.SharedParameterUse")
        shared = [
            [{"fqn": "embed.weight", "build_id": self.embed.id, "parameter": "weight"},
             use(fqn="head.weight", build_id=self.head.id, parameter="weight"),
             ("lm.weight", self.head.message, "weight")],
            P.cls("familyd.v1.SharedParameter")(uses=[
                use(fqn="embed.bias", build_id=self.embed.id, parameter="bias"),
                use(fqn="head.bias", build_id=self.head.id, parameter="bias")]),
        ]
        self.assertEqual(self.validate(shared), (True, []))
        req = C.validate_request([], None, shared)
        self.assertEqual([len(s.uses) for s in req.shared_parameters], [3, 2])
        self.assertEqual(req.shared_parameters[0].uses[2].build_id, self.head.id)

    def test_different_shape(self):
        self.assertEqual(self.validate(self.tie(self.wide)), (False, [
            (["embed.weight", "head.weight"], CONFLICT,
             "shared parameter 'head.weight' has shape [48, 8] but 'embed.weight' has [32, 8]")]))

    def test_different_placements(self):
        self.assertEqual(self.validate(self.tie(self.columns)), (False, [
            (["embed.weight", "head.weight"], CONFLICT,
             "shared parameter 'head.weight' has placements [('tp', 1)] but 'embed.weight' has "
             "[('tp', 0)]")]))
        # a replicated parameter of another shape: both, shape first
        self.assertEqual([m for _, _, m in self.validate(self.tie(self.head, "bias",
                                                                  "head.bias"))[1]], [
            "shared parameter 'head.bias' has shape [32] but 'embed.weight' has [32, 8]",
            "shared parameter 'head.bias' has placements [] but 'embed.weight' has "
            "[('tp', 0)]"])

    def test_different_dtype(self):
        self.assertEqual(self.validate(self.tie(self.bf16)), (False, [
            (["embed.weight", "head.weight"], CONFLICT,
             "shared parameter 'head.weight' has dtype 'bfloat16' but 'embed.weight' has "
             "'float32'")]))

    def test_unknown_build_and_parameter(self):
        self.assertEqual(self.validate(self.tie("bld-gone")), (False, [
            (["embed.weight", "head.weight"], CONFLICT,
             "shared parameter 'head.weight' is in build 'bld-gone', which is not found")]))
        self.assertEqual(self.validate(self.tie(self.head, "nope")), (False, [
            (["embed.weight", "head.weight"], CONFLICT,
             "shared parameter 'head.weight' is not a parameter 'nope' of build '%s'"
             % self.head.id)]))
        # an unknown first use: reported once, with its fqn alone; the rest is skipped
        shared = [[("embed.weight", self.embed, "nope"), ("head.weight", "bld-gone", "weight"),
                   ("x", self.wide, "weight")]]
        self.assertEqual(self.validate(shared), (False, [
            (["embed.weight"], CONFLICT,
             "shared parameter 'embed.weight' is not a parameter 'nope' of build '%s'"
             % self.embed.id)]))

    def test_order_after_the_boundaries(self):
        shared = [[("a", self.embed, "weight"), ("b", self.wide, "weight"),
                   ("c", self.bf16, "weight")],
                  [("d", self.embed, "weight"), ("e", self.columns, "weight")]]
        ok, v = self.validate(shared, [{"fqns": ["gone"], "build_id": "bld-gone"},
                                       {"fqns": ["embed"], "build": self.embed}])
        self.assertFalse(ok)
        self.assertEqual([(f, r) for f, r, _ in v], [
            (["gone"], "UNKNOWN_BUILD"), (["a", "b"], CONFLICT), (["a", "c"], CONFLICT),
            (["d", "e"], CONFLICT)])

    def refused(self, shared, reason, field, message):
        with self.assertRaises(familyd.FamilydError) as cm:
            C.validate([{"fqns": ["embed"], "build": self.embed}], None,
                       shared_parameters=shared)
        e = cm.exception
        self.assertEqual((e.code_name, e.reason, e.metadata.get("field"), e.message),
                         ("INVALID_ARGUMENT", reason, field, message))

    def test_malformed(self):
        good = ("f", self.embed, "weight")
        self.refused([[good]], "BAD_REQUEST", "shared_parameters.uses",
                     "a shared parameter has fewer than two uses")
        self.refused([[good, good], []], "BAD_REQUEST", "shared_parameters.uses",
                     "a shared parameter has fewer than two uses")
        for i, field in enumerate(("fqn", "build_id", "parameter")):
            use = ["f", self.embed.id, "weight"]
            use[i] = ""
            self.refused([[good, tuple(use)]], "BAD_REQUEST", "shared_parameters.uses." + field,
                         "shared_parameters.uses.%s is required" % field)

    def test_limits(self):
        good = ("f", self.embed, "weight")
        # at the limits: answered
        self.assertEqual(self.validate([[good] * 64]), (True, []))
        self.assertEqual(self.validate([[good, good]] * 4096), (True, []))
        self.assertEqual(self.validate([[good, ("f" * 1024, self.embed, "weight")]]), (True, []))
        # past them: refused
        self.refused([[good] * 65], "LIMIT", "shared_parameters.uses",
                     "a shared parameter has more than 64 uses")
        self.refused([[good, good]] * 4097, "LIMIT", "shared_parameters",
                     "shared_parameters has more than 4096 entries")
        self.refused([[good, ("f" * 1025, self.embed, "weight")]], "LIMIT",
                     "shared_parameters.uses.fqn",
                     "shared_parameters.uses.fqn is longer than 1024 bytes")
        self.refused([[good, ("f", "b" * 257, "weight")]], "LIMIT",
                     "shared_parameters.uses.build_id",
                     "shared_parameters.uses.build_id is longer than 256 bytes")
        self.refused([[good, ("f", self.embed, "p" * 257)]], "LIMIT",
                     "shared_parameters.uses.parameter",
                     "shared_parameters.uses.parameter is longer than 256 bytes")
        # the daemon still answers
        self.assertEqual(self.validate(self.tie(self.head)), (True, []))


@unittest.skipUnless(H.familyctl_bin(), "familyctl is not built")
class TestFamilyctlShared(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.mesh = C.create_mesh([("dp", 2), ("tp", 4)]).mesh_id
        build = lambda family: C.build(family, config=CONFIG, mesh_id=cls.mesh,
                                       materialize=False, map_shards=False,
                                       private_build=True).id
        cls.embed, cls.columns = build("tied_embedding"), build("tied_columns")

    def ctl(self, model, *args):
        path = os.path.join(TMP, "model.json")
        with open(path, "w") as f:
            f.write(model if isinstance(model, str) else json.dumps(model))
        env = dict(os.environ)
        env.pop("FAMILYD_SOCKET", None)
        p = subprocess.run([H.familyctl_bin(), "--socket", D.socket, "validate", path]
                           + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           stdin=subprocess.DEVNULL, timeout=60, env=env)
        return p.returncode, p.stdout.decode(), p.stderr.decode(), path

    def model(self, uses, key="sharedParameters"):
        return {"boundaries": [{"fqns": ["embed"], "buildId": self.embed}],
                "context": {"meshId": self.mesh}, key: [{"uses": uses}]}

    def test_violations_and_ok(self):
        uses = [{"fqn": "embed.weight", "buildId": self.embed, "parameter": "weight"},
                {"fqn": "cols.weight", "build_id": self.columns, "parameter": "weight"}]
        rc, out, err, _ = self.ctl(self.model(uses), "--json")
        self.assertEqual(rc, 1, out + err)
        self.assertEqual(json.loads(out), {"ok": False, "violations": [
            {"fqns": ["embed.weight", "cols.weight"], "reason": CONFLICT,
             "message": "shared parameter 'cols.weight' has placements [('tp', 1)] but "
                        "'embed.weight' has [('tp', 0)]"}]})
        rc, out, err, _ = self.ctl(self.model(uses))
        self.assertEqual(rc, 1, out + err)
        self.assertIn("embed.weight,cols.weight", out)
        self.assertIn(CONFLICT, out)
        uses[1] = {"fqn": "again.weight", "buildId": self.embed, "parameter": "weight"}
        rc, out, err, _ = self.ctl(self.model(uses, key="shared_parameters"))
        self.assertEqual((rc, out), (0, "ok\n"), err)

    def test_loader_and_daemon_errors(self):
        use = {"fqn": "embed.weight", "buildId": self.embed, "parameter": "weight"}
        for model, where in (
                (self.model([use, dict(use, dtype="x")]),
                 "sharedParameters[0].uses[1]: unknown key 'dtype' (fqn, buildId, parameter)"),
                (self.model([use, dict(use, fqn=3)]),
                 "sharedParameters[0].uses[1]: fqn must be a string"),
                (self.model([use, "x"]), "sharedParameters[0].uses[1]: must be an object"),
                (dict(self.model([use]), sharedParameters={}), "sharedParameters must be a list"),
                (dict(self.model([use]), sharedParameters=[{"use": []}]),
                 "sharedParameters[0]: unknown key 'use' (uses)")):
            rc, out, err, path = self.ctl(model)
            self.assertEqual((rc, out), (2, ""), err)
            self.assertIn("%s: %s" % (path, where), err)
        rc, out, err, _ = self.ctl(self.model([use]))
        self.assertEqual((rc, out), (1, ""), err)
        self.assertIn("a shared parameter has fewer than two uses", err)


if __name__ == "__main__":
    unittest.main()
