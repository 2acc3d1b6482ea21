#!/usr/bin/python3
"""familyctl validate and the Python module's Client.validate against the real daemon.

Two builds of grouped_experts: A without a mesh (resolved with ep=1), B on a dp=2,ep=4 mesh.
Checks: a clean model (aliases, an applied layout equal to the build's, one build shared by two
boundaries) exits 0 and prints `ok`; a model with an unknown build id and an ep mismatch exits
1 with both violations in the table, in the order of the boundaries; --json parses ({"ok":
false, "violations": [...]}, same exit status); an applied layout with other placements
(LAYOUT_CONFLICT); proto field names (build_id, applied_layout) and the file's context; the
daemon's refusal (unknown mesh: exit 1, stderr); usage errors (exit 2, nothing sent), a
duplicate key or a syntax error named with the file, line and column; -o/--noheadings/--raw over
the violation table; two neighbouring embeddings on a sequence-parallel mesh whose activation
layouts disagree (ACTIVATION_NEIGHBOUR_MISMATCH); no daemon (exit 3); --help. Then Client.validate with dicts, tuples, Build
objects and contexts.
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

PYDIR = os.path.join(H.SOURCE_ROOT, "client", "python")
REGISTRY = os.path.join(H.SOURCE_ROOT, "deploy", "registry")
CTL = H.familyctl_bin()
CONFIG = {"num_experts": 8, "hidden_size": 16, "moe_intermediate_size": 8,
          "initializer_range": 0.02}
KV = ["%s=%s" % (k, v) for k, v in CONFIG.items()]

D = None
TMP = None
MESH = None         # dp=2,ep=4 over ranks 0-7
A = None            # build id, no mesh
B = None            # build id, on MESH
LAYOUT_A = None     # the builds' layouts as proto3 JSON
LAYOUT_B = None


def ctl(*args, timeout=60):
    argv = [CTL, "--socket", D.socket] + list(args)
    env = dict(os.environ)
    env.pop("FAMILYD_SOCKET", None)
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       stdin=subprocess.DEVNULL, timeout=timeout, env=env)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


def ctl_ok(*args):
    rc, out, err = ctl(*args)
    if rc != 0:
        raise AssertionError("familyctl %s: rc=%d\nstdout:\n%s\nstderr:\n%s"
                             % (" ".join(args), rc, out, err))
    return out


def applied(layout):
    """What a trainer applies: the build's layout less its outputs (dtype, view, applied)."""
    out = {"parameters": [{"name": p["name"], "shape": [int(d) for d in p["shape"]],
                           "placements": p.get("placements", [])}
                          for p in layout.get("parameters", [])]}
    if layout.get("meshId"):
        out["meshId"] = layout["meshId"]
    return out


def setUpModule():
    global D, TMP, MESH, A, B, LAYOUT_A, LAYOUT_B
    if not CTL or not os.path.exists(CTL):
        raise unittest.SkipTest("familyctl not built")
    TMP = tempfile.mkdtemp(prefix="fd-ctlv-")
    D = H.Daemon(registry=REGISTRY, host_devices=8, node_name="ctlv-node")
    D.start()
    MESH = json.loads(ctl_ok("--json", "mesh", "create", "dp=2,ep=4", "--ranks", "0-7"))["meshId"]
    a = json.loads(ctl_ok("--json", "build", "grouped_experts", *KV))["build"]
    b = json.loads(ctl_ok("--json", "build", "grouped_experts", *KV, "--mesh", MESH))["build"]
    A, LAYOUT_A = a["buildId"], a["info"]["layout"]
    B, LAYOUT_B = b["buildId"], b["info"]["layout"]


def tearDownModule():
    if TMP:
        shutil.rmtree(TMP, ignore_errors=True)
    if D is None:
        return
    try:
        D.stop()
    finally:
        D.cleanup()


def model_file(name, model):
    path = os.path.join(TMP, name)
    with open(path, "w") as f:
        if isinstance(model, str):
            f.write(model)
        else:
            json.dump(model, f, indent=1)
    return path


