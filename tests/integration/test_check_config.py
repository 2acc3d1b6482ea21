#!/usr/bin/python3
"""familyd --check-registry DIR and --check-config[=FILE]: the checks of a start, without one.

Every malformed registry of test_bad_registry.py gives, through --check-registry and through
--check-config, exactly the FILE:LINE:COLUMN lines a start prints for it, exit status 1, and
binds nothing; the example registry (deploy/registry) and the conformance registry pass with
exit 0 and no output; usage errors stay exit 2; a failed check sends nothing to NOTIFY_SOCKET
(it may run as an ExecReload= guard of the running service).
"""

import os
import shutil
import socket
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402
import test_bad_registry as B  # noqa: E402

EXAMPLE_REGISTRY = os.path.join(H.SOURCE_ROOT, "deploy", "registry")
CONFORMANCE_REGISTRY = os.path.join(H.CONFORMANCE, "registry")
DEFAULT_CONFIG = "/etc/familyd/familyd.conf"
TIMEOUT = 30


def run(*args, env=None):
    return subprocess.run([H.familyd_bin(), *args], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=TIMEOUT,
                          stdin=subprocess.DEVNULL, env=env)


def problem_lines(text):
    """The FILE:LINE:COLUMN: lines of a run's output, as printed."""
    return [ln for ln in text.splitlines() if H.FILE_LINE_COL.search(ln)]


