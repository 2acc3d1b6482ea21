#!/usr/bin/python3
"""Faults on the shard socket against the real daemon: clients that connect and stall (silent,
a partial header, a partial frame, a reply with descriptors left unread, and one user holding
more connections than its cap), and clients that announce a frame of 4 GiB (0xFFFFFFFF) or just
over the 64 KiB limit. The offending connection alone is closed (the stalled ones after the
5 s idle timeout), no memory is reserved for announced lengths, and a healthy client
(test_faults_common.HealthyClient) keeps building and fetching shards throughout.

The per-connection mechanics (timeouts made short, back-pressure, the in-flight limit) are unit
tests of the server in tests/unit/test-shard-socket.c; these check the daemon as shipped.
"""

import os
import socket
import struct
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402
import other_uid  # noqa: E402
import shard_client as SC  # noqa: E402
from test_faults_common import REGISTRY, SMALL, HealthyClient, rss_kib, wait_for  # noqa: E402

IDLE_S = 5.0  # SHARD_SOCKET_IDLE_TIMEOUT_MS
PER_UID = 16  # SHARD_SOCKET_MAX_CONNECTIONS_PER_UID


def connect(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    return s


def closed_within(s, timeout):
    """Seconds until the daemon closed s (EOF or reset), reading and dropping what it sent;
    None when it stayed open for timeout."""
    t0 = time.monotonic()
    s.settimeout(0.2)
    while time.monotonic() - t0 < timeout:
        try:
            if s.recv(65536) == b"":
                return time.monotonic() - t0
        except socket.timeout:
            continue
        except ConnectionResetError:
            return time.monotonic() - t0
    return None


class Base(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = H.Daemon(registry=REGISTRY)
        cls.d.start()
        cls.pid = cls.d.proc.pid

    @classmethod
    def tearDownClass(cls):
        try:
            cls.d.stop()
            err = cls.d.stderr()
            assert "runtime error:" not in err and "Sanitizer" not in err, err[-4000:]
        finally:
            cls.d.cleanup()

    def build(self):
        b = self.d.client.call("familyd.v1.FamilyService/Build",
                               {"family": "grouped_experts", "config": SMALL,
                                "materialize": {"enabled": True}})
        self.assertTrue(b.ok, b)
        self.addCleanup(self.d.client.call, "familyd.v1.FamilyService/ReleaseBuild",
                        {"buildId": b.reply.build.build_id})
        return b.reply.build


class TestStalledClients(Base):
    def test_stalled_connections_are_closed_and_others_served(self):
        b = self.build()
        path = self.d.shard_socket
        silent = connect(path)
        partial_header = connect(path)
        partial_header.sendall(b"\x10\x00")
        partial_frame = connect(path)
        body = self.d.protos.cls("familyd.v1.ShardFdRequest")(
            tokens=[b.shards[0].token]).SerializeToString()
        partial_frame.sendall(struct.pack("<I", len(body)) + body[:5])
        # A complete request whose reply (with a descriptor) is never read.
        unread = connect(path)
        unread.sendall(struct.pack("<I", len(body)) + body)
        stalled = [silent, partial_header, partial_frame]
        t0 = time.monotonic()
        with HealthyClient(self.d) as hc:
            # Served meanwhile, on a new connection of the same user.
            reply, fds = SC.fetch(path, self.d.protos, [b.shards[0].token])
            for fd in fds:
                os.close(fd)
            self.assertEqual((reply.code, len(fds)), (0, 1))
            closed_at = []
            for s in stalled:
                took = closed_within(s, IDLE_S + 10 - (time.monotonic() - t0))
                self.assertIsNotNone(took, "a stalled connection is still open")
                closed_at.append(time.monotonic() - t0)
            elapsed = time.monotonic() - t0
        sys.stderr.write("stalled connections closed after %s s\n"
                         % ", ".join("%.2f" % x for x in closed_at))
        self.assertEqual(hc.problems, [])
        self.assertGreaterEqual(elapsed, IDLE_S - 0.5)
        self.assertLess(elapsed, IDLE_S + 5)
        # The unread reply's connection waits for its reader (60 s, SIOCOUTQ; see
        # shard-socket.c): reading it now gets the descriptor.
        unread.settimeout(5)
        data, anc, _, _ = unread.recvmsg(65536, socket.CMSG_SPACE(4 * 4))
        fds = [struct.unpack("i", c[2][:4])[0] for c in anc if c[1] == socket.SCM_RIGHTS]
        for fd in fds:
            os.close(fd)
        self.assertEqual(len(fds), 1)
        for s in stalled + [unread]:
            s.close()

    @unittest.skipUnless(os.geteuid() == 0, "needs root to run a client as another user")
    def test_a_user_over_its_connection_cap_hurts_only_itself(self):
        """A client of another uid (nobody) opens 20 connections and stalls: 16 are held (the
        per-uid cap), 4 closed at once; this uid's clients are served all the while."""
        b = self.build()
        # Let nobody reach the socket (the daemon made it 0660 in a 0700 folder).
        os.chmod(self.d.tmpdir, 0o755)
        os.chmod(self.d.shard_socket, 0o666)
        script = (
            "import socket, sys, time\n"
            "held = []\n"
            "for _ in range(20):\n"
            "    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
            "    s.connect(sys.argv[1]); held.append(s)\n"
            "time.sleep(1.0)\n"
            "closed = 0\n"
            "for s in held:\n"
            "    s.setblocking(False)\n"
            "    try:\n"
            "        closed += s.recv(1) == b''\n"
            "    except BlockingIOError:\n"
            "        pass\n"
            "    except ConnectionResetError:\n"
            "        closed += 1\n"
            "print(closed, flush=True)\n"
            "time.sleep(30)\n")
        p = subprocess.Popen(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                              other_uid.other_uid_python(), "-c", script, self.d.shard_socket],
                             stdout=subprocess.PIPE, cwd="/")
        self.addCleanup(p.stdout.close)
        self.addCleanup(p.wait)
        self.addCleanup(p.kill)
        with HealthyClient(self.d) as hc:
            closed = int(p.stdout.readline() or b"-1")
            for _ in range(5):
                reply, fds = SC.fetch(self.d.shard_socket, self.d.protos, [b.shards[0].token])
                for fd in fds:
                    os.close(fd)
                self.assertEqual((reply.code, len(fds)), (0, 1))
            time.sleep(0.5)
        self.assertEqual(closed, 20 - PER_UID)
        self.assertEqual(hc.problems, [])
        self.assertIn("uid 65534 has %d connections open, the maximum per user" % PER_UID,
                      self.d.stderr())


class TestOversizedLengths(Base):
    def test_length_of_4_gib(self):
        """0xFFFFFFFF: the connection is closed at once, without a reply and without the daemon
        reserving anything for the announced length."""
        rss_before = rss_kib(self.pid)
        took_all = []
        with HealthyClient(self.d) as hc:
            for tail in (b"", b"x" * 1000, struct.pack("<I", 0) * 4):
                s = connect(self.d.shard_socket)
                s.sendall(b"\xff\xff\xff\xff" + tail)
                took = closed_within(s, 3.0)
                s.close()
                self.assertIsNotNone(took, "a 4 GiB frame did not end its connection")
                self.assertLess(took, 2.0)
                took_all.append(took)
            # Many at once: still nothing reserved.
            socks = [connect(self.d.shard_socket) for _ in range(12)]
            for s in socks:
                s.sendall(b"\xff\xff\xff\xff")
            for s in socks:
                self.assertIsNotNone(closed_within(s, 3.0))
                s.close()
        self.assertEqual(hc.problems, [])
        grew = rss_kib(self.pid) - rss_before
        sys.stderr.write("4 GiB lengths: closed after %s s; VmRSS %+.1f MiB\n"
                         % (", ".join("%.3f" % x for x in took_all), grew / 1024.0))
        self.assertLess(grew, 64 * 1024, "the daemon's memory grew by more than 64 MiB")

    def test_lengths_around_the_limit(self):
        b = self.build()
        # 65,537: over the limit, closed without a reply.
        s = connect(self.d.shard_socket)
        s.sendall(struct.pack("<I", 65537) + b"x" * 100)
        s.settimeout(3)
        try:
            self.assertEqual(s.recv(100), b"")
        except ConnectionResetError:
            pass
        s.close()
        # 65,536 bytes of garbage: INVALID_ARGUMENT, then closed.
        with SC.ShardClient(self.d.shard_socket, self.d.protos) as sc:
            sc.send_frame(b"\xff" * 65536)
            payload, fds = sc.recv_frame()
            reply = self.d.protos.cls("familyd.v1.ShardFdReply").FromString(payload)
            self.assertEqual((reply.code, fds), (3, []))
            self.assertEqual(reply.message, "frame could not be decoded as familyd.v1.ShardFdRequest")
            self.assertIsNotNone(closed_within(sc.sock, 3.0))
        # A well-formed request right after, on a new connection.
        reply, fds = SC.fetch(self.d.shard_socket, self.d.protos, [b.shards[0].token])
        for fd in fds:
            os.close(fd)
        self.assertEqual((reply.code, len(fds)), (0, 1))


if __name__ == "__main__":
    unittest.main(verbosity=2)
