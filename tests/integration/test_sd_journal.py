#!/usr/bin/python3
"""familyd's log under systemd: native journal messages with fields, else stderr.

familyd decides as systemd.exec(5) documents: JOURNAL_STREAM names the device and inode of the
stream the manager connected stderr to; only when it matches stderr does familyd log to the
journal (sd_journal_sendv to /run/systemd/journal/socket). To see what it sends, the daemon
runs in a private mount namespace (unshare, root only) where /run/systemd/journal is a folder of
ours holding a datagram socket that plays journald.

- journal: PRIORITY, MESSAGE, SYSLOG_IDENTIFIER, CODE_FILE/LINE/FUNC, and
  BUILD_ID/FAMILY/MESH_ID on Build and ReleaseBuild, REGISTRY_GENERATION on reload; nothing
  on stderr;
- no journal socket, or one that refuses: the same lines on stderr with "<N>" priority
  prefixes, which the journal's stream reads;
- JOURNAL_STREAM naming another file (stderr was redirected): plain "familyd: info: ..."
  lines on stderr, nothing to the journal.
"""

import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402

REGISTRY = os.path.join(H.CONFORMANCE, "registry")
GE_SMALL = {"num_experts": 4, "hidden_size": 8, "moe_intermediate_size": 4,
            "initializer_range": 0.02}
UNSHARE = shutil.which("unshare")
P = None

# In the namespace: a tmpfs over /run (private to it), with our folder as the journal's.
NAMESPACE_SCRIPT = ('mount -t tmpfs -o mode=0755 tmpfs /run && mkdir -p /run/systemd/journal && '
                    'mount --bind "$0" /run/systemd/journal && exec "$@"')


def setUpModule():
    global P
    P = H.Protos()


def parse_native(data):
    """Fields of one native journal datagram (KEY=value lines, or KEY, le64 size, bytes)."""
    fields, i = {}, 0
    while i < len(data):
        nl = data.index(b"\n", i)
        line = data[i:nl]
        if b"=" in line:
            k, _, v = line.partition(b"=")
            i = nl + 1
        else:
            k = line
            (n,) = struct.unpack("<Q", data[nl + 1:nl + 9])
            v = data[nl + 9:nl + 9 + n]
            i = nl + 9 + n + 1
        fields[k.decode()] = v.decode("utf-8", "replace")
    return fields


