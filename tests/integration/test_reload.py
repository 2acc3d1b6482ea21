#!/usr/bin/python3
"""Registry reload: the Reload RPC and SIGHUP; a failed reload keeps the old registry whole."""

import os
import re
import shutil
import signal
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402

SRC_REGISTRY = os.path.join(H.CONFORMANCE, "registry")

EXTRA_V1 = """\
name: extra
baseline: itest.extra.Extra
default_variant: one
variants:
  one:
    constructor: itest.extra.One
    accepts: [config]
  two:
    constructor: itest.extra.Two
    accepts: [config]
"""

EXTRA_V2 = EXTRA_V1.replace("default_variant: one", "default_variant: two")

# line 3, column 1: an unknown key
EXTRA_UNKNOWN_KEY = """\
name: extra
baseline: itest.extra.Extra
colour: red
default_variant: one
variants:
  one:
    constructor: itest.extra.One
    accepts: [config]
"""

# a flow sequence never closed: a YAML syntax error
EXTRA_BAD_YAML = """\
name: extra
baseline: itest.extra.Extra
default_variant: one
variants:
  one:
    constructor: itest.extra.One
    accepts: [config, module
"""

AA_FAMILY = """\
name: aa_first
baseline: itest.aa.First
default_variant: only
variants:
  only:
    constructor: itest.aa.Only
    accepts: [config]
"""


