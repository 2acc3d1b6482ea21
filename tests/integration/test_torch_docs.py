#!/usr/bin/python3
"""docs/torch.md, followed as written: from an empty folder to the example job's losses.

The guide marks what a reader runs with an HTML comment on the line before the fenced block:

  <!-- torch-docs: run -->      a shell block (```sh) the reader types in their empty folder;
  <!-- torch-docs: output -->   the output the guide shows for the sharded run (```text);
  <!-- torch-docs: trainer -->  a Python trainer (```python) the reader saves and launches.

The reader's familyd checkout is a copy of this one (client/python, proto, deploy/registry: pip
builds the package in place, so the copy keeps the source tree clean), named by FAMILYD as the
guide says, and the daemon runs as the README's first command runs it (deploy/dev/run.sh's
last line: the example registry, 8 host devices, on $FAMILYD/run/familyd.sock; the binary is
this build's). Every `run` block is then run, as written and in order, by one bash in an empty
folder. Checked: they succeed; the sharded run (4 workers through torchrun) prints the
losses of the whole model in one process (1e-5 relative at step 0, 1e-4 after), the losses the
guide shows (1e-4 relative: other CPUs round the last digits differently), and Validate's "ok";
the guide's trainer, launched on 4 workers, builds its module.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402

DOC = os.path.join(H.SOURCE_ROOT, "docs", "torch.md")
MARK = re.compile(r"^<!-- torch-docs: (run|output|trainer) -->\s*$")
STEP = re.compile(r"^step (\d+) loss ([0-9.eE+-]+)")
TIMEOUT = 900   # the guide installs torch into a fresh venv: minutes on a loaded 2-core machine


def marked_blocks(text):
    """[(kind, body)] of the marked fenced blocks, in document order."""
    out = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = MARK.match(lines[i])
        if m:
            if i + 1 >= len(lines) or not lines[i + 1].startswith("```"):
                raise AssertionError("docs/torch.md:%d: a torch-docs mark must precede a fenced "
                                     "block" % (i + 1))
            j = i + 2
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            out.append((m.group(1), "\n".join(lines[i + 2:j]) + "\n"))
            i = j
        i += 1
    return out


def losses(text):
    return {int(m.group(1)): float(m.group(2))
            for m in (STEP.match(line) for line in text.splitlines()) if m}


def copy_checkout(dest):
    """The parts of the checkout the guide uses, without build artefacts."""
    ignore = shutil.ignore_patterns("__pycache__", "build", "*.egg-info", "*_pb2.py*",
                                    "*.binpb", "dist")
    for part in (("client", "python"), ("proto",), ("deploy", "registry")):
        shutil.copytree(os.path.join(H.SOURCE_ROOT, *part), os.path.join(dest, *part),
                        ignore=ignore)


class TestTorchDocs(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open(DOC) as f:
            cls.blocks = marked_blocks(f.read())
        cls.tmp = tempfile.mkdtemp(prefix="fd-torch-docs-")
        cls.checkout = os.path.join(cls.tmp, "familyd")
        copy_checkout(cls.checkout)
        os.makedirs(os.path.join(cls.checkout, "run"))
        cls.daemon = H.Daemon(registry=os.path.join(cls.checkout, "deploy", "registry"),
                              host_devices=8, tmpdir=cls.tmp,
                              socket_path=os.path.join(cls.checkout, "run", "familyd.sock"))
        cls.daemon.shard_socket = os.path.join(cls.checkout, "run", "shard.sock")
        cls.daemon.start()
        cls.env = {k: v for k, v in os.environ.items()
                   if not k.startswith("FAMILYD_") and k not in ("PYTHONPATH",)}
        cls.env["FAMILYD"] = cls.checkout

    @classmethod
    def tearDownClass(cls):
        try:
            cls.daemon.stop()
        finally:
            shutil.rmtree(cls.tmp, ignore_errors=True)

    def blocks_of(self, kind):
        return [body for k, body in self.blocks if k == kind]

    def test_1_the_guide_as_written(self):
        runs = self.blocks_of("run")
        self.assertGreaterEqual(len(runs), 2, "docs/torch.md has no marked commands")
        reader = os.path.join(self.tmp, "reader")
        os.mkdir(reader)
        script = "set -euo pipefail\n" + "".join(runs)
        p = subprocess.run(["bash", "-c", script], cwd=reader, env=self.env, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=TIMEOUT)
        self.assertEqual(p.returncode, 0, p.stdout[-6000:])
        with open(os.path.join(reader, "sharded.txt")) as f:
            sharded_text = f.read()
        with open(os.path.join(reader, "whole.txt")) as f:
            whole_text = f.read()
        sharded, whole = losses(sharded_text), losses(whole_text)
        self.assertGreaterEqual(len(sharded), 3, sharded_text)
        self.assertEqual(sorted(sharded), sorted(whole))
        for step, loss in sharded.items():
            tol = 1e-5 if step == 0 else 1e-4
            self.assertLessEqual(abs(loss - whole[step]), tol * abs(whole[step]), (step, loss,
                                                                                  whole[step]))
        self.assertIn("validate: ok", sharded_text)
        self.assertIn("validate: ok", whole_text)
        shown = self.blocks_of("output")
        self.assertEqual(len(shown), 1, "docs/torch.md shows the sharded run's output once")
        documented = losses(shown[0])
        self.assertEqual(sorted(documented), sorted(sharded), shown[0])
        for step, loss in documented.items():
            self.assertLessEqual(abs(loss - sharded[step]), 1e-4 * abs(sharded[step]),
                                 "docs/torch.md shows step %d loss %s, the run printed %s"
                                 % (step, loss, sharded[step]))
        self.assertIn("validate: ok", shown[0])

    def test_2_the_guide_trainer(self):
        trainers = self.blocks_of("trainer")
        self.assertEqual(len(trainers), 1)
        path = os.path.join(self.tmp, "trainer.py")
        with open(path, "w") as f:
            f.write(trainers[0])
        env = dict(self.env, FAMILYD_SOCKET=self.daemon.socket,
                   PYTHONPATH=os.path.join(H.SOURCE_ROOT, "client", "python"),
                   FAMILYD_DESCRIPTORS=H.descriptor_set_path())
        port = str(H.free_port())
        p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                            "4", "--master-addr", "127.0.0.1", "--master-port", port, path],
                           cwd=self.tmp, env=env, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=TIMEOUT)
        self.assertEqual(p.returncode, 0, p.stdout[-6000:])
        # Four processes print to one pipe; unbuffered (PYTHONUNBUFFERED), their words may
        # interleave ("TPSwiGLUMLPbld-..."), so the words are counted, not the lines.
        self.assertEqual(p.stdout.count("TPSwiGLUMLP"), 4, p.stdout[-6000:])
        ids = re.findall(r"bld-[0-9a-f]{8}-[0-9]+", p.stdout)
        self.assertEqual(len(ids), 4, p.stdout[-6000:])
        self.assertEqual(len(set(ids)), 4)   # a training handout per process


if __name__ == "__main__":
    unittest.main(verbosity=2)