class Base(unittest.TestCase):
    def setUp(self):
        self.tmp = H.short_tmpdir("fd-check-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.socket = os.path.join(self.tmp, "api.sock")
        self.shard = os.path.join(self.tmp, "shard.sock")

    def registry(self, name, files):
        reg = os.path.join(self.tmp, name)
        os.makedirs(reg)
        for fname, text in files.items():
            with open(os.path.join(reg, fname), "w") as f:
                f.write(text)
        return reg

    def conf(self, text, name="familyd.conf"):
        path = os.path.join(self.tmp, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def assert_nothing_bound(self):
        self.assertFalse(os.path.exists(self.socket), "the API socket was bound")
        self.assertFalse(os.path.exists(self.shard), "the shard socket was bound")


class TestMalformedRegistries(Base):
    def test_every_fixture_fails_as_a_start_does(self):
        failures = []
        for i, (name, files, culprit, _marker, _col, _words) in enumerate(B.CASES):
            reg = self.registry("reg-%d" % i, files)
            start = H.Daemon(registry=reg, tmpdir=self.tmp)
            rc, out, _secs = H.run_to_exit(start.argv(), timeout=TIMEOUT)
            want = problem_lines(out)
            if rc in (0, None) or not want:
                failures.append("%s: the start did not fail with a position (%s): %s"
                                % (name, rc, out))
                continue
            conf = self.conf("registry = %s\nhost-devices = 2\n" % reg, "c-%d.conf" % i)
            for how, args in (
                    ("--check-registry", ["--check-registry", reg]),
                    ("--check-config=FILE", ["--check-config=" + conf]),
                    ("--check-config --config FILE", ["--check-config", "--config", conf]),
                    ("--check-config --registry", ["--check-config=" + conf, "--registry", reg])):
                r = run(*args, "--socket", self.socket, "--shard-socket", self.shard)
                got = problem_lines(r.stderr)
                if r.returncode != 1 or got != want or r.stdout:
                    failures.append("%s, %s: exit %d, lines %s, expected exit 1 and %s"
                                    % (name, how, r.returncode, got, want))
                if not any(os.path.basename(H.FILE_LINE_COL.search(ln).group("file")) == culprit
                           for ln in got):
                    failures.append("%s, %s: no line names %s" % (name, how, culprit))
                if "Failed to load the registry %s (" % reg not in r.stderr:
                    failures.append("%s, %s: no summary line: %s" % (name, how, r.stderr))
            print("ok   %-44s %s" % (name, want[0].strip()[:100]))
        self.assertEqual(failures, [], "\n".join(failures))
        self.assert_nothing_bound()


class TestGoodRegistries(Base):
    def test_example_and_conformance_registries_pass_silently(self):
        for reg in (EXAMPLE_REGISTRY, CONFORMANCE_REGISTRY, self.registry("empty", {})):
            with self.subTest(registry=reg):
                r = run("--check-registry", reg, "--socket", self.socket,
                        "--shard-socket", self.shard)
                self.assertEqual((r.returncode, r.stdout, r.stderr), (0, "", ""))
                conf = self.conf("registry = %s\n" % reg)
                r = run("--check-config=" + conf, "--socket", self.socket,
                        "--shard-socket", self.shard)
                self.assertEqual((r.returncode, r.stdout, r.stderr), (0, "", ""))
        self.assert_nothing_bound()

    def test_check_registry_ignores_the_settings_registry(self):
        # --check-registry names the directory to check; a broken one in the settings is not
        # looked at unless --check-config asks for the settings' checks too.
        bad = self.registry("bad", {"x.yaml": "name: [\n"})
        r = run("--check-registry", EXAMPLE_REGISTRY, "--registry", bad)
        self.assertEqual((r.returncode, r.stderr), (0, ""))
        r = run("--check-registry", EXAMPLE_REGISTRY, "--check-config", "--config",
                self.conf("registry = %s\n" % bad))
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertTrue(problem_lines(r.stderr), r.stderr)


class TestCheckFailures(Base):
    def test_unreadable_registry_directory_fails_with_1(self):
        missing = os.path.join(self.tmp, "no-such-dir")
        r = run("--check-registry", missing)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn(missing, r.stderr)
        self.assertIn("Failed to load the registry", r.stderr)
        a_file = self.conf("not a directory\n", "plain")
        r = run("--check-registry", a_file)
        self.assertEqual(r.returncode, 1, r.stderr)

    def test_usage_errors_still_exit_2(self):
        conf = self.conf("registry = %s\n" % EXAMPLE_REGISTRY)
        for args, text in ((["--check-registry"], "check-registry"),
                           (["--check-registry", ""], "--check-registry: empty value"),
                           (["--check-registry", EXAMPLE_REGISTRY, "--threads", "0"],
                            "--threads: '0' is not an integer"),
                           (["--check-config="], "--check-config: empty value"),
                           (["--check-config=" + conf, "--config", conf], "name the file once"),
                           (["--check-config", conf], "unexpected argument"),
                           (["--check-config=" + conf, "--max-shards", "0"], "--max-shards")):
            with self.subTest(args=args):
                r = run(*args)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn(text, r.stderr)

    def test_config_file_problems_name_the_line(self):
        conf = self.conf("registry = %s\nsockett = /x\n" % EXAMPLE_REGISTRY)
        r = run("--check-config=" + conf)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("%s:2: unknown key 'sockett'" % conf, r.stderr)
        missing = os.path.join(self.tmp, "missing.conf")
        r = run("--check-config=" + missing)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("cannot open config file %s" % missing, r.stderr)

    @unittest.skipIf(os.path.exists(DEFAULT_CONFIG), DEFAULT_CONFIG + " exists on this machine")
    def test_without_a_file_the_default_is_checked(self):
        r = run("--check-config")
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("cannot open config file %s" % DEFAULT_CONFIG, r.stderr)

    def test_a_failed_check_tells_the_service_manager_nothing(self):
        # As an ExecReload= guard the check runs beside the service: its failure is not the
        # service failing to start (no STATUS=, no ERRNO=), while a failed start still is.
        path = os.path.join(self.tmp, "notify")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.addCleanup(sock.close)
        sock.bind(path)
        sock.settimeout(0.5)
        env = dict(os.environ, NOTIFY_SOCKET=path)
        bad = self.registry("bad", {"x.yaml": "name: [\n"})
        r = run("--check-registry", bad, env=env)
        self.assertEqual(r.returncode, 1, r.stderr)
        with self.assertRaises(socket.timeout):
            sock.recv(4096)
        r = run("--registry", bad, "--socket", self.socket, "--shard-socket", self.shard,
                "--host-devices", "1", env=env)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn(b"ERRNO=", sock.recv(4096))


class TestHelp(Base):
    def test_help_shows_both_checks(self):
        r = run("--help")
        self.assertEqual(r.returncode, 0)
        self.assertIn("--check-config[=FILE]", r.stdout)
        self.assertIn("--check-registry DIR", r.stdout)


if __name__ == "__main__":
    unittest.main(verbosity=2)