def table_rows(out):
    """The violation table as [(fqns, reason, message)], checking the header."""
    lines = [l for l in out.splitlines() if l.strip()]
    assert lines and lines[0].split() == ["FQNS", "REASON", "MESSAGE"], out
    rows = []
    for l in lines[1:]:
        fqns, reason, message = l.split(None, 2)
        rows.append((fqns, reason, message.strip()))
    return rows


class TestFamilyctlValidate(unittest.TestCase):
    def test_clean_model_ok(self):
        # No mesh, no context: A was resolved with ep=1, the job's default.
        path = model_file("clean-a.json", {"boundaries": [
            {"fqns": ["layers.0.moe", "model.layers.0.moe"], "buildId": A,
             "appliedLayout": applied(LAYOUT_A)}]})
        rc, out, err = ctl("validate", path)
        self.assertEqual(rc, 0, out + err)
        self.assertEqual(out.strip(), "ok")
        self.assertEqual(err, "")

    def test_clean_model_on_mesh_shared_build(self):
        # B listed in two boundaries (shared parameters, same shapes), aliases, the job's mesh.
        path = model_file("clean-b.json", {"boundaries": [
            {"fqns": ["layers.0.moe", "model.layers.0.moe"], "buildId": B,
             "appliedLayout": applied(LAYOUT_B)},
            {"fqns": ["layers.1.moe"], "buildId": B, "appliedLayout": applied(LAYOUT_B)}]})
        rc, out, err = ctl("validate", path, "--mesh", MESH)
        self.assertEqual(rc, 0, out + err)
        self.assertEqual(out.strip(), "ok")
        rc, out, err = ctl("validate", "--json", path, "--mesh", MESH)
        self.assertEqual(rc, 0, out + err)
        self.assertEqual(json.loads(out), {"ok": True, "violations": []})

    def violations_model(self):
        return model_file("bad.json", {"boundaries": [
            {"fqns": ["layers.0.moe"], "buildId": "bld-does-not-exist"},
            {"fqns": ["layers.1.moe", "model.layers.1.moe"], "buildId": A,
             "appliedLayout": applied(LAYOUT_A)}]})

    def test_violations_table(self):
        rc, out, err = ctl("validate", self.violations_model(), "--ep", "4")
        self.assertEqual(rc, 1, out + err)
        rows = table_rows(out)
        self.assertEqual([r[1] for r in rows], ["UNKNOWN_BUILD", "AXIS_SIZE_MISMATCH"], out)
        self.assertEqual(rows[0][0], "layers.0.moe")
        self.assertEqual(rows[0][2], "build 'bld-does-not-exist' not found")
        self.assertEqual(rows[1][0], "layers.1.moe,model.layers.1.moe")
        self.assertIn("family at ('layers.1.moe', 'model.layers.1.moe') was constructed with "
                      "ep=1, job requires 4", rows[1][2])

    def test_violations_json(self):
        rc, out, err = ctl("validate", self.violations_model(), "--ep", "4", "--json")
        self.assertEqual(rc, 1, out + err)
        d = json.loads(out)
        self.assertIs(d["ok"], False)
        self.assertEqual([v["reason"] for v in d["violations"]],
                         ["UNKNOWN_BUILD", "AXIS_SIZE_MISMATCH"])
        self.assertEqual(d["violations"][0]["fqns"], ["layers.0.moe"])
        self.assertEqual(d["violations"][1]["fqns"], ["layers.1.moe", "model.layers.1.moe"])
        self.assertEqual(d["violations"][0]["message"], "build 'bld-does-not-exist' not found")
        # The global form of the option works the same.
        rc2, out2, _ = ctl("--json", "validate", self.violations_model(), "--ep", "4")
        self.assertEqual((rc2, json.loads(out2)), (1, d))

    def test_context_from_file_and_proto_names(self):
        # build_id / applied_layout / mesh_id, int64 as a string, the context in the file.
        layout = applied(LAYOUT_A)
        path = model_file("snake.json", {
            "boundaries": [{"fqns": ["layers.1.moe"], "build_id": A, "applied_layout": layout}],
            "context": {"ep_size": "4"}})
        rc, out, err = ctl("validate", "--json", path)
        self.assertEqual(rc, 1, out + err)
        self.assertEqual([v["reason"] for v in json.loads(out)["violations"]],
                         ["AXIS_SIZE_MISMATCH"])
        # The command line's --ep is set over the file's.
        rc, out, err = ctl("validate", path, "--ep", "1")
        self.assertEqual((rc, out.strip()), (0, "ok"), err)

    def test_layout_conflict(self):
        layout = applied(LAYOUT_B)
        for p in layout["parameters"]:
            p["placements"] = [{"axis": "ep", "kind": "shard", "dim": 1}]
        path = model_file("conflict.json", {"boundaries": [
            {"fqns": ["layers.0.moe", "model.layers.0.moe"], "buildId": B,
             "appliedLayout": layout}], "context": {"meshId": MESH}})
        rc, out, err = ctl("validate", path)
        self.assertEqual(rc, 1, out + err)
        rows = table_rows(out)
        self.assertEqual([r[1] for r in rows], ["LAYOUT_CONFLICT"], out)
        self.assertEqual(rows[0][2],
                         "layout at 'layers.0.moe' conflicts with its constructed family layout")

    def test_neighbours(self):
        # Two vocab-parallel embeddings next to each other on a sequence-parallel mesh: the
        # first hands on its piece of the sequence, the second takes whole token ids
        # (semantics.md, Validate 7). The activation layouts are the builds'.
        sp = json.loads(ctl_ok("--json", "mesh", "create", "dp=2,tp=2", "--ranks", "0-3",
                               "--sequence-parallel"))["meshId"]
        kv = ["vocab_size=16", "hidden_size=8", "initializer_range=0.02"]
        emb = json.loads(ctl_ok("--json", "build", "embedding", *kv, "--mesh", sp))["build"]
        ids = [emb["buildId"]] * 2       # one build at both places: its layout is each's
        path = model_file("neighbours.json", {"boundaries": [
            {"fqns": ["embed"], "buildId": ids[0]}, {"fqns": ["head"], "buildId": ids[1]}],
            "context": {"meshId": sp}})
        rc, out, err = ctl("validate", path)
        self.assertEqual(rc, 1, out + err)
        self.assertEqual(table_rows(out), [
            ("embed,head", "ACTIVATION_NEIGHBOUR_MISMATCH",
             "out_dst at 'embed' [{tp: shard(-2)}] disagrees with in_src at 'head' "
             "[{tp: replicate}], the next component")])
        # one inside the other: not neighbours
        path = model_file("inside.json", {"boundaries": [
            {"fqns": ["embed"], "buildId": ids[0]}, {"fqns": ["embed.inner"], "buildId": ids[1]}],
            "context": {"meshId": sp}})
        rc, out, err = ctl("validate", path)
        self.assertEqual((rc, out.strip()), (0, "ok"), err)

    def test_daemon_refusal(self):
        path = model_file("one.json", {"boundaries": [{"fqns": ["x"], "buildId": A}]})
        rc, out, err = ctl("validate", path, "--mesh", "mesh-does-not-exist")
        self.assertEqual(rc, 1, out + err)
        self.assertEqual(out, "")
        self.assertIn("NOT_FOUND", err)

    def test_usage_errors(self):
        good = model_file("good.json", {"boundaries": [{"fqns": ["x"], "buildId": A}]})
        cases = [
            ([], "missing MODEL.json"),
            ([good, good], "unexpected argument"),
            ([os.path.join(TMP, "absent.json")], "No such file"),
            ([model_file("notjson.json", "{boundaries")], "not JSON"),
            ([model_file("list.json", "[]")], "expected an object"),
            ([model_file("nob.json", {"context": {}})], "no \"boundaries\" list"),
            ([model_file("unk.json", {"boundaries": [{"fqn": "x"}]})], "unknown key 'fqn'"),
            ([model_file("fq.json", {"boundaries": [{"fqns": "x"}]})], "fqns must be a list"),
            ([model_file("sh.json", {"boundaries": [{"fqns": ["x"], "appliedLayout": {
                "parameters": [{"name": "w", "shape": [1.5]}]}}]})],
             "boundaries[0].appliedLayout.parameters[0]: shape must be an integer"),
            ([model_file("ctx.json", {"boundaries": [], "context": {"epSize": True}})],
             "epSize must be an integer"),
            ([model_file("two.json", {"boundaries": [{"buildId": "a", "build_id": "b"}]})],
             "given twice"),
            ([good, "--ep", "four"], "--ep needs an integer"),
            ([good, "--mesh", ""], "--mesh needs a mesh id"),
            ([good, "--bogus"], "invalid option"),
        ]
        for args, text in cases:
            rc, out, err = ctl("validate", *args)
            self.assertEqual(rc, 2, "%r: rc=%d\n%s%s" % (args, rc, out, err))
            self.assertEqual(out, "", args)
            self.assertIn(text, err, args)
            self.assertIn("familyctl validate --help", err, args)

    def test_json_errors_name_line_and_column(self):
        cases = [
            ("dupkey.json", '{"context": {},\n  "boundaries": [],\n  "boundaries": []}\n',
             ":3:14: duplicate object key 'boundaries'"),
            ("dupnested.json", '{"boundaries": [\n  {"fqns": ["a"], "buildId": "x", "fqns": ["b"]}]}',
             ":2:40: duplicate object key 'fqns'"),
            ("syntax.json", '{\n  "boundaries": [\n    {"fqns": ["x"] "buildId": "a"}\n  ]\n}\n',
             ":3:28: not JSON: '}' expected near '\"buildId\"'"),
            ("truncated.json", '{"boundaries": [', ":1:16: not JSON: "),
        ]
        for name, text, where in cases:
            path = model_file(name, text)
            rc, out, err = ctl("validate", path)
            self.assertEqual(rc, 2, "%s: rc=%d %s" % (name, rc, err))
            self.assertEqual(out, "")
            self.assertTrue(err.startswith("familyctl: %s%s" % (path, where)), err)
            self.assertIn("familyctl validate --help", err)

    def test_table_options(self):
        rc, out, err = ctl("validate", self.violations_model(), "--ep", "4", "-o", "reason,FQNS")
        self.assertEqual(rc, 1, out + err)
        self.assertEqual([ln.split() for ln in out.splitlines()],
                         [["REASON", "FQNS"], ["UNKNOWN_BUILD", "layers.0.moe"],
                          ["AXIS_SIZE_MISMATCH", "layers.1.moe,model.layers.1.moe"]], out)
        rc, out, err = ctl("validate", self.violations_model(), "--ep", "4", "--noheadings",
                           "--raw", "-o", "message")
        self.assertEqual(rc, 1, out + err)
        self.assertEqual(out.splitlines()[0], "build\\x20'bld-does-not-exist'\\x20not\\x20found")
        rc, out, err = ctl("validate", self.violations_model(), "-o", "violation")
        self.assertEqual(rc, 2, err)
        self.assertIn("unknown column 'violation' (columns: FQNS, REASON, MESSAGE)", err)

    def test_non_ascii_cells(self):
        # The daemon's strings are UTF-8: printed as they are (not as \xHH) and aligned by
        # their width, whatever the locale says.
        path = model_file("utf8.json", {"boundaries": [
            {"fqns": ["schicht.0.münze"], "buildId": "bld-nøpe"},
            {"fqns": ["x"], "buildId": "bld-does-not-exist"}]})
        env = dict(os.environ, LC_ALL="C")
        env.pop("FAMILYD_SOCKET", None)
        p = subprocess.run([CTL, "--socket", D.socket, "validate", path, "-o", "fqns,message"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, timeout=60)
        out = p.stdout.decode()
        self.assertEqual(p.returncode, 1, out + p.stderr.decode())
        self.assertEqual(out.splitlines(), ["FQNS             MESSAGE",
                                            "schicht.0.münze  build 'bld-nøpe' not found",
                                            "x                build 'bld-does-not-exist' not found"])

    def test_unreachable(self):
        path = model_file("u.json", {"boundaries": []})
        p = subprocess.run([CTL, "--socket", os.path.join(TMP, "nope.sock"), "validate", path],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30)
        self.assertEqual(p.returncode, 3, p.stderr)

    def test_help(self):
        rc, out, err = ctl("validate", "--help")
        self.assertEqual(rc, 0)
        self.assertIn("Usage: familyctl validate [OPTIONS] MODEL.json", out)
        for word in ("--mesh ID", "--tp N", "--json", "appliedLayout", "Exit status"):
            self.assertIn(word, out)
        rc, out, err = ctl("--help")
        self.assertIn("validate MODEL.json", out)


class TestPythonValidate(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        os.environ.setdefault("FAMILYD_DESCRIPTORS", H.descriptor_set_path())
        sys.path.insert(0, PYDIR)
        try:
            import familyd
        except ImportError as e:  # pragma: no cover - depends on the machine
            raise unittest.SkipTest("familyd module: %s" % e)
        cls.familyd = familyd
        cls.c = familyd.Client(D.socket, timeout=30)

    @classmethod
    def tearDownClass(cls):
        cls.c.close()

    def test_clean_and_unpacking(self):
        r = self.c.validate([{"fqns": ["layers.0.moe", "model.layers.0.moe"], "build_id": B,
                              "applied_layout": applied(LAYOUT_B)},
                             (["layers.1.moe"], B)],
                            context={"mesh_id": MESH})
        self.assertIsInstance(r, self.familyd.ValidateResult)
        self.assertTrue(r.ok)
        self.assertTrue(r)
        ok, violations = r
        self.assertEqual((ok, violations), (True, []))

    def test_violations(self):
        ok, violations = self.c.validate(
            [{"fqns": ["layers.0.moe"], "buildId": "bld-does-not-exist"},
             (("layers.1.moe", "model.layers.1.moe"), A)],
            context={"ep_size": 4})
        self.assertFalse(ok)
        self.assertEqual([v.reason for v in violations], ["UNKNOWN_BUILD", "AXIS_SIZE_MISMATCH"])
        self.assertEqual(list(violations[1].fqns), ["layers.1.moe", "model.layers.1.moe"])
        self.assertIn("constructed with ep=1, job requires 4", violations[1].message)
        # A proto3 JSON context and a JobContext message mean the same.
        r2 = self.c.validate([(("layers.1.moe", "model.layers.1.moe"), A)], {"epSize": "4"})
        jc = self.c.protos.cls("familyd.v1.JobContext")(ep_size=4)
        r3 = self.c.validate([(("layers.1.moe", "model.layers.1.moe"), A)], jc)
        self.assertEqual([v.reason for v in r2.violations], ["AXIS_SIZE_MISMATCH"])
        self.assertEqual(list(r2.violations), list(r3.violations))

    def test_build_objects(self):
        with self.c.build("grouped_experts", config=CONFIG, mesh_id=MESH,
                          materialize=False) as b:
            layout = b.message.info.layout
            r = self.c.validate([{"fqns": ["layers.0.moe"], "build": b, "applied_layout": layout},
                                 (["layers.1.moe"], b.message)],
                                context={"mesh_id": MESH})
            self.assertEqual(r, (True, []))
            # A bare Build: a boundary without fqns.
            ok, v = self.c.validate([b], context={"mesh_id": MESH})
            self.assertTrue(ok, v)
            b.release()
            ok, v = self.c.validate([{"fqns": ["layers.0.moe"], "build": b}])
            self.assertFalse(ok)
            self.assertEqual([x.reason for x in v], ["UNKNOWN_BUILD"])

    def test_bad_boundaries(self):
        with self.assertRaises(ValueError):
            self.c.validate([{"fqn": "x"}])
        with self.assertRaises(TypeError):
            self.c.validate([42])
        with self.assertRaises(self.familyd.FamilydError) as e:
            self.c.validate([(["x"], A)], context={"mesh_id": "mesh-does-not-exist"})
        self.assertEqual(e.exception.code_name, "NOT_FOUND")


if __name__ == "__main__":
    unittest.main(verbosity=2)
