#!/usr/bin/python3
"""familyctl build --checkpoint: a Build filled from safetensors files that familyctl opened
with its own rights and handed to the real daemon on its shard socket (libfamilyd's
familyd_checkpoint_deposit).

The checkpoint is written here by the safetensors library from numpy arrays (no familyd code),
Llama-style names for the example registry's `mlp` family ('{prefix}.gate_proj.weight', ...):
two files and an index, plus a layer the prefix does not name. Every byte of every slice of
every shard, fetched and mapped by this test's own shard socket client, must equal numpy's
slicing of the same tensors, for one rank (whole tensors) and for tp=2 (gate/up split by rows,
down by columns); a single file works as a directory does, and float16 tensors fill a float32
build exactly; --checkpoint-names parameters reads tensors named as the member's parameters.
Then the refusals: a path that does not exist, a directory without
*.safetensors, two index files, --checkpoint without --materialize (each exit 2 with the path
named, nothing sent), a file the calling uid may not read (familyctl run as another uid: exit 2
naming the file, and the daemon builds on), a prefix naming no tensors (the daemon's
CHECKPOINT_TENSOR_MISSING, exit 1), and a shard socket that is not there (exit 3). On a
terminal the progress bar counts the bytes read from the checkpoint ("reading").
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

import numpy as np
from safetensors.numpy import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402
import other_uid  # noqa: E402
import shard_client  # noqa: E402

REGISTRY = os.path.join(H.SOURCE_ROOT, "deploy", "registry")
CTL = H.familyctl_bin()
D = None
TMP = None
COPY = None
OTHER_UID = 65534

HIDDEN, INTERMEDIATE = 64, 96
KV = ["hidden_size=%d" % HIDDEN, "intermediate_size=%d" % INTERMEDIATE,
      "initializer_range=0.02"]
PREFIX = "model.layers.0.mlp"
SHAPES = {"gate_proj": (INTERMEDIATE, HIDDEN), "up_proj": (INTERMEDIATE, HIDDEN),
          "down_proj": (HIDDEN, INTERMEDIATE)}


def tensors(layer, dtype, seed):
    rng = np.random.default_rng(seed)
    return {"model.layers.%d.mlp.%s.weight" % (layer, p): rng.standard_normal(s).astype(dtype)
            for p, s in SHAPES.items()}


def write_checkpoint(path, dtype=np.float32, seed=1):
    """A directory as transformers writes a sharded one: two files and their index. Layer 1
    rides along, for the prefix to tell apart. Returns layer 0's tensors by parameter."""
    os.makedirs(path)
    t0, t1 = tensors(0, dtype, seed), tensors(1, dtype, seed + 1)
    first = {k: v for k, v in t0.items() if "down_proj" not in k}
    second = dict({k: v for k, v in t0.items() if "down_proj" in k}, **t1)
    files = {"model-00001-of-00002.safetensors": first,
             "model-00002-of-00002.safetensors": second}
    weight_map = {}
    for name, ts in files.items():
        save_file(ts, os.path.join(path, name), metadata={"format": "pt"})
        weight_map.update({k: name for k in ts})
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": sum(v.nbytes for v in t0.values()) +
                                sum(v.nbytes for v in t1.values())},
                   "weight_map": weight_map}, f)
    return {p: t0["%s.%s.weight" % (PREFIX, p)] for p in SHAPES}


def setUpModule():
    global D, TMP, COPY
    if not CTL or not os.path.exists(CTL):
        raise unittest.SkipTest("familyctl not built")
    TMP = tempfile.mkdtemp(prefix="fd-ctlck-")
    os.chmod(TMP, 0o755)
    # familyctl as another uid runs from a copy it can read (its library where it looks).
    COPY = other_uid.harness_copy(familyctl=CTL, prefix="fd-ctlck-copy-")
    D = H.Daemon(registry=REGISTRY, host_devices=4, node_name="ctlck-node")
    os.chmod(D.tmpdir, 0o755)
    D.start()
    os.chmod(D.socket, 0o666)
    os.chmod(D.shard_socket, 0o666)


