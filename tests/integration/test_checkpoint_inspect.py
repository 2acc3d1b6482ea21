#!/usr/bin/python3
"""familyctl checkpoint inspect: safetensors checkpoints read by familyd's own parser
(common/safetensors.c), checked against independent writers and readers.

Oracles: a tiny Llama saved by transformers' `save_pretrained` (sharded: an index and several
files), files written by the safetensors library (numpy and torch, BF16 included), and each
file's header decoded here with Python's json. Every tensor's dtype, shape, bytes, file and
offset must be theirs. Then malformed checkpoints the test writes byte by byte (truncated, a
header length past the end, a 100 MiB header, overlapping offsets, a shape that disagrees with
its bytes, an unknown dtype, duplicate names, an index naming a missing file or `../x`, an
index and files that disagree), each refused with exit status 2 and a message naming the file
and the tensor; a symbolic link to a file (the Hugging Face cache's layout) is followed.
Needs no daemon.
"""

import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

import numpy as np
import torch
from safetensors import safe_open
from safetensors.numpy import save_file as save_numpy
from safetensors.torch import save_file as save_torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402

CTL = H.familyctl_bin()

TORCH_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16",
                torch.float64: "F64", torch.int64: "I64", torch.int32: "I32", torch.int16: "I16",
                torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL",
                torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2"}


def inspect(path, *args):
    return subprocess.run([CTL, "checkpoint", "inspect", *args, path], capture_output=True,
                          text=True, timeout=60)


def inspect_json(path):
    r = inspect(path, "--json")
    if r.returncode != 0:
        raise AssertionError("exit %d: %s" % (r.returncode, r.stderr))
    return json.loads(r.stdout)


