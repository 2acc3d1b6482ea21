#!/usr/bin/python3
"""familyd --config FILE: every flag has a key, problems name the file and line, a failed
start leaves no socket behind, and the shipped example (deploy/systemd/familyd.conf) lists
every key with its default and parses.
"""

import os
import re
import shutil
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402

REGISTRY = os.path.join(H.CONFORMANCE, "registry")
EXAMPLE = os.path.join(H.SOURCE_ROOT, "deploy", "systemd", "familyd.conf")
P = None


def setUpModule():
    global P
    P = H.Protos()


def run(*args, timeout=30):
    return subprocess.run([H.familyd_bin(), *args], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def help_keys():
    """The long options that take a value, from --help: the config file's keys."""
    r = run("--help")
    assert r.returncode == 0, r.stderr
    keys = re.findall(r"^\s+(?:-\w )?\s*--([a-z][a-z0-9-]*) [A-Z]", r.stdout, re.M)
    return [k for k in keys if k not in ("config", "check-registry")], r.stdout


class Base(unittest.TestCase):
    def setUp(self):
        self.tmp = H.short_tmpdir("fd-cfg-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.socket = os.path.join(self.tmp, "api.sock")
        self.shard = os.path.join(self.tmp, "shard.sock")

    def conf(self, text, name="familyd.conf"):
        path = os.path.join(self.tmp, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def start_fails(self, conf, *extra):
        r = run("--config", conf, "--socket", self.socket, "--shard-socket", self.shard,
                *extra)
        self.assertNotEqual(r.returncode, 0, r.stderr)
        # Nothing was bound, or what was is gone again.
        self.assertFalse(os.path.exists(self.socket), r.stderr)
        self.assertFalse(os.path.exists(self.shard), r.stderr)
        # One clear problem, not a cascade.
        self.assertLessEqual(len(r.stderr.strip().splitlines()), 3, r.stderr)
        return r


class TestProblemsNameFileAndLine(Base):
    def test_unknown_key(self):
        conf = self.conf("# settings\nregistry = %s\n\nhost-devices = 2\nsockett = /x\n"
                         % REGISTRY)
        r = self.start_fails(conf)
        self.assertIn("%s:5: unknown key 'sockett'" % conf, r.stderr)
        self.assertEqual(r.returncode, 2)

    def test_config_itself_is_not_a_key(self):
        conf = self.conf("config = /etc/other.conf\n")
        r = self.start_fails(conf, "--registry", REGISTRY)
        self.assertIn("%s:1: unknown key 'config'" % conf, r.stderr)

    def test_line_without_equals(self):
        conf = self.conf("registry = %s\nhost-devices 2\n" % REGISTRY)
        r = self.start_fails(conf)
        self.assertIn("%s:2: expected `key = value`" % conf, r.stderr)

    def test_bad_values(self):
        cases = [
            ("host-devices = many", "host-devices: 'many' is not an integer in [1, 4096]"),
            ("host-devices = 0", "host-devices: '0' is not an integer in [1, 4096]"),
            ("threads = -1", "threads: '-1' is not an integer"),
            ("max-builds = 99999999999999999999", "max-builds:"),
            ("log-level = loud", "log-level: unknown level 'loud'"),
            ("node-name = %s" % ("n" * 300), "node-name: must be 1 to"),
            ("socket =", "socket: empty value"),
            ("connection-idle-ms = 5", "connection-idle-ms: '5' is not an integer"),
        ]
        for line, text in cases:
            with self.subTest(line=line):
                conf = self.conf("# a comment\nregistry = %s\n%s\n" % (REGISTRY, line))
                r = self.start_fails(conf)
                self.assertIn("%s:3: %s" % (conf, text), r.stderr)
                self.assertEqual(r.returncode, 2)

    def test_ordering_problem_names_the_lines(self):
        conf = self.conf("registry = %s\nheartbeat-ms = 500\nsuspect-ms = 100\n" % REGISTRY)
        r = self.start_fails(conf)
        self.assertIn("heartbeat-ms is set at %s:2" % conf, r.stderr)
        self.assertIn("suspect-ms is set at %s:3" % conf, r.stderr)

    def test_unreadable_registry_path(self):
        for target in (os.path.join(self.tmp, "no-such-dir"), self.conf("x", "a-file")):
            with self.subTest(target=target):
                conf = self.conf("host-devices = 2\n\nregistry = %s\n" % target)
                r = self.start_fails(conf)
                self.assertIn("%s:3: registry: cannot read the directory %s" % (conf, target),
                              r.stderr)
                self.assertEqual(r.returncode, 1)

    def test_unreadable_registry_from_a_flag_names_the_flag_value(self):
        conf = self.conf("registry = %s\n" % REGISTRY)
        missing = os.path.join(self.tmp, "nope")
        r = self.start_fails(conf, "--registry", missing)
        self.assertIn("cannot read the registry directory %s" % missing, r.stderr)
        self.assertNotIn(conf, r.stderr, "the flag won; the file's line is not the culprit")

    def test_missing_config_file(self):
        r = self.start_fails(os.path.join(self.tmp, "absent.conf"), "--registry", REGISTRY)
        self.assertIn("cannot open config file", r.stderr)

    def test_failure_after_bind_removes_the_api_socket(self):
        # The API socket is bound before the shard socket fails: it must go again.
        conf = self.conf("registry = %s\n" % REGISTRY)
        self.shard = os.path.join(self.tmp, "no-such-dir", "shard.sock")
        r = self.start_fails(conf)
        self.assertIn("shard.sock", r.stderr)
        self.assertEqual(r.returncode, 1)


class TestFileApplies(Base):
    def test_quotes_comments_and_last_line_wins(self):
        conf = self.conf("; ini-style comment\n"
                         "  # indented comment\n"
                         "registry = \"%s\"\n"
                         "node-name = 'first'\n"
                         "node-name = from file\n"
                         "host-devices=3\n" % REGISTRY)
        d = H.Daemon(registry=REGISTRY, tmpdir=self.tmp, host_devices=None,
                     extra_args=["--config", conf])
        with d:
            topo = d.client.call("familyd.v1.MeshService/GetTopology", {})
            self.assertTrue(topo.ok, topo)
            self.assertEqual(topo.reply.world_size, 3)
            self.assertEqual(topo.reply.local_node, "from file")

    def test_limits_from_the_file_apply(self):
        conf = self.conf("max-builds = 1\n")
        d = H.Daemon(registry=REGISTRY, tmpdir=self.tmp, extra_args=["--config", conf])
        with d:
            req = {"family": "grouped_experts",
                   "config": {"fields": {"num_experts": {"intValue": "4"},
                                         "hidden_size": {"intValue": "8"},
                                         "moe_intermediate_size": {"intValue": "4"},
                                         "initializer_range": {"doubleValue": 0.02}}}}
            first = d.client.call("familyd.v1.FamilyService/Build", req)
            self.assertTrue(first.ok, first)
            second = d.client.call("familyd.v1.FamilyService/Build", req)
            self.assertEqual(second.code, "RESOURCE_EXHAUSTED", second)


class TestCheckConfig(Base):
    """familyd --check-config: the checks of a start, then exit; nothing is bound."""

    def test_good_settings_exit_0_silently(self):
        conf = self.conf("registry = %s\nhost-devices = 2\nthreads = 4\n" % REGISTRY)
        r = run("--check-config", "--config", conf, "--socket", self.socket,
                "--shard-socket", self.shard)
        self.assertEqual((r.returncode, r.stdout, r.stderr), (0, "", ""))
        self.assertFalse(os.path.exists(self.socket))
        self.assertFalse(os.path.exists(self.shard))

    def test_problems_exit_as_a_start_would(self):
        cases = [
            ("registry = %s\nsockett = /x\n" % REGISTRY, 2, ":2: unknown key 'sockett'"),
            ("registry = %s\nthreads = 0\n" % REGISTRY, 2,
             ":2: threads: '0' is not an integer in [1, 64]"),
            ("registry = %s\nheartbeat-ms = 500\nsuspect-ms = 100\n" % REGISTRY, 2,
             "need --heartbeat-ms <= --suspect-ms <= --down-ms"),
            ("registry = %s\n" % os.path.join(self.tmp, "no-such-dir"), 1,
             ":1: registry: cannot read the directory"),
        ]
        for text, code, message in cases:
            with self.subTest(text=text):
                conf = self.conf(text)
                r = self.start_fails(conf, "--check-config")
                self.assertEqual(r.returncode, code, r.stderr)
                self.assertIn(message, r.stderr)

    def test_flags_are_checked_too(self):
        conf = self.conf("registry = %s\n" % REGISTRY)
        r = self.start_fails(conf, "--check-config", "--max-shards", "0")
        self.assertEqual(r.returncode, 2)
        self.assertIn("--max-shards: '0' is not an integer in [1, 65536]", r.stderr)

    def test_check_config_is_a_flag_not_a_key(self):
        conf = self.conf("registry = %s\ncheck-config = 1\n" % REGISTRY)
        r = self.start_fails(conf)
        self.assertIn("%s:2: unknown key 'check-config'" % conf, r.stderr)


class TestExample(Base):
    def example_lines(self):
        with open(EXAMPLE) as f:
            return f.read().splitlines()

    def test_every_flag_has_a_key_in_the_example_with_the_help_default(self):
        keys, text = help_keys()
        self.assertGreaterEqual(len(keys), 20, text)
        documented = {}
        for line in self.example_lines():
            m = re.match(r"^#([a-z][a-z0-9-]*) =\s*(.*)$", line)
            if m:
                documented[m.group(1)] = m.group(2)
        missing = [k for k in keys if k not in documented]
        self.assertEqual(missing, [], "keys of --help missing from %s" % EXAMPLE)
        unknown = [k for k in documented if k not in keys]
        self.assertEqual(unknown, [], "keys in %s that familyd does not know" % EXAMPLE)
        # Where --help states a number as the default, the example says the same.
        checked = 0
        for k in keys:
            # The option's block: from its name to the next option.
            block = re.search(r"--%s [A-Z]+(.*?)(?=\n\s+(?:-\w )?\s*--|\n\n)" % re.escape(k),
                              text, re.S)
            m = block and re.search(r"\(default (\d+)", block.group(1))
            if m and documented[k]:
                self.assertEqual(documented[k], m.group(1), k)
                checked += 1
        self.assertGreaterEqual(checked, 10)

    def test_example_parses_as_shipped_and_with_every_value_set(self):
        # As shipped (all commented out): a daemon starts on it.
        d = H.Daemon(registry=REGISTRY, tmpdir=self.tmp, extra_args=["--config", EXAMPLE])
        with d:
            self.assertTrue(d.client.health().ok)
        # Every example value uncommented: it parses (the start then stops at the missing
        # registry, after the config, with exit status 1, not 2).
        lines = []
        for line in self.example_lines():
            m = re.match(r"^#([a-z][a-z0-9-]*) =\s*(\S.*)$", line)
            lines.append("%s = %s" % (m.group(1), m.group(2)) if m else line)
        conf = self.conf("\n".join(lines) + "\n", "uncommented.conf")
        missing = os.path.join(self.tmp, "missing-registry")
        r = run("--config", conf, "--registry", missing, "--socket", self.socket,
                "--shard-socket", self.shard)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("cannot read the registry directory %s" % missing, r.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
