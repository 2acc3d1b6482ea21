#!/usr/bin/python3
"""The Python client's checkpoint deposits (familyd.Client.deposit_checkpoint, checkpoint_token,
build(checkpoint=...), familyd.torch.build_module(checkpoint=...), load_pretrained's refusals).

1. Which files a path deposits, and the client's own refusals (no daemon involved): a missing
   path, a directory without .safetensors files, two indexes, more than 253 files, a FIFO; a
   directory's index first, then its regular .safetensors files sorted, symbolic links to files
   followed, other entries left out. A file that the caller cannot read (root's 0600 file, the
   client run as uid 65534 through setpriv) raises PermissionError naming it: the daemon never
   opens a checkpoint, so a caller deposits only what it can read.
2. The wire, checked by a peer in this test that speaks proto/familyd/v1/shard.proto from the
   proto alone: one frame ShardFdRequest{checkpoint_files} whose first bytes carry one
   descriptor per name, in order, as SCM_RIGHTS, each the named file open read-only; the
   client keeps no descriptor after the answer; a refusal is a ShardError.
3. With the real daemon (deploy/registry): a deposit's token, the token cache (one deposit per
   path while its files are the same; a changed file deposits again; a token the daemon does not
   know is deposited again and the Build asked once more), Build's errors for an unknown token
   (NOT_FOUND CHECKPOINT_TOKEN) and a checkpoint without materialize (INVALID_ARGUMENT
   BINDING), tensors named as the member's parameters (checkpoint_names="parameters"), and
   build_module(checkpoint=PATH, checkpoint_prefix="model.layers.0.mlp") whose parameters are
   the checkpoint's tensors; load_pretrained in one process (mesh=None) with the logits of
   plain torch, and a tied head built from model.embed_tokens.weight.
"""

import array
import fcntl
import os
import shutil
import socket
import stat
import struct
import subprocess
import sys
import threading
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import familyd_harness as H  # noqa: E402
import checkpoint_files as CF  # noqa: E402
import other_uid  # noqa: E402

sys.path.insert(0, os.path.join(H.SOURCE_ROOT, "client", "python"))
import familyd  # noqa: E402
from familyd import shard as S  # noqa: E402

REGISTRY = os.path.join(H.SOURCE_ROOT, "deploy", "registry")
CONFIG = {"vocab_size": 16, "hidden_size": 8, "num_attention_heads": 2,
          "num_key_value_heads": 2, "head_dim": 4, "intermediate_size": 12,
          "initializer_range": 0.02, "rms_norm_eps": 1e-6}
P = None
TMP = None


def setUpModule():
    global P, TMP
    P = H.Protos()
    TMP = H.short_tmpdir("fd-ckpt-deposit-")
    os.chmod(TMP, 0o755)


def tearDownModule():
    if TMP:
        shutil.rmtree(TMP, ignore_errors=True)


def touch(path, data=b"x"):
    with open(path, "wb") as f:
        f.write(data)
    return path


