#!/usr/bin/python3
"""The GPU check of tests/gpu/, run here in its --dry-run mode against the fake CUDA driver, so
the script that will run on a GPU machine is itself tested everywhere: pack.sh bundles this
build (binaries, the libraries ldd finds, the Python module), run.sh starts familyd from the
bundle with LD_LIBRARY_PATH, gpu_check.py checks every byte and measures bandwidth.

  - the bundle is complete: with LD_LIBRARY_PATH at its lib/, ldd finds every library of
    familyd and of the C probe in the bundle (glibc's own aside, which the bundle carries
    separately);
  - one fake GPU, like the GPU machine: two daemons of one cluster hold the 2 ranks; every
    check passes and gpu-check.json says so;
  - two fake GPUs, run through the bundle's own glibc loader (as on a machine whose glibc is
    older than this one's): every check passes;
  - GPUs that cannot hold shards: the check fails, says which checks, and still writes its
    summary.
"""

import json
import os
import shutil
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402

GPU = os.path.join(H.SOURCE_ROOT, "tests", "gpu")
BUILD = os.path.dirname(os.path.dirname(os.path.abspath(H.familyd_bin())))
FAKE = os.path.join(BUILD, "tests", "fake-cuda", "libfake-libcuda.so")
GLIBC = ("libc.so", "libm.so", "libdl.so", "libpthread.so", "librt.so", "libresolv.so",
         "libutil.so", "libanl.so", "ld-linux", "libmvec.so", "linux-vdso")

TMP = None
BUNDLE = None


def setUpModule():
    global TMP, BUNDLE
    if not os.path.exists(FAKE):
        raise unittest.SkipTest("the fake libcuda was not built")
    TMP = H.short_tmpdir("fd-gpu-script-")
    BUNDLE = os.path.join(TMP, "bundle")
    p = subprocess.run(["bash", os.path.join(GPU, "pack.sh"), BUILD, BUNDLE],
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise AssertionError("pack.sh failed:\n%s%s" % (p.stdout, p.stderr))


def tearDownModule():
    if TMP:
        shutil.rmtree(TMP, ignore_errors=True)


def run(bundle, out, env=None, timeout=280):
    e = dict(os.environ)
    for k in ("FAMILYD_CUDA_DRIVER", "FAKE_CUDA_DEVICES", "LD_LIBRARY_PATH"):
        e.pop(k, None)
    e.update(env or {})
    p = subprocess.run(["bash", os.path.join(GPU, "run.sh"), "--dry-run", "--bundle", bundle,
                        "--out", out], capture_output=True, text=True, env=e, timeout=timeout)
    summary = None
    try:
        with open(os.path.join(out, "gpu-check.json")) as f:
            summary = json.load(f)
    except OSError:
        pass
    return p, summary


class GpuScript(unittest.TestCase):
    def assertAllPassed(self, p, summary, daemons):
        self.assertEqual(p.returncode, 0, p.stdout[-4000:] + p.stderr[-2000:])
        self.assertTrue(summary["passed"], json.dumps(summary, indent=1)[-3000:])
        self.assertTrue(summary["dry_run"])
        names = [r["name"] for r in summary["results"]]
        for want in ["topology lists the GPUs", "the fill kernel loads",
                     "host staging when asked", "fill bandwidth measured",
                     "daemons stopped cleanly",
                     "C client float32 bit-exact (shard-import-probe)",
                     "C client bfloat16 bit-exact (shard-import-probe)"] + [
                "%s %s bit-exact (Python module)" % (path, dt)
                for path in ("kernel", "staging") for dt in ("float32", "bfloat16", "float16")]:
            self.assertIn(want, names)
        topo = [r for r in summary["results"] if r["name"] == "topology lists the GPUs"][0]
        self.assertIn("world size 2, %d daemon(s)" % daemons, topo["detail"])
        bw = [r for r in summary["results"] if r["name"] == "fill bandwidth measured"][0]
        self.assertGreater(bw["bandwidth"]["build_kernel_gbs"], 0)
        self.assertGreater(bw["bandwidth"]["build_staging_gbs"], 0)
        self.assertGreater(bw["bandwidth"]["bytes_per_build"], 0)

    def test_bundle_is_complete(self):
        lib = os.path.join(BUNDLE, "lib")
        for exe in ("familyd", "shard-import-probe"):
            p = subprocess.run(["ldd", os.path.join(BUNDLE, "bin", exe)], capture_output=True,
                               text=True, env=dict(os.environ, LD_LIBRARY_PATH=lib))
            self.assertEqual(p.returncode, 0, p.stderr)
            for line in p.stdout.splitlines():
                self.assertNotIn("not found", line)
                parts = line.split("=>")
                if len(parts) != 2 or not parts[1].strip().startswith("/"):
                    continue
                name, path = parts[0].strip(), parts[1].split()[0]
                if name.startswith(GLIBC):
                    self.assertTrue(os.path.exists(os.path.join(lib, "glibc", name)) or
                                    name.startswith(("libdl", "libpthread", "librt")),
                                    "%s: glibc's %s is not carried" % (exe, name))
                    continue
                self.assertTrue(path.startswith(lib + "/"), "%s: %s comes from %s" % (exe, name,
                                                                                   path))
        for f in ("familyd.binpb", "gpu_check.py", "run.sh", "MANIFEST",
                  "python/familyd/cuda.py", "registry/gpu.yaml", "lib/fake/libfake-libcuda.so"):
            self.assertTrue(os.path.exists(os.path.join(BUNDLE, f)), f)

    def test_one_gpu_like_the_gpu_machine(self):
        out = os.path.join(TMP, "out-one")
        p, summary = run(BUNDLE, out)
        self.assertAllPassed(p, summary, daemons=2)
        self.assertIn("gpu-check: PASS kernel bfloat16 bit-exact", p.stdout)

    def test_two_gpus_through_the_bundles_glibc(self):
        old = os.path.join(TMP, "bundle-old-glibc")
        shutil.copytree(BUNDLE, old, symlinks=True)
        with open(os.path.join(old, "MANIFEST")) as f:
            lines = f.read().splitlines()
        with open(os.path.join(old, "MANIFEST"), "w") as f:
            f.write("\n".join(["glibc 99.0"] + [x for x in lines if not x.startswith("glibc")]))
        out = os.path.join(TMP, "out-two")
        # LeakSanitizer misreads the loader's own allocations when the loader is run by hand.
        p, summary = run(old, out, env={"FAKE_CUDA_DEVICES": "2",
                                        "ASAN_OPTIONS": "detect_leaks=0"})
        self.assertIn("older than 99.0: using the bundle's", p.stdout)
        self.assertAllPassed(p, summary, daemons=1)

    def test_failures_are_reported(self):
        out = os.path.join(TMP, "out-fail")
        p, summary = run(BUNDLE, out, env={"FAKE_CUDA_NO_VMM": "1"})
        self.assertEqual(p.returncode, 1, p.stdout[-3000:])
        self.assertFalse(summary["passed"])
        failed = [r["name"] for r in summary["results"] if r["ok"] is False]
        self.assertIn("the check ran to its end", failed)
        self.assertIn("cannot hold shards on cuda:0: the GPU does not support virtual memory "
                      "management", p.stdout)


if __name__ == "__main__":
    unittest.main(verbosity=2)