def tearDownModule():
    try:
        if D is not None:
            try:
                D.stop()
            finally:
                D.cleanup()
    finally:
        if COPY is not None:
            COPY.cleanup()
        if TMP:
            shutil.rmtree(TMP, ignore_errors=True)


def ctl(*args, ctl_path=None, prefix_argv=(), timeout=120):
    argv = list(prefix_argv) + [ctl_path or CTL, "--socket", D.socket] + list(args)
    env = dict(os.environ)
    env.pop("FAMILYD_SOCKET", None)
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       stdin=subprocess.DEVNULL, timeout=timeout, env=env, cwd=TMP)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


def checkpoint_args(path, prefix=PREFIX):
    return ["--materialize", "--checkpoint", path, "--prefix", prefix,
            "--shard-socket", D.shard_socket]


NP_DTYPES = {"float32": np.float32, "float16": np.float16}


class TestFamilyctlCheckpoint(unittest.TestCase):
    def ok(self, *args):
        rc, out, err = ctl(*args)
        self.assertEqual(rc, 0, "familyctl %s: rc=%d\nstdout:\n%s\nstderr:\n%s"
                         % (" ".join(args), rc, out, err))
        return out

    def build(self, *args):
        doc = json.loads(self.ok("--json", "build", "mlp", *KV, *args))
        b = doc["build"]
        self.addCleanup(ctl, "unpin", b["buildId"])
        return b

    def check_shards(self, b, want, ranks):
        """Every slice of every rank's shard is numpy's slice of the tensor it names."""
        layout = {p["name"]: p for p in b["info"]["layout"]["parameters"]}
        shards = {int(s.get("rank", "0")): s for s in b["shards"]}
        self.assertEqual(sorted(shards), ranks)
        seen = set()
        for rank, s in sorted(shards.items()):
            self.assertTrue(s.get("token"), s)
            reply, fds = shard_client.fetch(b["shardSocket"], D.protos, [s["token"]])
            self.assertEqual(reply.code, 0, reply)
            self.assertEqual(len(fds), 1)
            try:
                mem = shard_client.map_readonly(fds[0], reply.sizes[0])
            finally:
                os.close(fds[0])
            try:
                for sl in s["slices"]:
                    name = sl["parameter"]
                    dtype = NP_DTYPES[layout[name]["dtype"]]
                    off = [int(x) for x in sl.get("globalOffset", [])]
                    shape = [int(x) for x in sl["localShape"]]
                    off += [0] * (len(shape) - len(off))
                    expect = want[name][tuple(slice(o, o + n) for o, n in zip(off, shape))]
                    expect = np.ascontiguousarray(expect.astype(dtype)).tobytes()
                    start = int(sl.get("byteOffset", "0"))
                    self.assertEqual(int(sl["byteLength"]), len(expect), sl)
                    got = mem[start:start + len(expect)]
                    self.assertTrue(got == expect, "rank %d, %s at %s: the shard's bytes are "
                                    "not the checkpoint's" % (rank, name, off))
                    seen.add(name)
            finally:
                mem.close()
        self.assertEqual(seen, set(SHAPES))

    def test_directory_one_rank(self):
        path = os.path.join(TMP, "one-rank")
        want = write_checkpoint(path, seed=11)
        b = self.build(*checkpoint_args(path))
        self.check_shards(b, want, [0])

    def test_directory_tp2(self):
        path = os.path.join(TMP, "tp2")
        want = write_checkpoint(path, seed=21)
        mesh = json.loads(self.ok("--json", "mesh", "create", "tp=2", "--ranks", "0,1"))["meshId"]
        b = self.build("--mesh", mesh, *checkpoint_args(path))
        placements = {p["name"]: p.get("placements") for p in b["info"]["layout"]["parameters"]}
        self.assertEqual(placements["gate_proj"][0]["kind"], "shard", placements)
        self.check_shards(b, want, [0, 1])

    def test_single_file_and_float16(self):
        path = os.path.join(TMP, "single")
        os.makedirs(path)
        t = tensors(0, np.float16, 31)
        save_file(t, os.path.join(path, "model.safetensors"))
        want = {p: t["%s.%s.weight" % (PREFIX, p)] for p in SHAPES}
        b = self.build(*checkpoint_args(os.path.join(path, "model.safetensors")))
        # float16 into the default float32: exact.
        self.assertEqual({p["dtype"] for p in b["info"]["layout"]["parameters"]}, {"float32"})
        self.check_shards(b, want, [0])

    def test_parameter_names(self):
        # Tensors named as the member's parameters after the prefix, as
        # familyd.torch.save_checkpoint writes them: no '.weight', no registry names.
        path = os.path.join(TMP, "by-parameter")
        os.makedirs(path)
        rng = np.random.default_rng(91)
        want = {p: rng.standard_normal(s).astype(np.float32) for p, s in SHAPES.items()}
        save_file({"blk.%s" % p: t for p, t in want.items()},
                  os.path.join(path, "model.safetensors"))
        b = self.build(*checkpoint_args(path, "blk"), "--checkpoint-names", "parameters")
        self.check_shards(b, want, [0])
        # The registry's names are not there: the default finds no tensor.
        rc, out, err = ctl("build", "mlp", *KV, *checkpoint_args(path, "blk"),
                           "--checkpoint-names", "registry")
        self.assertEqual(rc, 1, err)
        self.assertIn("CHECKPOINT_TENSOR_MISSING", err)
        self.assertIn("blk.gate_proj.weight", err)

    def usage_error(self, args, *needles):
        rc, out, err = ctl("build", "mlp", *KV, *args)
        self.assertEqual(rc, 2, "rc=%d\nstdout:\n%s\nstderr:\n%s" % (rc, out, err))
        self.assertEqual(out, "")
        for n in needles:
            self.assertIn(n, err)
        return err

    def test_refused_before_sending(self):
        before = json.loads(self.ok("--json", "builds")).get("builds", [])
        missing = os.path.join(TMP, "no-such-checkpoint")
        err = self.usage_error(checkpoint_args(missing), missing, "No such file or directory")
        self.assertTrue(err.startswith("familyctl: "), err)

        empty = os.path.join(TMP, "empty")
        os.makedirs(empty)
        with open(os.path.join(empty, "model.safetensors.index.json"), "w") as f:
            f.write("{}")
        self.usage_error(checkpoint_args(empty), empty, "without *.safetensors files")

        two = os.path.join(TMP, "two-indexes")
        write_checkpoint(two, seed=41)
        shutil.copy(os.path.join(two, "model.safetensors.index.json"),
                    os.path.join(two, "other.index.json"))
        self.usage_error(checkpoint_args(two), "model.safetensors.index.json",
                         "other.index.json")

        self.usage_error(["--checkpoint", two], "--checkpoint needs --materialize")
        self.usage_error(["--materialize", "--prefix", PREFIX], "need --checkpoint")
        self.usage_error(["--materialize", "--checkpoint-names", "parameters"],
                         "need --checkpoint")
        self.usage_error(checkpoint_args(two) + ["--checkpoint-names", "hf"],
                         "--checkpoint-names needs registry or parameters, not 'hf'")
        after = json.loads(self.ok("--json", "builds")).get("builds", [])
        self.assertEqual(len(after), len(before))

    def test_unreadable_file_of_another_uid(self):
        path = os.path.join(TMP, "root-only")
        want = write_checkpoint(path, seed=51)
        os.chmod(path, 0o755)
        for name in os.listdir(path):
            os.chmod(os.path.join(path, name), 0o644)
        secret = os.path.join(path, "model-00002-of-00002.safetensors")
        os.chmod(secret, 0o600)
        as_other = ["setpriv", "--reuid", str(OTHER_UID), "--regid", str(OTHER_UID),
                    "--clear-groups"]
        rc, out, err = ctl("build", "mlp", *KV, *checkpoint_args(path),
                           ctl_path=COPY.path(os.path.basename(CTL)), prefix_argv=as_other)
        self.assertEqual(rc, 2, "rc=%d\nstdout:\n%s\nstderr:\n%s" % (rc, out, err))
        self.assertIn("familyctl: %s: Permission denied" % secret, err)
        # The same files, readable: that uid builds from them, and the daemon served on.
        os.chmod(secret, 0o644)
        rc, out, err = ctl("--json", "build", "mlp", *KV, *checkpoint_args(path),
                           ctl_path=COPY.path(os.path.basename(CTL)), prefix_argv=as_other)
        self.assertEqual(rc, 0, err)
        b = json.loads(out)["build"]
        self.addCleanup(ctl, "unpin", b["buildId"], ctl_path=COPY.path(os.path.basename(CTL)),
                        prefix_argv=as_other)
        self.check_shards(b, want, [0])

    def test_daemon_refuses_a_prefix_without_tensors(self):
        path = os.path.join(TMP, "wrong-prefix")
        write_checkpoint(path, seed=61)
        rc, out, err = ctl("build", "mlp", *KV, *checkpoint_args(path, "model.layers.7.mlp"))
        self.assertEqual(rc, 1, "rc=%d\nstderr:\n%s" % (rc, err))
        self.assertIn("NOT_FOUND", err)
        self.assertIn("CHECKPOINT_TENSOR_MISSING", err)
        self.assertIn("model.layers.7.mlp.", err)

    def test_no_shard_socket(self):
        path = os.path.join(TMP, "no-socket")
        write_checkpoint(path, seed=71)
        nowhere = os.path.join(TMP, "no-shard.sock")
        rc, out, err = ctl("build", "mlp", *KV, "--materialize", "--checkpoint", path,
                           "--shard-socket", nowhere)
        self.assertEqual(rc, 3, err)
        self.assertIn("cannot reach the shard socket %s" % nowhere, err)

    def test_help_names_the_options(self):
        out = self.ok("build", "--help")
        for opt in ("--checkpoint PATH", "--prefix P", "--shard-socket PATH"):
            self.assertIn(opt, out)