def open_under(folder):
    """This process's descriptors open on files under folder."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(os.path.join("/proc/self/fd", fd))
        except OSError:
            continue        # the listing's own descriptor, gone
        if target.startswith(folder + "/"):
            out.append(target)
    return out


class WhichFiles(unittest.TestCase):
    def dir(self, name):
        d = os.path.join(TMP, name)
        os.makedirs(d)
        return d

    def test_a_file_alone(self):
        d = self.dir("single")
        f = touch(os.path.join(d, "model.safetensors"))
        touch(os.path.join(d, "other.safetensors"))
        self.assertEqual(S.checkpoint_files(f), (d, ["model.safetensors"]))

    def test_a_directory_index_first_then_sorted_regular_files(self):
        d = self.dir("mixed")
        for n in ("b.safetensors", "a.safetensors", "model.safetensors.index.json",
                  "readme.txt", "config.json"):
            touch(os.path.join(d, n))
        os.mkdir(os.path.join(d, "sub.safetensors"))                  # a directory: left out
        os.mkfifo(os.path.join(d, "pipe.safetensors"))                # a FIFO: left out
        os.symlink("missing", os.path.join(d, "dangling.safetensors"))  # no file: left out
        blob = touch(os.path.join(TMP, "blob-c"))                      # the HF cache's layout
        os.symlink(blob, os.path.join(d, "c.safetensors"))
        self.assertEqual(S.checkpoint_files(d),
                         (d, ["model.safetensors.index.json", "a.safetensors", "b.safetensors",
                              "c.safetensors"]))
        files = S.open_checkpoint(d)
        try:
            self.assertEqual([n for n, _ in files], S.checkpoint_files(d)[1])
            self.assertEqual(os.fstat(files[3][1]).st_ino, os.stat(blob).st_ino)
            for name, fd in files:
                self.assertEqual(os.get_blocking(fd), True, name)
                self.assertEqual(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE, os.O_RDONLY)
        finally:
            for _, fd in files:
                os.close(fd)

    def test_missing_path(self):
        path = os.path.join(TMP, "nowhere")
        with self.assertRaises(FileNotFoundError) as cm:
            S.open_checkpoint(path)
        self.assertEqual(cm.exception.filename, path)

    def test_directory_without_safetensors(self):
        d = self.dir("empty")
        touch(os.path.join(d, "model.safetensors.index.json"))
        with self.assertRaises(familyd.CheckpointError) as cm:
            S.checkpoint_files(d)
        self.assertEqual(str(cm.exception),
                         "checkpoint directory %s has no .safetensors files" % d)
        self.assertIsInstance(cm.exception, ValueError)

    def test_two_indexes(self):
        d = self.dir("two-indexes")
        for n in ("a.safetensors", "model.safetensors.index.json", "other.index.json"):
            touch(os.path.join(d, n))
        with self.assertRaises(familyd.CheckpointError) as cm:
            S.checkpoint_files(d)
        self.assertEqual(str(cm.exception),
                         "checkpoint directory %s has 2 index files (model.safetensors.index.json,"
                         " other.index.json): keep one" % d)

    def test_at_most_253_files(self):
        d = self.dir("many")
        touch(os.path.join(d, "model.safetensors.index.json"))
        for i in range(252):
            touch(os.path.join(d, "m-%03d.safetensors" % i))
        self.assertEqual(len(S.checkpoint_files(d)[1]), 253)
        touch(os.path.join(d, "m-252.safetensors"))
        with self.assertRaises(familyd.CheckpointError) as cm:
            S.checkpoint_files(d)
        self.assertEqual(str(cm.exception), "checkpoint directory %s has 254 files to deposit, "
                         "more than the 253 one deposit carries" % d)

    def test_neither_file_nor_directory(self):
        fifo = os.path.join(TMP, "fifo.safetensors")
        os.mkfifo(fifo)
        with self.assertRaises(familyd.CheckpointError) as cm:
            S.open_checkpoint(fifo)
        self.assertIn("is neither a regular file nor a directory", str(cm.exception))

    def test_unreadable_file_for_another_uid(self):
        # Root's 0600 file in a folder every uid may enter: uid 65534's client cannot open it,
        # and says which file; the readable one beside it is not left open.
        d = self.dir("private")
        os.chmod(d, 0o755)
        touch(os.path.join(d, "a.safetensors"))
        os.chmod(os.path.join(d, "a.safetensors"), 0o644)
        secret = touch(os.path.join(d, "b.safetensors"))
        os.chmod(secret, 0o600)
        code = ("import sys, os; sys.path.insert(0, %r)\n"
                "from familyd import shard\n"
                "before = len(os.listdir('/proc/self/fd'))\n"
                "try:\n"
                "    shard.open_checkpoint(%r)\n"
                "except PermissionError as e:\n"
                "    after = len(os.listdir('/proc/self/fd'))\n"
                "    print('PermissionError', e.filename, after - before)\n")
        with other_uid.harness_copy(package=True) as copy:
            argv = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
                    other_uid.other_uid_python(), "-c",
                    code % (os.path.join(copy.root, "client", "python"), d)]
            r = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                               env=other_uid.harness_env(copy), cwd=copy.root)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.split(), ["PermissionError", secret, "0"], r.stderr)


class Peer:
    """A shard socket peer written from proto/familyd/v1/shard.proto: reads one frame with its
    descriptors, answers `reply`. .first_fds: the descriptors that came with the first read;
    .names; .stats: fstat of each descriptor; .modes: each one's access mode."""

    def __init__(self, reply):
        self.path = os.path.join(TMP, "peer-%d.sock" % id(self))
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(self.path)
        self.server.listen(1)
        self.reply = reply
        self.error = None
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self):
        try:
            conn, _ = self.server.accept()
            with conn:
                conn.settimeout(10)
                space = socket.CMSG_SPACE(253 * 4)
                data, anc, flags, _ = conn.recvmsg(4, space)
                fds = []
                for level, typ, cdata in anc:
                    if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
                        a = array.array("i")
                        a.frombytes(cdata[:len(cdata) - len(cdata) % 4])
                        fds.extend(a)
                self.first_fds = len(fds)
                while len(data) < 4:
                    data += conn.recv(4 - len(data))
                (n,) = struct.unpack("<I", data)
                body = b""
                while len(body) < n:
                    more, anc, _, _ = conn.recvmsg(n - len(body), space)
                    self.late_fds = bool(anc)
                    body += more
                req = P.cls("familyd.v1.ShardFdRequest").FromString(body)
                self.names = list(req.checkpoint_files)
                self.tokens = list(req.tokens)
                self.stats = [os.fstat(fd) for fd in fds]
                self.modes = [fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE for fd in fds]
                for fd in fds:
                    os.close(fd)
                payload = self.reply.SerializeToString()
                conn.sendall(struct.pack("<I", len(payload)) + payload)
        except BaseException as e:  # noqa: B902 - reported by the test's thread
            self.error = e

    def close(self):
        self.thread.join(10)
        self.server.close()
        os.unlink(self.path)
        if self.error is not None:
            raise self.error