def namespace_works():
    if not UNSHARE or os.geteuid() != 0:
        return False
    r = subprocess.run([UNSHARE, "--mount", "--propagation", "private", "sh", "-c",
                        "mount -t tmpfs tmpfs /run"], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    return r.returncode == 0


class Base(unittest.TestCase):
    def setUp(self):
        self.tmp = H.short_tmpdir("fd-jrnl-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.jdir = os.path.join(self.tmp, "journal")
        os.mkdir(self.jdir)
        self.socket = os.path.join(self.tmp, "api.sock")
        self.err_path = os.path.join(self.tmp, "familyd.err")
        self.receiver = None
        self.received = []
        self.reader = None
        self.proc = None

    def tearDown(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.receiver:
            self.receiver.shutdown(socket.SHUT_RDWR)
            self.reader.join(5)
            self.receiver.close()

    def listen_journal(self):
        # Read as journald does, all the time: a datagram socket queues only
        # net.unix.max_dgram_qlen (often 10) unread messages, and a sender then blocks.
        self.receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.receiver.bind(os.path.join(self.jdir, "socket"))
        self.receiver.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.reader = threading.Thread(target=self.read_journal, daemon=True)
        self.reader.start()

    def read_journal(self):
        while True:
            try:
                data = self.receiver.recv(1 << 20)
            except OSError:
                return
            if not data:
                return
            self.received.append(parse_native(data))

    def journal(self):
        time.sleep(0.2)  # what was sent before now has been read
        out, self.received[:] = list(self.received), []
        return out

    def stderr(self):
        with open(self.err_path, errors="replace") as f:
            return f.read()

    def start(self, journal_stream, namespace=True):
        """familyd with stderr to a file; journal_stream: 'stderr', 'other' or None."""
        err = open(self.err_path, "wb")
        env = dict(os.environ)
        env.pop("JOURNAL_STREAM", None)
        if journal_stream:
            target = err.fileno()
            if journal_stream == "other":
                other = os.path.join(self.tmp, "other")
                open(other, "w").close()
                target = os.open(other, os.O_RDONLY)
            st = os.fstat(target)
            env["JOURNAL_STREAM"] = "%d:%d" % (st.st_dev, st.st_ino)
            if journal_stream == "other":
                os.close(target)
        # --build-grace-ms 0: the last release frees a build, and logs it, at once.
        argv = [H.familyd_bin(), "--socket", self.socket, "--registry", REGISTRY,
                "--host-devices", "2", "--build-grace-ms", "0"]
        if namespace:
            argv = [UNSHARE, "--mount", "--propagation", "private", "sh", "-c",
                    NAMESPACE_SCRIPT, self.jdir, *argv]
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=err,
                                     stdin=subprocess.DEVNULL)
        err.close()
        deadline = time.monotonic() + H.START_TIMEOUT
        while not H.socket_accepts(self.socket):
            self.assertIsNone(self.proc.poll(), "familyd exited:\n" + self.stderr())
            self.assertLess(time.monotonic(), deadline, self.stderr())
            time.sleep(0.05)
        self.client = H.Client(self.socket, P)
        self.addCleanup(self.client.close)

    def stop(self):
        self.client.close()
        self.proc.send_signal(signal.SIGTERM)
        self.assertEqual(self.proc.wait(H.STOP_TIMEOUT), 0, self.stderr())

    def build_and_release(self, mesh_id=""):
        req = P.cls("familyd.v1.BuildRequest")(family="grouped_experts", mesh_id=mesh_id)
        req.config.SetInParent()
        for k, v in GE_SMALL.items():
            req.config.fields[k].CopyFrom(P.value(v))
        req.materialize.enabled = True
        res = self.client.call("familyd.v1.FamilyService/Build", req)
        self.assertTrue(res.ok, res)
        bid = res.reply.build.build_id
        rel = self.client.call("familyd.v1.FamilyService/ReleaseBuild", {"buildId": bid})
        self.assertTrue(rel.ok, rel)
        return bid


@unittest.skipUnless(namespace_works(), "needs root and unshare --mount (a private /run)")
class TestJournal(Base):
    def test_native_messages_with_fields(self):
        self.listen_journal()
        self.start("stderr")
        bid = self.build_and_release()
        mesh = self.client.call("familyd.v1.MeshService/CreateMesh",
                                {"mesh": {"deviceMesh": [{"name": "ep", "size": "2"}]}})
        self.assertTrue(mesh.ok, mesh)
        mesh_id = mesh.reply.mesh_id
        mesh_bid = self.build_and_release(mesh_id)
        res = self.client.call("familyd.v1.AdminService/Reload", {})
        self.assertTrue(res.ok, res)
        bad = self.client.call("familyd.v1.FamilyService/GetBuild", {"buildId": "bld-nope"})
        self.assertFalse(bad.ok)
        self.stop()
        msgs = self.journal()
        self.assertTrue(msgs, "nothing reached the journal; stderr:\n" + self.stderr())

        serving = [m for m in msgs if m.get("MESSAGE", "").startswith("familyd serving")]
        self.assertEqual(len(serving), 1, msgs)
        m = serving[0]
        self.assertEqual(m["PRIORITY"], "6")
        self.assertEqual(m["SYSLOG_IDENTIFIER"], "familyd")
        self.assertTrue(m["CODE_FILE"].endswith("daemon.c"), m)
        self.assertTrue(m["CODE_LINE"].isdigit(), m)
        self.assertEqual(m["CODE_FUNC"], "daemon_run")

        created = [m for m in msgs if m.get("BUILD_ID") == bid and "created" in m["MESSAGE"]]
        released = [m for m in msgs if m.get("BUILD_ID") == bid and "released" in m["MESSAGE"]]
        self.assertEqual(len(created), 1, msgs)
        self.assertEqual(len(released), 1, msgs)
        for m in created + released:
            self.assertEqual(m["FAMILY"], "grouped_experts")
            self.assertNotIn("MESH_ID", m, "a build without a mesh names none")
        on_mesh = [m for m in msgs if m.get("BUILD_ID") == mesh_bid]
        self.assertEqual(len(on_mesh), 2, msgs)
        for m in on_mesh:
            self.assertEqual(m["MESH_ID"], mesh_id)
        reloaded = [m for m in msgs if m.get("REGISTRY_GENERATION") == "2"]
        self.assertEqual(len(reloaded), 1, msgs)
        self.assertIn("Registry reloaded", reloaded[0]["MESSAGE"])
        stopping = [m for m in msgs if "SIGTERM" in m.get("MESSAGE", "")]
        self.assertEqual(len(stopping), 1, msgs)

        # Nothing went to stderr as well: one place per line.
        self.assertNotIn("familyd serving", self.stderr())
        self.assertNotIn(bid, self.stderr())
        print("journal: %d messages, e.g. %r" % (len(msgs), {k: v for k, v in created[0].items()}))

    def test_refusing_journal_falls_back_to_prefixed_stderr(self):
        # A socket file nobody listens on: sends fail (ECONNREFUSED), stderr takes the lines.
        dead = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        dead.bind(os.path.join(self.jdir, "socket"))
        dead.close()
        self.start("stderr")
        self.stop()
        err = self.stderr()
        self.assertIn("<6>familyd serving %s" % self.socket, err)
        self.assertIn("<6>Received SIGTERM, stopping.", err)

    def test_no_journal_socket_prefixed_stderr(self):
        # stderr is the journal's stream, but there is no native socket (journald without
        # it): "<N>" lines, which the stream reads as priorities.
        self.start("stderr")
        self.stop()
        err = self.stderr()
        self.assertIn("<6>familyd serving %s" % self.socket, err)
        for line in err.splitlines():
            self.assertRegex(line, r"^<\d>", "every line carries its priority")

    def test_journal_stream_of_another_file_stays_on_stderr(self):
        self.listen_journal()
        self.start("other")
        self.stop()
        self.assertEqual(self.journal(), [])
        err = self.stderr()
        self.assertIn("familyd: info: familyd serving %s" % self.socket, err)
        self.assertNotIn("<6>", err)


class TestWithoutNamespace(Base):
    def test_no_journal_stream_plain_stderr(self):
        self.start(None, namespace=False)
        self.stop()
        err = self.stderr()
        self.assertIn("familyd: info: familyd serving %s" % self.socket, err)
        self.assertNotIn("<6>", err)

    def test_journal_stream_elsewhere_plain_stderr(self):
        self.start("other", namespace=False)
        self.stop()
        self.assertIn("familyd: info: familyd serving %s" % self.socket, self.stderr())


if __name__ == "__main__":
    unittest.main(verbosity=2)
