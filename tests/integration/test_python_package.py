#!/usr/bin/python3
"""The Python client as an installed package (client/python: pyproject.toml, setup.py).

Installs it twice into temporary folders: `meson install --tags python --destdir` from this
build, and `pip install --no-build-isolation --target` from a copy of client/python and proto/
(pip builds in place: the copy keeps the source tree clean). Then, for each, a fresh
interpreter (the tests' own) whose PYTHONPATH is only that folder, with no FAMILYD_DESCRIPTORS and run from
an empty folder, imports familyd and against the real daemon: the classes are protoc's
generated ones (familyd.v1.*_pb2, with their .pyi stubs), create_mesh, build and map a shard,
an error's reason (the google.rpc types of the private pool), and protobuf's default pool has
no google/rpc/status.proto. mypy reads the installed stubs: a wrongly typed message field fails.
"""

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402

PYTHON = sys.executable
REGISTRY = os.path.join(H.SOURCE_ROOT, "deploy", "registry")
# The build folder: the descriptor set meson hands the tests is BUILD/proto/familyd.binpb.
BUILD_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(H.descriptor_set_path())))

# Run in the installed package's interpreter: prints one JSON object of what it saw.
PROBE = textwrap.dedent("""
    import json, os, sys
    import familyd
    from google.protobuf import descriptor_pool
    from familyd.v1 import family_pb2, mesh_pb2

    out = {"file": familyd.__file__, "generated": familyd.default_protos().generated,
           "build_class": familyd.default_protos().cls("familyd.v1.Build") is family_pb2.Build,
           "stubs": sorted(os.path.basename(p) for p in os.listdir(os.path.dirname(family_pb2.__file__))
                           if p.endswith(".pyi"))}
    try:
        descriptor_pool.Default().FindFileByName("google/rpc/status.proto")
        out["default_pool_rpc"] = True
    except KeyError:
        out["default_pool_rpc"] = False
    with familyd.Client(sys.argv[1], timeout=30) as c:
        mesh = c.create_mesh({"ep": 2}, ranks=range(2))
        out["mesh_class"] = isinstance(mesh, mesh_pb2.Mesh)
        cfg = {"hidden_size": 16, "moe_intermediate_size": 8, "num_experts": 4,
               "initializer_range": 0.02}
        with c.build("grouped_experts", config=cfg, mesh_id=mesh.mesh_id, dtype="float32",
                     seed=1) as b:
            out["ranks"] = sorted(b.ranks)
            w = b.ranks[0]["gate_up_proj"]
            out["shape"] = list(w.shape)
            out["sum_nonzero"] = bool(abs(float(w.sum())) > 0)
        try:
            c.get_build("bld-nope")
        except familyd.FamilydError as e:
            out["error"] = [e.code_name, e.reason]
    print(json.dumps(out))
""")

# mypy against the installed stubs: line 4 gives a str field an int.
TYPED = textwrap.dedent("""\
    from familyd.v1 import family_pb2

    ok = family_pb2.BuildRequest(family="grouped_experts")
    bad = family_pb2.BuildRequest(family=3)
    print(ok, bad)
""")

D = None
TMP = None


def setUpModule():
    global D, TMP
    TMP = tempfile.mkdtemp(prefix="fd-pypkg-")
    D = H.Daemon(registry=REGISTRY, host_devices=4, node_name="pkg-node")
    D.start()


def tearDownModule():
    try:
        if D is not None:
            try:
                D.stop()
            finally:
                D.cleanup()
    finally:
        if TMP:
            shutil.rmtree(TMP, ignore_errors=True)


def run(argv, env=None, cwd=None, timeout=240):
    p = subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       universal_newlines=True, timeout=timeout)
    return p.returncode, p.stdout


