#!/usr/bin/python3
"""familyctl's bash completion (client/familyctl/completion/familyctl.bash) in a scripted bash session.

bash sources the script, then each case sets COMP_WORDS/COMP_CWORD as bash does for a line
and calls the completion function; COMPREPLY must hold exactly the expected words. familyctl is
this build's; the daemon queries (family names, build ids, mesh ids) go to a real familyd
with the example registry, and to a socket nobody serves (nothing offered, within the 0.5 s
timeout).
"""

import os
import shlex
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402

SCRIPT = os.path.join(H.SOURCE_ROOT, "client", "familyctl", "completion", "familyctl.bash")
REGISTRY = os.path.join(H.SOURCE_ROOT, "deploy", "registry")


def complete(words, cword=None):
    """COMPREPLY for the line `words` with the cursor on word cword (default: the last)."""
    cword = len(words) - 1 if cword is None else cword
    script = "source %s\nCOMP_WORDS=(%s)\nCOMP_CWORD=%d\n_familyctl\nprintf '%%s\\n' \"${COMPREPLY[@]}\"\n" % (
        shlex.quote(SCRIPT), " ".join(shlex.quote(w) for w in words), cword)
    p = subprocess.run(["bash", "--norc", "--noprofile", "-c", script], text=True,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30)
    if p.returncode != 0:
        raise AssertionError("bash failed: %s" % p.stderr)
    return sorted(w for w in p.stdout.split("\n") if w)


class TestCompletion(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = H.Daemon(registry=REGISTRY, host_devices=2)
        cls.d.start()
        cls.ctl = H.familyctl_bin()

    @classmethod
    def tearDownClass(cls):
        cls.d.stop_checked()

    def test_verbs(self):
        self.assertEqual(complete([self.ctl, "bu"]), ["build", "build-info", "builds"])
        self.assertEqual(complete([self.ctl, "--socket", self.d.socket, "me"]),
                         ["mesh", "meshes"])
        self.assertIn("validate", complete([self.ctl, ""]))
        self.assertEqual(complete([self.ctl, "ch"]), ["checkpoint"])
        self.assertEqual(complete([self.ctl, "checkpoint", ""]), ["inspect"])

    def test_global_and_verb_flags(self):
        self.assertEqual(complete([self.ctl, "--j"]), ["--json"])
        got = complete([self.ctl, "build", "--ma"])
        self.assertEqual(got, ["--materialize"])
        got = complete([self.ctl, "release", "--"])
        self.assertIn("--force", got)
        self.assertIn("--json", got)
        self.assertEqual(complete([self.ctl, "shard", "x", "0", "--mode", "pr"]), ["private"])
        self.assertEqual(complete([self.ctl, "build", "norm", "--dtype", "bf"]), ["bfloat16"])
        self.assertEqual(complete([self.ctl, "build", "mlp", "--checkpoint-names", "p"]),
                         ["parameters"])
        self.assertEqual(complete([self.ctl, "build", "mlp", "--checkpoint-"]),
                         ["--checkpoint-names"])
        self.assertEqual(complete([self.ctl, "build", "mlp", "--prefix", "mo"]), [])

    def test_names_from_the_daemon(self):
        self.assertEqual(complete([self.ctl, "--socket", self.d.socket, "family", "emb"]),
                         ["embedding"])
        self.assertEqual(complete([self.ctl, "-s", self.d.socket, "build", "gr"]),
                         ["grouped_experts"])
        mesh = subprocess.run([self.ctl, "--socket", self.d.socket, "--json", "mesh", "create",
                               "dp=2"], text=True, stdout=subprocess.PIPE, check=True).stdout
        mesh_id = [w for w in mesh.replace('"', " ").split() if w.startswith("mesh-")][0]
        self.assertEqual(complete([self.ctl, "--socket", self.d.socket, "mesh", "get", "mesh-"]),
                         [mesh_id])
        self.assertEqual(complete([self.ctl, "--socket", self.d.socket, "mesh", "cr"]),
                         ["create"])
        out = subprocess.run([self.ctl, "--socket", self.d.socket, "--json", "build", "norm",
                              "hidden_size=8"], text=True, stdout=subprocess.PIPE,
                             check=True).stdout
        build_id = [w for w in out.replace('"', " ").split() if w.startswith("bld-")][0]
        self.assertIn(build_id, complete([self.ctl, "--socket", self.d.socket, "pin", "bld-"]))

    def test_no_daemon_offers_nothing_quickly(self):
        t0 = time.monotonic()
        self.assertEqual(complete([self.ctl, "--socket", "/nonexistent/x.sock", "family", ""]),
                         [])
        self.assertLess(time.monotonic() - t0, 10)


if __name__ == "__main__":
    unittest.main(verbosity=2)