def header_of(path):
    """The file's header, decoded here: (N, {name: entry})."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return n, json.loads(f.read(n))


def expected(directory, files):
    """What inspect must print for these files, from the safetensors library and the raw
    headers: {name: (dtype, shape, bytes, file, offset)}."""
    out = {}
    for name in files:
        path = os.path.join(directory, name)
        n, header = header_of(path)
        with safe_open(path, framework="pt") as f:
            for key in f.keys():
                t = f.get_tensor(key)
                begin, end = header[key]["data_offsets"]
                out[key] = (TORCH_DTYPES[t.dtype], list(t.shape),
                            t.numel() * t.element_size(), name, 8 + n + begin)
                assert end - begin == t.numel() * t.element_size()
    return out


def got(doc, directory=None):
    return {t["name"]: (t["dtype"], t["shape"], t["bytes"],
                        os.path.basename(t["file"]) if directory is None else t["file"],
                        t["offset"]) for t in doc["tensors"]}


def write_raw(path, header, data=b"", length=None):
    """A file of a header (a dict, or raw bytes) and data, with a length field of our own."""
    body = header if isinstance(header, bytes) else json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(body) if length is None else length))
        f.write(body)
        f.write(data)


class Base(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="familyd-ckpt-")
        self.addCleanup(shutil.rmtree, self.dir)

    def refused(self, path, *words):
        r = inspect(path)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertEqual(r.stdout, "")
        for w in words:
            self.assertIn(w, r.stderr)
        return r.stderr


class TestIndependentWriters(Base):
    def test_transformers_sharded_llama(self):
        from transformers import LlamaConfig, LlamaForCausalLM
        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64,
                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=64, tie_word_embeddings=False)
        model = LlamaForCausalLM(config).to(torch.bfloat16)
        model.save_pretrained(self.dir, max_shard_size="20KB", safe_serialization=True)
        with open(os.path.join(self.dir, "model.safetensors.index.json")) as f:
            index = json.load(f)
        files = sorted(set(index["weight_map"].values()))
        self.assertGreater(len(files), 1, files)
        doc = inspect_json(self.dir)
        want = expected(self.dir, files)
        self.assertEqual(got(doc, self.dir), want)
        self.assertIn("model.layers.1.self_attn.q_proj.weight", want)
        self.assertEqual(want["model.layers.1.self_attn.q_proj.weight"][:3],
                         ("BF16", [32, 32], 32 * 32 * 2))
        self.assertEqual(sorted(f["name"] for f in doc["files"]), files)
        for f in doc["files"]:
            self.assertEqual(f["bytes"], os.path.getsize(os.path.join(self.dir, f["name"])))
            self.assertEqual(f["header_bytes"], header_of(os.path.join(self.dir, f["name"]))[0])
        # The table: one row per tensor, by name, the same cells.
        r = inspect(self.dir, "--noheadings", "--raw")
        self.assertEqual(r.returncode, 0, r.stderr)
        rows = [line.split(" ") for line in r.stdout.splitlines()]
        self.assertEqual([row[0] for row in rows], sorted(want))
        for name, dtype, shape, nbytes, file, offset in rows:
            w = want[name]
            self.assertEqual((dtype, shape, int(nbytes), file, int(offset)),
                             (w[0], "[%s]" % ",".join(map(str, w[1])), w[2], w[3], w[4]))
        r = inspect(self.dir, "-o", "tensor,bytes", "--noheadings")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(len(r.stdout.split()), 2 * len(want))

    def test_safetensors_library_dtypes(self):
        tensors = {
            "f32": torch.arange(12, dtype=torch.float32).reshape(3, 4),
            "bf16": torch.ones(5, 3, dtype=torch.bfloat16),
            "f16": torch.zeros(7, dtype=torch.float16),
            "i64": torch.arange(3),
            "bool": torch.tensor([True, False, True]),
            "fp8": torch.zeros(4, 4, dtype=torch.float8_e4m3fn),
            "scalar": torch.tensor(2.5, dtype=torch.float64),
            "empty": torch.zeros(0, 6, dtype=torch.int8),
        }
        path = os.path.join(self.dir, "t.safetensors")
        save_torch(tensors, path, metadata={"format": "pt", "note": "x"})
        doc = inspect_json(path)
        self.assertEqual(got(doc), expected(self.dir, ["t.safetensors"]))
        self.assertEqual(doc["files"][0]["metadata"], {"format": "pt", "note": "x"})
        self.assertEqual(got(doc)["scalar"][1], [])
        self.assertEqual(got(doc)["empty"][2], 0)

    def test_numpy_single_file_directory_and_symlink(self):
        save_numpy({"a": np.ones((2, 3), np.float32), "b": np.arange(5, dtype=np.int32)},
                   os.path.join(self.dir, "model.safetensors"))
        want = expected(self.dir, ["model.safetensors"])
        self.assertEqual(got(inspect_json(self.dir), self.dir), want)
        # The Hugging Face cache: snapshots/<rev>/model.safetensors -> ../../blobs/<sha>.
        link = os.path.join(self.dir, "link.safetensors")
        os.symlink("model.safetensors", link)
        doc = inspect_json(link)
        self.assertEqual({k: v[:3] for k, v in got(doc).items()},
                         {k: v[:3] for k, v in want.items()})


class TestRefusals(Base):
    GOOD = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
            "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}}

    def file(self, header, data=b"\0" * 12, length=None, name="m.safetensors"):
        path = os.path.join(self.dir, name)
        write_raw(path, header, data, length)
        return path

    def test_good_one_passes(self):
        self.assertEqual(len(inspect_json(self.file(self.GOOD))["tensors"]), 2)

    def test_truncated(self):
        path = self.file(self.GOOD)
        os.truncate(path, os.path.getsize(path) - 3)
        self.refused(path, path, 'tensor "b"', "out of the data's 9 bytes")

    def test_header_length_past_the_end(self):
        path = self.file(self.GOOD, length=4096)
        self.refused(path, path, "its header length 4096 runs past the end of the file")

    def test_header_of_100_mib(self):
        path = self.file(b"{" + b" " * 16, length=100 << 20)
        self.refused(path, "its header length 104857600 is over the limit of 100000000 bytes")

    def test_overlap(self):
        bad = dict(self.GOOD, b={"dtype": "F32", "shape": [1], "data_offsets": [4, 8]})
        self.refused(self.file(bad, data=b"\0" * 8), 'tensors "a" and "b" overlap')

    def test_shape_disagrees_with_bytes(self):
        bad = dict(self.GOOD, a={"dtype": "F32", "shape": [3], "data_offsets": [0, 8]})
        self.refused(self.file(bad), 'tensor "a": shape [3] of F32 is not the 8 bytes')

    def test_unknown_dtype(self):
        bad = dict(self.GOOD, a={"dtype": "Q4_K", "shape": [2], "data_offsets": [0, 8]})
        self.refused(self.file(bad), 'tensor "a" has the unknown dtype "Q4_K"')

    def test_duplicate_names(self):
        body = (b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
                b'"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}')
        self.refused(self.file(body, data=b"\0" * 8), "duplicate", "a")

    def test_hole_and_trailing_bytes(self):
        self.refused(self.file(self.GOOD, data=b"\0" * 16), "the data's last 4 bytes")
        bad = dict(self.GOOD, b={"dtype": "F32", "shape": [1], "data_offsets": [12, 16]})
        self.refused(self.file(bad, data=b"\0" * 16), 'before tensor "b", belong to no tensor')

    def test_not_a_checkpoint(self):
        self.refused(self.dir, "neither model.safetensors.index.json nor model.safetensors")
        self.refused(os.path.join(self.dir, "nope"), "No such file or directory")
        path = os.path.join(self.dir, "text")
        with open(path, "w") as f:
            f.write("hello, world\n")
        self.refused(path, path, "header length")

    def index(self, weight_map):
        with open(os.path.join(self.dir, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": 12}, "weight_map": weight_map}, f)

    def test_index_naming_a_missing_file(self):
        self.file(self.GOOD, name="one.safetensors")
        self.index({"a": "one.safetensors", "b": "two.safetensors"})
        self.refused(self.dir, self.dir + "/two.safetensors", "No such file or directory")

    def test_index_leading_outside(self):
        outside = tempfile.mkdtemp(prefix="familyd-ckpt-outside-")
        self.addCleanup(shutil.rmtree, outside)
        write_raw(os.path.join(outside, "x.safetensors"), self.GOOD, b"\0" * 12)
        self.index({"a": "../%s/x.safetensors" % os.path.basename(outside),
                    "b": "../%s/x.safetensors" % os.path.basename(outside)})
        self.refused(self.dir, "model.safetensors.index.json", 'tensor "a"',
                     "which is not a file name in the index's own directory")
        self.index({"a": "..", "b": ".."})
        self.refused(self.dir, "not a file name")

    def test_index_and_files_disagree(self):
        self.file(self.GOOD, name="one.safetensors")
        self.index({"a": "one.safetensors"})
        self.refused(self.dir, 'tensor "b" of one.safetensors is not in the index')
        self.index({"a": "one.safetensors", "b": "one.safetensors", "c": "one.safetensors"})
        self.refused(self.dir, 'the index puts tensor "c" in one.safetensors, which has no such '
                     'tensor')

    def test_usage(self):
        r = subprocess.run([CTL, "checkpoint"], capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 2)
        self.assertIn("missing subverb: inspect", r.stderr)
        r = subprocess.run([CTL, "checkpoint", "inspect"], capture_output=True, text=True,
                           timeout=30)
        self.assertEqual(r.returncode, 2)
        self.assertIn("missing the checkpoint", r.stderr)
        r = subprocess.run([CTL, "checkpoint", "inspect", "--help"], capture_output=True,
                           text=True, timeout=30)
        self.assertEqual(r.returncode, 0)
        self.assertIn("Usage: familyctl checkpoint inspect", r.stdout)
        self.assertIn("talks to no", r.stdout)
        r = subprocess.run([CTL, "checkpoint", "inspect", "-o", "nope", self.dir],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 2)
        self.assertIn("TENSOR", r.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
