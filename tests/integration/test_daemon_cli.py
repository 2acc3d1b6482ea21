#!/usr/bin/python3
"""The daemon's command line, config file and connection cap, through the real binary."""

import os
import shutil
import subprocess
import sys
import time
import unittest

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402

REGISTRY = os.path.join(H.CONFORMANCE, "registry")


def run(*args, timeout=20):
    return subprocess.run([H.familyd_bin(), *args], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=timeout)


class TestCommandLine(unittest.TestCase):
    def test_help_and_version(self):
        r = run("--help")
        self.assertEqual(r.returncode, 0)
        for flag in ("--socket", "--shard-socket", "--registry", "--state-dir", "--host-devices",
                     "--node-name", "--node-rank", "--listen", "--peers", "--shm-budget",
                     "--max-builds", "--heartbeat-ms", "--suspect-ms", "--down-ms",
                     "--forget-after-ms", "--fdstore-max", "--config", "--check-config"):
            self.assertIn(flag, r.stdout)
        r = run("--version")
        self.assertEqual(r.returncode, 0)
        self.assertIn("familyd", r.stdout)

    def test_print_config_prints_the_example_and_is_not_in_help(self):
        r = run("--print-config")
        self.assertEqual((r.returncode, r.stderr), (0, ""))
        self.assertIn("\n#socket = ", r.stdout)
        self.assertIn("\n#max-builds = 1024\n", r.stdout)
        self.assertNotIn("#config =", r.stdout)
        self.assertNotIn("--print-config", run("--help").stdout)

    def test_usage_errors_exit_2(self):
        empty = os.path.join(H.short_tmpdir("fd-cli-"), "empty.conf")
        self.addCleanup(shutil.rmtree, os.path.dirname(empty), True)
        open(empty, "w").close()
        for args, text in ((["--host-devices", "0"], "--host-devices"),
                           (["--host-devices", "x"], "--host-devices"),
                           (["--bogus"], "bogus"),
                           (["stray"], "stray"),
                           (["--check-config=" + empty, "--threads", "0"], "--threads"),
                           (["--check-config", "stray"], "stray"),
                           (["--heartbeat-ms", "500", "--suspect-ms", "100"], "suspect"),
                           (["--membership", "gossip"],
                            "--membership: unknown mode 'gossip' (all-to-all, swim)"),
                           (["--membership", ""], "--membership: unknown mode ''"),
                           (["--membership", "SWIM"], "--membership: unknown mode 'SWIM'")):
            r = run(*args)
            self.assertEqual(r.returncode, 2, (args, r.stderr))
            self.assertIn(text, r.stderr, args)

    def test_etcd_mode_refusals_exit_2_with_a_line(self):
        # etcd mode (--coordinator) against the embedded membership, and its own options: each
        # refused before anything is read or bound, in one line naming the option.
        tmp = H.short_tmpdir("fd-cli-")
        self.addCleanup(shutil.rmtree, tmp, True)
        etcd = ["--coordinator", "etcd://127.0.0.1:2379"]
        cases = (
            (etcd + ["--listen", "127.0.0.1:7100"],
             "--coordinator: not with --listen: in etcd mode daemons open no links to each "
             "other, the membership is in etcd"),
            (etcd + ["--peers", "127.0.0.1:7100"],
             "--coordinator: not with --peers: in etcd mode daemons open no links to each "
             "other, the membership is in etcd"),
            (["--cluster", "c1"], "--cluster: needs --coordinator (the cluster's etcd)"),
            (["--coordinator-ca", "/x/ca.pem"],
             "--coordinator-ca: needs --coordinator (the cluster's etcd)"),
            (["--coordinator-cert", "/x/c.pem", "--coordinator-key", "/x/k.pem"],
             "--coordinator-cert: needs --coordinator (the cluster's etcd)"),
            (["--coordinator", "http://127.0.0.1:2379"],
             "--coordinator: 'http://127.0.0.1:2379' is not etcd://HOST:PORT[,HOST:PORT...] "
             "(at most 16 endpoints, ports 1 to 65535)"),
            (["--coordinator", "etcd://127.0.0.1"], "is not etcd://HOST:PORT"),
            (["--coordinator", "etcd://127.0.0.1:2379,"], "is not etcd://HOST:PORT"),
            (["--coordinator", "etcd://127.0.0.1:0"], "is not etcd://HOST:PORT"),
            (["--coordinator", "etcd://127.0.0.1:65536"], "is not etcd://HOST:PORT"),
            (["--coordinator", "etcd://:2379"], "is not etcd://HOST:PORT"),
            (["--coordinator", "etcd://" + ",".join(["h:1"] * 17)], "is not etcd://HOST:PORT"),
            (etcd + ["--cluster", "a/b"],
             "--cluster: 'a/b' is not 1 to 64 of A-Z, a-z, 0-9, '.', '_', '-'"),
            (etcd + ["--cluster", "x" * 65], "--cluster: must be 1 to 64 bytes"),
            (etcd + ["--coordinator-ca", "/x/ca.pem", "--coordinator-cert", "/x/c.pem"],
             "--coordinator-cert: --coordinator-cert and --coordinator-key go together"),
            (etcd + ["--coordinator-ca", "/x/ca.pem", "--coordinator-key", "/x/k.pem"],
             "--coordinator-key: --coordinator-cert and --coordinator-key go together"),
            (etcd + ["--coordinator-cert", "/x/c.pem", "--coordinator-key", "/x/k.pem"],
             "--coordinator-cert: needs --coordinator-ca (a client certificate is for TLS)"),
            (etcd + ["--membership", "swim"],
             "--membership: swim not with --coordinator: in etcd mode daemons run no "
             "membership protocol, the membership is in etcd"),
        )
        for args, text in cases:
            socket = os.path.join(tmp, "api.sock")
            r = run("--registry", REGISTRY, "--socket", socket, *args)
            self.assertEqual(r.returncode, 2, (args, r.stderr))
            self.assertIn(text, r.stderr, args)
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, (args, r.stderr))
            self.assertFalse(os.path.exists(socket), args)
        # The same from a config file, and --check-config says so too.
        conf = os.path.join(tmp, "familyd.conf")
        with open(conf, "w") as f:
            f.write("coordinator = etcd://127.0.0.1:2379\nlisten = 127.0.0.1:7100\n")
        r = run("--check-config=" + conf, "--registry", REGISTRY)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("not with --listen", r.stderr)
        with open(conf, "w") as f:
            f.write("coordinator = etcd://127.0.0.1:2379\nmembership = swim\n")
        r = run("--check-config=" + conf, "--registry", REGISTRY)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--membership: swim not with --coordinator", r.stderr)
        # Good settings pass the check (no etcd is asked: that is the start's business), and
        # --down-ms alone may be below the embedded protocol's --suspect-ms.
        with open(conf, "w") as f:
            f.write("coordinator = etcd://127.0.0.1:2379,[::1]:2379\ncluster = a.b_c-1\n"
                    "down-ms = 2000\ncoordinator-ca = /x/ca.pem\ncoordinator-cert = /x/c.pem\n"
                    "coordinator-key = /x/k.pem\nmembership = all-to-all\n")
        r = run("--check-config=" + conf, "--registry", REGISTRY)
        self.assertEqual((r.returncode, r.stderr), (0, ""))

    def test_membership_modes_check_and_bad_ones_name_the_line(self):
        # Both modes pass the check (with and without peers); an unknown one in the file names
        # FILE:LINE and is a usage error, and a flag wins over the file.
        tmp = H.short_tmpdir("fd-cli-")
        self.addCleanup(shutil.rmtree, tmp, True)
        conf = os.path.join(tmp, "familyd.conf")
        for mode in ("all-to-all", "swim"):
            with open(conf, "w") as f:
                f.write("listen = 127.0.0.1:7100\npeers = 127.0.0.1:7101\nmembership = %s\n"
                        % mode)
            r = run("--check-config=" + conf, "--registry", REGISTRY)
            self.assertEqual((r.returncode, r.stderr), (0, ""), mode)
        with open(conf, "w") as f:
            f.write("# mode\nmembership = all-to-all\nmembership = gossip\n")
        r = run("--check-config=" + conf, "--registry", REGISTRY)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertEqual(r.stderr.strip(), "familyd: error: %s:3: membership: unknown mode "
                         "'gossip' (all-to-all, swim)" % conf)
        with open(conf, "w") as f:
            f.write("coordinator = etcd://127.0.0.1:2379\nmembership = swim\n")
        r = run("--check-config=" + conf, "--registry", REGISTRY, "--membership", "all-to-all")
        self.assertEqual((r.returncode, r.stderr), (0, ""))

    def test_missing_registry_fails_with_a_line(self):
        tmp = H.short_tmpdir("fd-cli-")
        self.addCleanup(shutil.rmtree, tmp, True)
        r = run("--socket", os.path.join(tmp, "s.sock"), "--registry", os.path.join(tmp, "nope"))
        self.assertEqual(r.returncode, 1)
        self.assertIn("nope", r.stderr)
        self.assertFalse(os.path.exists(os.path.join(tmp, "s.sock")))


