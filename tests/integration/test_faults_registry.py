#!/usr/bin/python3
"""Registry faults before a reload: the directory deleted, replaced by a file, unreadable to the
daemon's user, and one file in it unreadable. The daemon runs as an unprivileged user
(setpriv --reuid=nobody --regid=nogroup --clear-groups, since CI runs as root and root reads
everything), its sockets and state in a folder that user owns, the binary a world-readable copy
(other_uid.py: the clone may sit where nobody cannot read, as in root's 0700 home).

Each time the Reload RPC answers FAILED_PRECONDITION `registry reload failed: ` with the
diagnostic naming the directory (or file) and the system's reason (AdminService.Reload), a
SIGHUP reload fails the same way with a log line, the old registry keeps serving (same
generation, same families, Resolve and Build answer), a concurrent healthy client sees no error,
and once the directory is back a reload succeeds.
"""

import os
import pwd
import grp
import shutil
import signal
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402
import other_uid  # noqa: E402
from test_faults_common import REGISTRY, HealthyClient, wait_for  # noqa: E402

AS_ROOT = os.geteuid() == 0


class UnprivilegedDaemon(H.Daemon):
    """The daemon under setpriv as nobody:nogroup (when the tests run as root), from binary (a
    copy nobody can run)."""

    binary = None

    def argv(self):
        a = super().argv()
        if AS_ROOT:
            a = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                 self.binary] + a[1:]
        return a


def chown_tree(path, uid, gid):
    os.chown(path, uid, gid)
    for top, dirs, files in os.walk(path):
        for n in dirs + files:
            os.chown(os.path.join(top, n), uid, gid)


class TestRegistryFaults(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = H.short_tmpdir("fd-regfault-")
        cls.registry = os.path.join(cls.tmp, "registry")
        shutil.copytree(REGISTRY, cls.registry)
        cls.copy = None
        if AS_ROOT:
            chown_tree(cls.tmp, pwd.getpwnam("nobody").pw_uid, grp.getgrnam("nogroup").gr_gid)
            cls.copy = other_uid.ReadableCopy([H.familyd_bin()], prefix="fd-regfault-bin-")
            cls.addClassCleanup(cls.copy.cleanup)
        cls.d = UnprivilegedDaemon(registry=cls.registry, tmpdir=cls.tmp)
        if cls.copy:
            cls.d.binary = cls.copy.path(os.path.basename(H.familyd_bin()))
        cls.d.start()
        with open("/proc/%d/status" % cls.d.proc.pid) as f:
            cls.uid_line = [l for l in f if l.startswith("Uid:")][0]

    @classmethod
    def tearDownClass(cls):
        try:
            cls.d.stop()
            err = cls.d.stderr()
            assert "runtime error:" not in err and "Sanitizer" not in err, err[-4000:]
        finally:
            cls.d.cleanup()
            shutil.rmtree(cls.tmp, ignore_errors=True)

    def status(self):
        st = self.d.client.call("familyd.v1.AdminService/GetStatus", {})
        self.assertTrue(st.ok, st)
        return st.reply

    def reload(self):
        return self.d.client.call("familyd.v1.AdminService/Reload", {})

    def assert_serving(self, generation, families):
        st = self.status()
        self.assertEqual((st.registry_generation, st.families), (generation, families))
        r = self.d.client.call("familyd.v1.FamilyService/Resolve",
                               {"family": "attention", "context": {"cpSize": 2, "cp": True}})
        self.assertTrue(r.ok, r)
        self.assertEqual(r.reply.resolved.variant, "ring")

    def check_fault(self, break_it, restore, diagnostic):
        before = self.status()
        with HealthyClient(self.d) as hc:
            break_it()
            try:
                r = self.reload()
                self.assertEqual(r.code, "FAILED_PRECONDITION", r)
                self.assertEqual(r.message, "registry reload failed: " + diagnostic)
                self.assertEqual(self.d.client.error_details(r)[1][0].reason, "RELOAD_FAILED")
                self.assert_serving(before.registry_generation, before.families)
                # SIGHUP: the same failure, logged; the old registry stays.
                marker = len(self.d.stderr())
                self.d.signal(signal.SIGHUP)
                self.assertTrue(wait_for(lambda: diagnostic in self.d.stderr()[marker:], 10),
                                "no log line for the failed SIGHUP reload:\n"
                                + self.d.stderr()[marker:])
                self.assert_serving(before.registry_generation, before.families)
            finally:
                restore()
            ok = self.reload()
            self.assertTrue(ok.ok, ok)
            self.assertEqual(ok.reply.registry_generation, before.registry_generation + 1)
            self.assertEqual(ok.reply.families, before.families)
            time.sleep(0.3)
        self.assertEqual(hc.problems, [])
        self.assertGreater(hc.calls, 0)
        self.assertTrue(self.d.alive())

    def test_runs_unprivileged(self):
        if AS_ROOT:
            self.assertEqual(self.uid_line.split()[1:], [str(pwd.getpwnam("nobody").pw_uid)] * 4)
        else:
            self.assertEqual(int(self.uid_line.split()[1]), os.geteuid())

    def test_directory_deleted(self):
        away = self.registry + ".away"
        self.check_fault(lambda: os.rename(self.registry, away),
                         lambda: os.rename(away, self.registry),
                         "%s: cannot open the registry directory: No such file or directory"
                         % self.registry)

    def test_directory_replaced_by_a_file(self):
        away = self.registry + ".away"

        def break_it():
            os.rename(self.registry, away)
            with open(self.registry, "w") as f:
                f.write("families: []\n")

        def restore():
            os.unlink(self.registry)
            os.rename(away, self.registry)

        self.check_fault(break_it, restore,
                         "%s: cannot open the registry directory: Not a directory"
                         % self.registry)

    def test_directory_unreadable(self):
        self.check_fault(lambda: os.chmod(self.registry, 0o000),
                         lambda: os.chmod(self.registry, 0o755),
                         "%s: cannot open the registry directory: Permission denied"
                         % self.registry)

    def test_a_file_unreadable(self):
        path = os.path.join(self.registry, "families.yaml")
        self.check_fault(lambda: os.chmod(path, 0o000),
                         lambda: os.chmod(path, 0o644),
                         "families.yaml: cannot read the file: Permission denied")


if __name__ == "__main__":
    unittest.main(verbosity=2)
