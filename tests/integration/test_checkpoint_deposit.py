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


if __name__ == "__main__":
    unittest.main(verbosity=2)