class Wire(unittest.TestCase):
    def setUp(self):
        self.dir = os.path.join(TMP, "wire-%s" % self._testMethodName)
        os.makedirs(self.dir)
        for n in ("model-00002-of-00002.safetensors", "model-00001-of-00002.safetensors",
                  "model.safetensors.index.json"):
            touch(os.path.join(self.dir, n), n.encode())

    def test_one_frame_with_the_descriptors_on_its_first_bytes(self):
        token = "0123456789abcdef" * 2
        peer = Peer(P.cls("familyd.v1.ShardFdReply")(code=0, checkpoint_token=token))
        client = familyd.Client(os.path.join(TMP, "api.sock"), shard_socket=peer.path)
        self.assertEqual(client.deposit_checkpoint(self.dir), token)
        peer.close()
        self.assertEqual(open_under(self.dir), [], "the client left descriptors open")
        client.close()
        names = ["model.safetensors.index.json", "model-00001-of-00002.safetensors",
                 "model-00002-of-00002.safetensors"]
        self.assertEqual(peer.names, names)
        self.assertEqual(peer.tokens, [])
        self.assertEqual(peer.first_fds, 3)
        self.assertFalse(getattr(peer, "late_fds", False))
        for name, st, mode in zip(names, peer.stats, peer.modes):
            want = os.stat(os.path.join(self.dir, name))
            self.assertEqual((st.st_dev, st.st_ino), (want.st_dev, want.st_ino), name)
            self.assertTrue(stat.S_ISREG(st.st_mode))
            self.assertEqual(mode, os.O_RDONLY, name)

    def test_a_refusal_is_a_shard_error(self):
        peer = Peer(P.cls("familyd.v1.ShardFdReply")(
            code=8, message="uid 0 holds 16 checkpoint deposits"))
        with self.assertRaises(familyd.ShardError) as cm:
            S.deposit_checkpoint(peer.path, self.dir)
        peer.close()
        self.assertEqual(open_under(self.dir), [])
        self.assertEqual((cm.exception.code_name, cm.exception.message),
                         ("RESOURCE_EXHAUSTED", "uid 0 holds 16 checkpoint deposits"))

    def test_a_reply_without_a_token(self):
        peer = Peer(P.cls("familyd.v1.ShardFdReply")(code=0))
        with self.assertRaises(ValueError) as cm:
            S.deposit_checkpoint(peer.path, self.dir)
        peer.close()
        self.assertIn("without a checkpoint token", str(cm.exception))