def clean_env(pythonpath):
    """A minimal environment: PYTHONPATH only pythonpath, no FAMILYD_* at all."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("FAMILYD_") and k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PYTHONPATH"] = pythonpath
    env["PYTHONNOUSERSITE"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


class InstalledPackage:
    """The checks, for a package installed at self.site (set by the subclass)."""

    site = None

    def probe(self):
        empty = tempfile.mkdtemp(dir=TMP)
        rc, out = run([PYTHON, "-s", "-c", PROBE, D.socket], env=clean_env(self.site), cwd=empty)
        self.assertEqual(rc, 0, out)
        return json.loads(out.strip().splitlines()[-1])

    def test_installed_package_against_the_daemon(self):
        got = self.probe()
        self.assertTrue(got["file"].startswith(self.site + os.sep), got["file"])
        self.assertTrue(got["generated"], "the installed package should use protoc's classes")
        self.assertTrue(got["build_class"])
        self.assertTrue(got["mesh_class"])
        self.assertEqual(got["stubs"], ["admin_pb2.pyi", "family_pb2.pyi", "mesh_pb2.pyi",
                                        "peer_pb2.pyi", "shard_pb2.pyi", "values_pb2.pyi"])
        self.assertFalse(got["default_pool_rpc"],
                         "importing familyd put google/rpc/status.proto in the default pool")
        self.assertEqual(got["ranks"], [0, 1])
        self.assertEqual(got["shape"], [2, 16, 16])   # 4 experts on ep=2: (2, hidden, 2 x 8)
        self.assertTrue(got["sum_nonzero"])
        self.assertEqual(got["error"], ["NOT_FOUND", "BUILD_NOT_FOUND"])

    def test_no_descriptor_set_in_the_package(self):
        self.assertEqual(glob.glob(os.path.join(self.site, "**", "familyd.binpb"),
                                   recursive=True), [])

    def test_stubs_are_typed(self):
        path = os.path.join(TMP, "typed_%s.py" % type(self).__name__)
        with open(path, "w") as f:
            f.write(TYPED)
        env = clean_env(self.site)
        env["MYPYPATH"] = self.site
        rc, out = run([PYTHON, "-m", "mypy", "--no-error-summary", "--ignore-missing-imports",
                       "--cache-dir", os.path.join(TMP, "mypy-" + type(self).__name__), path],
                      env=env, cwd=TMP)
        self.assertNotEqual(rc, 0, out)
        lines = [ln for ln in out.splitlines() if ": error:" in ln]
        self.assertEqual(len(lines), 1, out)
        self.assertIn("typed_%s.py:4:" % type(self).__name__, lines[0])
        self.assertIn('"family"', lines[0])


class MesonInstall(InstalledPackage, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        dest = os.path.join(TMP, "meson-dest")
        rc, out = run(["meson", "install", "-C", BUILD_ROOT, "--no-rebuild", "--tags", "python",
                       "--destdir", dest])
        if rc != 0:
            raise AssertionError("meson install failed (%d):\n%s" % (rc, out))
        inits = glob.glob(os.path.join(dest, "**", "familyd", "__init__.py"), recursive=True)
        if len(inits) != 1:
            raise AssertionError("meson install: %s familyd/__init__.py\n%s" % (inits, out))
        cls.site = os.path.dirname(os.path.dirname(inits[0]))

    def test_installed_for_debian_python(self):
        # prefix/lib/python3/dist-packages: a folder /usr/bin/python3 searches for its prefix.
        rel = os.path.relpath(self.site, os.path.join(TMP, "meson-dest"))
        self.assertRegex(rel, r"lib/python3[.0-9]*/(dist|site)-packages$")


class PipInstall(InstalledPackage, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        src = os.path.join(TMP, "src")
        shutil.copytree(os.path.join(H.SOURCE_ROOT, "client", "python"),
                        os.path.join(src, "client", "python"),
                        ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
        shutil.copytree(os.path.join(H.SOURCE_ROOT, "proto"), os.path.join(src, "proto"))
        cls.site = os.path.join(TMP, "pip-target")
        env = clean_env("")
        env["PIP_NO_INDEX"] = "1"
        env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
        rc, out = run([PYTHON, "-m", "pip", "install", "--no-build-isolation", "--no-deps",
                       "--target", cls.site, os.path.join(src, "client", "python")], env=env)
        if rc != 0:
            raise AssertionError("pip install failed (%d):\n%s" % (rc, out))


if __name__ == "__main__":
    unittest.main(verbosity=2)