def ctl_on_terminal(*args, timeout=300):
    """familyctl with stderr on a pseudo-terminal: (status, stdout, what the terminal got)."""
    return H.run_on_terminal([CTL, "--socket", D.socket] + list(args), timeout=timeout)


class TestProgressBar(unittest.TestCase):
    def test_bar_counts_bytes_read(self):
        # 96 MiB of float16 into 192 MiB of float32 shards: seconds of reading in a debug
        # build, long enough for the bar's watch to find the Build.
        hidden, inter = 2048, 8192
        path = os.path.join(TMP, "big")
        os.makedirs(path)
        rng = np.random.default_rng(81)
        save_file({"m.%s.weight" % p: rng.standard_normal(s, dtype=np.float32).astype(np.float16)
                   for p, s in (("gate_proj", (inter, hidden)), ("up_proj", (inter, hidden)),
                                ("down_proj", (hidden, inter)))},
                  os.path.join(path, "model.safetensors"))
        rc, out, term = ctl_on_terminal(
            "build", "mlp", "hidden_size=%d" % hidden, "intermediate_size=%d" % inter,
            "initializer_range=0.02", "--private", *checkpoint_args(path, "m"))
        for line in out.splitlines():
            if line.startswith("build id "):
                self.addCleanup(ctl, "release", line.split()[-1], "--force")
        self.assertEqual(rc, 0, term)
        self.assertIn("reading [", term)
        self.assertNotIn("filling [", term)
        self.assertRegex(term, r"\d+%  [\d.]+ \w*B of 96\.0 MiB  [\d.]+ \w*B/s")
        self.assertTrue(term.endswith("\r\x1b[K"), repr(term[-80:]))
        self.assertIn("materialized", out)


if __name__ == "__main__":
    unittest.main(verbosity=2)