class TestConfigFile(unittest.TestCase):
    def setUp(self):
        self.tmp = H.short_tmpdir("fd-conf-")
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def test_file_sets_options_and_flags_win(self):
        conf = os.path.join(self.tmp, "familyd.conf")
        with open(conf, "w") as f:
            f.write("# comment\nhost-devices = 3\nnode-name = from-file\n"
                    "registry = %s\n" % REGISTRY)
        d = H.Daemon(registry=REGISTRY, tmpdir=self.tmp, host_devices=None,
                     extra_args=["--config", conf, "--node-name", "from-flag"])
        with d:
            topo = d.client.call("familyd.v1.MeshService/GetTopology", {})
            self.assertTrue(topo.ok, topo)
            self.assertEqual(topo.reply.world_size, 3)
            self.assertEqual(topo.reply.local_node, "from-flag")

    def test_bad_config_names_file_and_line(self):
        conf = os.path.join(self.tmp, "bad.conf")
        with open(conf, "w") as f:
            f.write("host-devices = 2\nno-such-key = 1\n")
        r = run("--config", conf, "--socket", os.path.join(self.tmp, "s.sock"),
                "--registry", REGISTRY)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("%s:2: unknown key 'no-such-key'" % conf, r.stderr)


class TestConnectionCap(unittest.TestCase):
    def test_connections_over_the_cap_are_refused_and_the_daemon_runs_on(self):
        tmp = H.short_tmpdir("fd-cap-")
        self.addCleanup(shutil.rmtree, tmp, True)
        # The per-uid cap (default half of --max-connections: 1 here) would refuse the
        # harness's client while its readiness probe's connection is still open: this test is
        # about the total, so the uid may use all of it (test client-memory covers the uid's).
        d = H.Daemon(registry=REGISTRY, tmpdir=tmp,
                     extra_args=["--max-connections", "2", "--max-connections-per-uid", "2"])
        with d:
            self.assertTrue(d.client.health().ok)
            # A local subchannel pool makes every channel its own connection. Connections
            # that gRPC has not closed yet (the harness's readiness probe) may still count,
            # so open channels until one is refused: that must happen within the cap.
            opts = [("grpc.use_local_subchannel_pool", 1)]
            check = lambda ch: ch.unary_unary("/grpc.health.v1.Health/Check")(b"", timeout=5)
            opened, refused = [], None
            for _ in range(3):
                ch = grpc.insecure_channel("unix:" + d.socket, options=opts)
                opened.append(ch)
                try:
                    check(ch)
                except grpc.RpcError as e:
                    refused = e
                    break
            self.assertIsNotNone(refused, "no connection was refused with --max-connections 2")
            self.assertEqual(refused.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
            self.assertRegex(refused.details(), r"^connection limit reached: ")
            self.assertLessEqual(len(opened), 2)
            self.assertTrue(d.client.health().ok)

            # Closing connections frees their places.
            for ch in opened:
                ch.close()
            # gRPC closes the daemon's ends asynchronously; a new channel per try avoids the
            # client's reconnect backoff.
            deadline = time.monotonic() + 30
            while True:
                fresh = grpc.insecure_channel("unix:" + d.socket, options=opts)
                try:
                    self.assertIsNotNone(check(fresh))
                    break
                except grpc.RpcError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
                finally:
                    fresh.close()
        self.assertIn("Refusing a connection", d.stderr())


if __name__ == "__main__":
    unittest.main(verbosity=2)
