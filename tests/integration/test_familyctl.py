#!/usr/bin/python3
"""familyctl end to end against the real daemon: output, --json, exit codes 0/1/2/3, the table
options (-o/--output, --noheadings, --raw) and the axis flags (--tp N ..., with --tp-size N kept
as a hidden alias).

familyctl is $FAMILYCTL (meson passes the built target). Exit codes: 0 ok, 1 daemon error,
2 usage, 3 unreachable.
"""

import json
import os
import re
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402

REGISTRY = os.path.join(H.CONFORMANCE, "registry")
CTL = H.familyctl_bin()
D = None


def setUpModule():
    global D
    if not CTL or not os.path.exists(CTL):
        raise unittest.SkipTest("familyctl not built")
    D = H.Daemon(registry=REGISTRY, host_devices=8, node_name="ctl-node")
    D.start()


def tearDownModule():
    if D is None:
        return
    try:
        D.stop()
    finally:
        D.cleanup()


def ctl(*args, socket=True, timeout=60):
    argv = [CTL] + (["--socket", D.socket] if socket else []) + list(args)
    env = dict(os.environ)
    env.pop("FAMILYD_SOCKET", None)
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       stdin=subprocess.DEVNULL, timeout=timeout, env=env)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


def find_key(obj, key):
    """Every value stored under key anywhere in a JSON document."""
    out = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == key:
                out.append(v)
            out += find_key(v, key)
    elif isinstance(obj, list):
        for v in obj:
            out += find_key(v, key)
    return out