class Daemon(unittest.TestCase):
    """The real daemon. A uid holds at most 64 deposits: this class makes 9."""

    @classmethod
    def setUpClass(cls):
        cls.d = H.Daemon(registry=REGISTRY, host_devices=2, node_name="itest-ckpt-deposit",
                         protos=P)
        cls.d.start()
        cls.client = familyd.Client(cls.d.socket, shard_socket=cls.d.shard_socket)
        cls.tensors = CF.llama_tensors(CONFIG, layers=1, seed=3)
        cls.ckpt = os.path.join(TMP, "daemon-ckpt")
        CF.write_checkpoint(cls.ckpt, cls.tensors, "F32", files=2)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.d.stop_checked()

    def mlp(self, **kw):
        return self.client.build("mlp", CONFIG, checkpoint_prefix="model.layers.0.mlp",
                                 private_build=True, **kw)

    def check_mlp(self, b):
        for name in ("gate_proj", "up_proj", "down_proj"):
            want = self.tensors["model.layers.0.mlp.%s.weight" % name]
            self.assertTrue(np.array_equal(b.ranks[0][name], want), name)

    def test_deposit_a_file_and_a_directory(self):
        one = os.path.join(TMP, "one.safetensors")
        CF.write_checkpoint(os.path.join(TMP, "one"), self.tensors, "F32", files=1)
        os.rename(os.path.join(TMP, "one", "model.safetensors"), one)
        t1 = self.client.deposit_checkpoint(one)
        t2 = self.client.deposit_checkpoint(self.ckpt)
        for t in (t1, t2):
            self.assertRegex(t, r"^[0-9a-f]{32}$")
        self.assertNotEqual(t1, t2)
        with self.mlp(checkpoint=t1) as b:
            self.check_mlp(b)

    def test_token_cache(self):
        path = os.path.join(TMP, "cached")
        CF.write_checkpoint(path, self.tensors, "F32", files=2)
        t = self.client.checkpoint_token(path)
        self.assertEqual(self.client.checkpoint_token(path), t)
        with self.mlp(checkpoint=path) as b:           # the cached token: no new deposit
            self.check_mlp(b)
        self.assertEqual(self.client.checkpoint_token(path), t)
        # A file whose modification time changed is deposited again.
        name = os.path.join(path, "model-00001-of-00002.safetensors")
        st = os.stat(name)
        os.utime(name, ns=(st.st_atime_ns, st.st_mtime_ns + 10 ** 9))
        t2 = self.client.checkpoint_token(path)
        self.assertNotEqual(t2, t)
        # A cached token the daemon does not know: build() deposits the path again, once.
        key = (self.d.shard_socket, os.path.abspath(path))
        identity, _ = self.client._deposits[key]
        self.client._deposits[key] = (identity, "f" * 32)
        with self.mlp(checkpoint=path) as b:
            self.check_mlp(b)
        self.assertNotIn(self.client._deposits[key][1], (t, t2, "f" * 32))

    def test_tensors_named_as_parameters(self):
        # checkpoint_names="parameters": "{prefix}.<parameter>", no registry names involved.
        path = os.path.join(TMP, "by-parameter.safetensors")
        named = {"blk.%s" % n: self.tensors["model.layers.0.mlp.%s.weight" % n]
                 for n in ("gate_proj", "up_proj", "down_proj")}
        from safetensors.numpy import save_file
        save_file(named, path)
        with self.client.build("mlp", CONFIG, private_build=True, checkpoint=path,
                               checkpoint_prefix="blk", checkpoint_names="parameters") as b:
            self.check_mlp(b)
        with self.assertRaises(familyd.FamilydError) as cm:   # registry names: not there
            self.client.build("mlp", CONFIG, private_build=True, checkpoint=path,
                              checkpoint_prefix="blk")
        self.assertEqual((cm.exception.code_name, cm.exception.reason),
                         ("NOT_FOUND", "CHECKPOINT_TENSOR_MISSING"))
        self.assertIn("blk.gate_proj.weight", cm.exception.message)

    def test_unknown_token(self):
        with self.assertRaises(familyd.FamilydError) as cm:
            self.mlp(checkpoint="0" * 32)
        self.assertEqual((cm.exception.code_name, cm.exception.reason),
                         ("NOT_FOUND", "CHECKPOINT_TOKEN"))

    def test_checkpoint_without_materialize(self):
        with self.assertRaises(familyd.FamilydError) as cm:
            self.client.build("mlp", CONFIG, materialize=False, checkpoint=self.ckpt,
                              checkpoint_prefix="model.layers.0.mlp")
        self.assertEqual((cm.exception.code_name, cm.exception.reason),
                         ("INVALID_ARGUMENT", "BINDING"))

    def test_prefix_without_checkpoint(self):
        with self.assertRaises(ValueError):
            self.client.build("mlp", CONFIG, checkpoint_prefix="model.layers.0.mlp")
        with self.assertRaises(ValueError):
            self.client.build("mlp", CONFIG, checkpoint_names="parameters")

    def test_build_module_from_a_checkpoint(self):
        import torch
        import familyd.torch as FT

        m = FT.build_module(self.client, "mlp", CONFIG, checkpoint=self.ckpt,
                            checkpoint_prefix="model.layers.0.mlp", fqn="model.layers.0.mlp")
        try:
            for name in ("gate_proj", "up_proj", "down_proj"):
                want = torch.from_numpy(self.tensors["model.layers.0.mlp.%s.weight" % name])
                self.assertTrue(torch.equal(getattr(m, name).detach(), want), name)
            info = FT.build_info(m)
            self.assertEqual(info.request.checkpoint.prefix, "model.layers.0.mlp")
            self.assertEqual(info.request.checkpoint.token,
                             self.client.checkpoint_token(self.ckpt))
            x = torch.randn(3, CONFIG["hidden_size"])
            g = torch.from_numpy
            t = self.tensors
            p = "model.layers.0.mlp."
            want = (torch.nn.functional.silu(x @ g(t[p + "gate_proj.weight"]).T)
                    * (x @ g(t[p + "up_proj.weight"]).T)) @ g(t[p + "down_proj.weight"]).T
            self.assertTrue(torch.allclose(m(x), want, rtol=1e-5, atol=1e-6))
        finally:
            FT.release(m)

    def test_load_pretrained_in_one_process(self):
        # mesh=None: the whole model here; logits as plain torch's (test_checkpoint_torch's
        # reference). A tied head is a second build of model.embed_tokens.weight.
        import torch
        import familyd.torch as FT
        import test_checkpoint_torch as TT

        cfg = dict(TT.CONFIG, num_hidden_layers=1, torch_dtype="float32")
        for tie in (False, True):
            with self.subTest(tie=tie):
                path = os.path.join(TMP, "pretrained-tie-%d" % tie)
                tensors = CF.llama_tensors(cfg, layers=1, seed=11, tie=tie)
                CF.write_checkpoint(path, tensors, "F32", files=2,
                                    config=dict(cfg, tie_word_embeddings=tie))
                model = FT.load_pretrained(self.client, path)
                try:
                    head = FT.build_info(model.lm_head)
                    self.assertEqual(head.request.checkpoint.prefix,
                                     "model.embed_tokens" if tie else "lm_head")
                    want = tensors["model.embed_tokens.weight" if tie else "lm_head.weight"]
                    self.assertTrue(torch.equal(model.lm_head.weight.detach(),
                                                torch.from_numpy(want)))
                    self.assertEqual(model.layers[0].self_attn.rope_theta, cfg["rope_theta"])
                    if not tie:
                        with torch.no_grad():
                            got = model(TT.tokens()).numpy()
                        ref, _ = TT.reference(path, TT.tokens())
                        scale = float(np.abs(ref).max())
                        self.assertLessEqual(float(np.abs(got - ref).max()), 1e-5 * scale)
                finally:
                    FT.release(model)

    def test_load_pretrained_refusals(self):
        import familyd.torch as FT

        with self.assertRaises(FT.PretrainedError) as cm:
            FT.load_pretrained(self.client, self.ckpt)          # no config.json
        self.assertIn("no config.json", str(cm.exception))
        cfg = dict(CONFIG, num_hidden_layers=1, rope_scaling={"rope_type": "llama3"})
        with self.assertRaises(FT.PretrainedError) as cm:
            FT.load_pretrained(self.client, self.ckpt, config=cfg)
        self.assertIn("rope_scaling", str(cm.exception))
        with self.assertRaises(FT.PretrainedError) as cm:
            FT.load_pretrained(self.client, self.ckpt, config={"hidden_size": 8})
        self.assertIn("lacks vocab_size", str(cm.exception))


if __name__ == "__main__":
    unittest.main(verbosity=2)