class TestReload(unittest.TestCase):
    def setUp(self):
        self.tmp = H.short_tmpdir("fd-reload-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.reg = os.path.join(self.tmp, "registry")
        shutil.copytree(SRC_REGISTRY, self.reg)
        self.d = H.Daemon(registry=self.reg, tmpdir=self.tmp)
        self.d.start()
        self.addCleanup(self.d.kill)
        self.c = self.d.client

    def write(self, name, text):
        with open(os.path.join(self.reg, name), "w") as f:
            f.write(text)

    def status(self):
        res = self.c.call("familyd.v1.AdminService/GetStatus")
        self.assertEqual(res.code, "OK", repr(res))
        return res.reply

    def reload(self):
        return self.c.call("familyd.v1.AdminService/Reload")

    def resolve(self, family):
        return self.c.call("familyd.v1.FamilyService/Resolve", family=family)

    def names(self):
        res = self.c.call("familyd.v1.FamilyService/ListFamilies")
        self.assertEqual(res.code, "OK", repr(res))
        return [f.name for f in res.reply.families]

    def assertReloadFails(self, file_name, line=None, col=None):
        res = self.reload()
        self.assertEqual(res.code, "FAILED_PRECONDITION", repr(res))
        self.assertTrue(res.message.startswith("registry reload failed: "), res.message)
        m = re.search(r"(?:^|[\s/])" + re.escape(file_name) + r":(\d+):(\d+):", res.message)
        self.assertIsNotNone(m, "no %s:LINE:COLUMN: in %r" % (file_name, res.message))
        if line is not None:
            self.assertEqual(int(m.group(1)), line, res.message)
        if col is not None:
            self.assertEqual(int(m.group(2)), col, res.message)
        return res

    def test_reload_rpc_and_sighup(self):
        s0 = self.status()
        self.assertEqual(s0.families, 5)
        g0 = s0.registry_generation

        # an unchanged registry reloads: the generation still moves
        res = self.reload()
        self.assertEqual(res.code, "OK", repr(res))
        self.assertEqual((res.reply.registry_generation, res.reply.families), (g0 + 1, 5))
        self.assertEqual(self.status().registry_generation, g0 + 1)

        # a new file: visible after Reload
        self.assertEqual(self.resolve("extra").code, "NOT_FOUND")
        self.write("zz-extra.yaml", EXTRA_V1)
        res = self.reload()
        self.assertEqual(res.code, "OK", repr(res))
        self.assertEqual((res.reply.registry_generation, res.reply.families), (g0 + 2, 6))
        r = self.resolve("extra")
        self.assertEqual(r.code, "OK", repr(r))
        self.assertEqual(r.reply.resolved.variant, "one")

        # unknown key: FAILED_PRECONDITION naming zz-extra.yaml:3:1, nothing changes; a new
        # valid file loaded in the same attempt is not half-loaded
        self.write("aa-first.yaml", AA_FAMILY)
        self.write("zz-extra.yaml", EXTRA_UNKNOWN_KEY)
        res = self.assertReloadFails("zz-extra.yaml", line=3, col=1)
        self.assertIn("colour", res.message)
        s = self.status()
        self.assertEqual((s.registry_generation, s.families), (g0 + 2, 6))
        r = self.resolve("extra")
        self.assertEqual((r.code, r.reply.resolved.variant if r.ok else None), ("OK", "one"))
        self.assertEqual(self.resolve("aa_first").code, "NOT_FOUND")
        self.assertEqual(self.resolve("grouped_experts").code, "OK")

        # bad YAML: same story
        self.write("zz-extra.yaml", EXTRA_BAD_YAML)
        self.assertReloadFails("zz-extra.yaml")
        self.assertEqual(self.status().registry_generation, g0 + 2)
        self.assertEqual(self.resolve("extra").reply.resolved.variant, "one")

        # SIGHUP with the file still broken: the daemon lives on with the old registry
        # and says so in its log, naming the file (this is also how the test knows the
        # signal was handled before it fixes the file)
        before = len(self.d.stderr())
        self.d.signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and "zz-extra.yaml" not in self.d.stderr()[before:]:
            time.sleep(0.05)
        self.assertIn("zz-extra.yaml", self.d.stderr()[before:],
                      "a failed SIGHUP reload is not logged with its file")
        self.assertTrue(self.d.alive(), "familyd died on SIGHUP with a broken registry")
        self.assertEqual(self.status().registry_generation, g0 + 2)
        self.assertEqual(self.resolve("extra").reply.resolved.variant, "one")

        # fix the file + SIGHUP: new content visible
        self.write("zz-extra.yaml", EXTRA_V2)
        self.d.signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and self.status().registry_generation == g0 + 2:
            time.sleep(0.05)
        s = self.status()
        self.assertEqual((s.registry_generation, s.families), (g0 + 3, 7))
        r = self.resolve("extra")
        self.assertEqual(r.code, "OK", repr(r))
        self.assertEqual(r.reply.resolved.variant, "two")
        # files load in byte order of their names: aa-first.yaml before families.yaml
        self.assertEqual(self.names(), ["aa_first", "grouped_experts", "attention", "norm",
                                        "norm", "engram", "extra"])

        # removing a file removes its families
        os.unlink(os.path.join(self.reg, "zz-extra.yaml"))
        res = self.reload()
        self.assertEqual(res.code, "OK", repr(res))
        self.assertEqual(res.reply.families, 6)
        self.assertEqual(self.resolve("extra").code, "NOT_FOUND")

        self.d.stop()

    def test_reload_survives_concurrent_resolves(self):
        import threading
        stop = threading.Event()
        errors = []

        def hammer():
            c = H.Client(self.d.socket, self.d.protos)
            try:
                while not stop.is_set():
                    r = c.call("familyd.v1.FamilyService/Resolve",
                               {"family": "grouped_experts", "context": {"epSize": 4}})
                    if not r.ok or r.reply.resolved.variant != "grouped_ep":
                        errors.append(repr(r))
            finally:
                c.close()
        ts = [threading.Thread(target=hammer) for _ in range(2)]
        for t in ts:
            t.start()
        try:
            for _ in range(10):
                res = self.reload()
                self.assertEqual(res.code, "OK", repr(res))
        finally:
            stop.set()
            for t in ts:
                t.join()
        self.assertEqual(errors[:5], [])
        self.d.stop()


if __name__ == "__main__":
    unittest.main(verbosity=2)