class TestFamilyctl(unittest.TestCase):
    def ok(self, *args):
        rc, out, err = ctl(*args)
        self.assertEqual(rc, 0, "familyctl %s: rc=%d\nstdout:\n%s\nstderr:\n%s"
                         % (" ".join(args), rc, out, err))
        return out

    def test_families_table(self):
        out = self.ok("families")
        lines = out.splitlines()
        self.assertGreaterEqual(len(lines), 6, out)   # header + 5 families
        self.assertIn("NAME", lines[0])
        rows = [ln.split() for ln in lines[1:] if ln.strip()]
        self.assertEqual([r[0] for r in rows], ["grouped_experts", "attention", "norm", "norm",
                                                "engram"], out)
        self.assertIn("hyper_parallel.components.modules.grouped_experts.GroupedExperts", rows[0])

    def test_families_json(self):
        doc = json.loads(self.ok("--json", "families"))
        names = [f["name"] for f in doc["families"]]
        self.assertEqual(names, ["grouped_experts", "attention", "norm", "norm", "engram"])
        self.assertEqual(doc["families"][0]["defaultVariant"]
                         if "defaultVariant" in doc["families"][0]
                         else doc["families"][0].get("default_variant"), "grouped")

    def test_family_by_name_and_baseline(self):
        out = self.ok("family", "grouped_experts")
        self.assertIn("grouped_ep", out)
        doc = json.loads(self.ok("--json", "family",
                                 "hyper_parallel.components.modules.norm.OffsetRMSNorm"))
        self.assertEqual(find_key(doc, "name")[0], "norm")
        self.assertIn("offset", json.dumps(doc))

    def test_resolve_ep4(self):
        out = self.ok("resolve", "grouped_experts", "activation=gelu", "--ep", "4")
        self.assertIn("grouped_ep", out)
        self.assertIn("EPGroupedExperts", out)
        doc = json.loads(self.ok("--json", "resolve", "grouped_experts", "--ep", "4"))
        self.assertEqual(find_key(doc, "variant"), ["grouped_ep"])

    def test_resolve_typed_values(self):
        # k=v values are typed: true is a bool (selects mxfp8), 4 is an int, 1e4 a float
        doc = json.loads(self.ok("--json", "resolve", "grouped_experts", "use_mxfp8=true"))
        self.assertEqual(find_key(doc, "variant"), ["mxfp8"])
        doc = json.loads(self.ok("--json", "resolve", "attention", "window=4", "rope_theta=10000.5"))
        self.assertEqual(find_key(doc, "variant"), ["eager"])
        doc = json.loads(self.ok("--json", "resolve", "attention", "--cp", "2"))
        self.assertEqual(find_key(doc, "variant"), ["ring"])

    def test_resolve_error_exit_1(self):
        rc, out, err = ctl("resolve", "nope")
        self.assertEqual(rc, 1, err)
        self.assertIn("family name 'nope' must identify exactly one registration", err)
        self.assertIn("NOT_FOUND", err)
        rc, out, err = ctl("resolve", "grouped_experts", "use_mxfp8=true", "--ep", "4")
        self.assertEqual(rc, 1, err)
        self.assertIn("variant 'mxfp8' requires ep in [1, 2]; job has ep=4", err)
        rc, out, err = ctl("resolve", "grouped_experts", "use_mxfp8=1")
        self.assertEqual(rc, 1, err)
        self.assertIn("selector 'use_mxfp8' must be bool", err)

    def test_unreachable_exit_3(self):
        rc, out, err = ctl("--socket", os.path.join(D.tmpdir, "missing.sock"), "families",
                           socket=False)
        self.assertEqual(rc, 3, err)
        self.assertTrue(err.strip(), "no message on stderr")

    def test_usage_exit_2(self):
        for args in (["no-such-verb"], ["resolve"], ["resolve", "grouped_experts", "novalue"],
                     ["resolve", "grouped_experts", "--ep", "four"], ["families", "extra"],
                     []):
            rc, out, err = ctl(*args)
            self.assertEqual(rc, 2, "familyctl %s: rc=%d %s" % (args, rc, err))
            self.assertTrue(err.strip(), "no usage message for %s" % args)

    def test_mesh_create_then_meshes(self):
        out = self.ok("--json", "mesh", "create", "dp=2,tp=4", "--expert", "edp_shard=2,ep=4")
        doc = json.loads(out)
        ids = find_key(doc, "meshId") or find_key(doc, "mesh_id")
        self.assertEqual(len(ids), 1, out)
        mesh_id = ids[0]
        self.assertTrue(mesh_id)
        # same definition, same id (plain output names it too)
        self.assertIn(mesh_id, self.ok("mesh", "create", "dp=2,tp=4", "--expert",
                                       "edp_shard=2,ep=4"))
        self.assertIn(mesh_id, self.ok("meshes"))
        listed = json.loads(self.ok("--json", "meshes"))
        self.assertIn(mesh_id, find_key(listed, "meshId") + find_key(listed, "mesh_id"))
        doc = json.loads(self.ok("--json", "resolve", "grouped_experts", "--mesh", mesh_id))
        self.assertEqual(find_key(doc, "variant"), ["grouped_ep"])
        rc, out, err = ctl("mesh", "create", "dp=3")
        self.assertEqual(rc, 1, err)
        self.assertIn("device_mesh size 3 does not match 8 ranks", err)

    def test_version_shows_both_sides_and_their_api(self):
        with open(os.path.join(H.SOURCE_ROOT, "proto", "familyd", "v1", "admin.proto")) as f:
            revision = int(re.search(r"API_REVISION_CURRENT = (\d+);", f.read()).group(1))
        version = os.environ.get("FAMILYD_VERSION", "0.1.0")
        out = self.ok("version")
        self.assertRegex(out, r"client +familyctl %s, API familyd\.v1 revision %d\n"
                         % (re.escape(version), revision))
        self.assertRegex(out, r"daemon +familyd %s, API familyd\.v1 revision %d\n"
                         % (re.escape(version), revision))
        self.assertRegex(out, r"api +the same\n")
        doc = json.loads(self.ok("--json", "version"))
        side = {"version": version, "api": "familyd.v1", "apiRevision": revision}
        self.assertEqual(doc, {"client": side, "daemon": side})
        # The daemon's side comes from GetStatus.
        st = json.loads(self.ok("--json", "status"))
        self.assertEqual((st.get("api"), st.get("apiRevision")), ("familyd.v1", revision))
        # Without a daemon: exit 3, as every verb that needs one.
        rc, out, err = ctl("--socket", "/nonexistent/familyd.sock", "version", socket=False)
        self.assertEqual((rc, out), (3, ""), err)

    def test_topology_status_reload(self):
        out = self.ok("topology")
        self.assertIn("ctl-node", out)
        topo = json.loads(self.ok("--json", "topology"))
        self.assertIn(8, [int(x) for x in find_key(topo, "worldSize") + find_key(topo, "world_size")])
        st = json.loads(self.ok("--json", "status"))
        gen = [int(x) for x in find_key(st, "registryGeneration") + find_key(st, "registry_generation")]
        self.assertEqual(len(gen), 1, st)
        self.ok("reload")
        st2 = json.loads(self.ok("--json", "status"))
        gen2 = [int(x) for x in find_key(st2, "registryGeneration") + find_key(st2, "registry_generation")]
        self.assertEqual(gen2, [gen[0] + 1])
        self.assertIn("5", self.ok("status"))

    # -- table options ---------------------------------------------------------------------

    def test_output_picks_and_orders_columns(self):
        full = [ln.split() for ln in self.ok("families").splitlines()]
        out = self.ok("families", "-o", "source,NAME")
        lines = [ln.split() for ln in out.splitlines()]
        self.assertEqual(lines[0], ["SOURCE", "NAME"], out)
        self.assertEqual(lines[1:], [[row[4], row[0]] for row in full[1:]], out)
        # --output, names in any case; the same columns as the full table
        out2 = self.ok("families", "--output", "Name,Default")
        self.assertEqual([ln.split() for ln in out2.splitlines()],
                         [[row[0], row[2]] for row in full], out2)
        # --json is the daemon's answer whatever the columns
        doc = json.loads(self.ok("--json", "families", "-o", "name"))
        self.assertEqual(doc["families"][0]["name"], "grouped_experts")
        self.assertIn("baseline", doc["families"][0])

    def test_output_unknown_column_refused(self):
        for args, text in ((["families", "-o", "name,bogus"],
                            "unknown column 'bogus' (columns: NAME, BASELINE, DEFAULT, VARIANTS, SOURCE)"),
                           (["meshes", "--output", "MESH"],
                            "unknown column 'MESH' (columns: MESH_ID, DEVICE_MESH, EXPERT_MESH, RANKS)"),
                           (["families", "-o", "name,NAME"], "column 'NAME' given twice"),
                           (["families", "-o", ""], "--output needs column names"),
                           (["status", "-o", "name"], "invalid option")):
            rc, out, err = ctl(*args)
            self.assertEqual(rc, 2, "%s: rc=%d %s" % (args, rc, err))
            self.assertEqual(out, "", args)
            self.assertIn(text, err, args)
            self.assertIn("--help", err, args)

    def test_noheadings(self):
        full = self.ok("families").splitlines()
        out = self.ok("families", "--noheadings")
        self.assertEqual([ln.split() for ln in out.splitlines()],
                         [ln.split() for ln in full[1:]], out)
        out = self.ok("families", "--noheadings", "-o", "name")
        self.assertEqual(out.split("\n"), ["grouped_experts", "attention", "norm", "norm", "engram", ""])

    def test_raw(self):
        # One space between cells; a blank inside a cell (DEVICES is "8 host") written as \x20.
        out = self.ok("topology", "--raw", "-o", "node,devices,local")
        self.assertIn("\nNODE DEVICES LOCAL\nctl-node 8\\x20host yes\n", out)
        out = self.ok("topology", "--raw", "--noheadings", "-o", "node,state")
        self.assertTrue(out.endswith("\n\nctl-node up\n"), out)
        out = self.ok("families", "--raw", "-o", "name,default")
        self.assertEqual(out.splitlines()[:2], ["NAME DEFAULT", "grouped_experts grouped"])

    def test_help_lists_table_options(self):
        out = self.ok("families", "--help")
        for word in ("-o, --output COLUMNS", "--noheadings", "--raw",
                     "Columns: NAME BASELINE DEFAULT VARIANTS SOURCE"):
            self.assertIn(word, out)
        self.assertNotIn("--output", self.ok("status", "--help"))

    # -- axis flags ------------------------------------------------------------------------

    def test_mesh_create_axis_flags(self):
        doc = json.loads(self.ok("--json", "mesh", "create", "dp=4,tp=2", "--tp", "2"))
        self.assertEqual(doc["tpSize"], "2")
        self.assertRegex(self.ok("mesh", "get", doc["meshId"]), r"(?m)^tp size +2$")
        # the spelling of 0.1.0, kept as a hidden alias: the same mesh
        old = json.loads(self.ok("--json", "mesh", "create", "dp=4,tp=2", "--tp-size", "2"))
        self.assertEqual(old["meshId"], doc["meshId"])
        # the flag reaches the daemon: a size the views disagree with is its error
        rc, out, err = ctl("mesh", "create", "dp=4,tp=2", "--tp", "4")
        self.assertEqual(rc, 1, err)
        self.assertIn("tp_size=4 disagrees with the mesh size 2", err)
        rc, out, err = ctl("mesh", "create", "dp=4,tp=2", "--ep-size", "x")
        self.assertEqual(rc, 2, err)
        self.assertIn("--ep-size needs an integer, not 'x'", err)
        out = self.ok("mesh", "create", "--help")
        self.assertIn("--tp N, --cp N, --ep N, --pp N", out)
        self.assertNotIn("-size", out)

    def test_resolve_accepts_the_alias(self):
        doc = json.loads(self.ok("--json", "resolve", "grouped_experts", "--ep-size", "4"))
        self.assertEqual(find_key(doc, "variant"), ["grouped_ep"])
        self.assertNotIn("-size", self.ok("resolve", "--help"))


if __name__ == "__main__":
    unittest.main(verbosity=2)
