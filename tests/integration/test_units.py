#!/usr/bin/python3
"""deploy/systemd: the units pass `systemd-analyze verify` without a word, the service's
exposure (`systemd-analyze security --offline=true`) is 2.0 or lower, the units agree with
familyd's own defaults, the sysusers.d and tmpfiles.d entries do what they say, and meson
installs all of it.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402

DEPLOY = os.path.join(H.SOURCE_ROOT, "deploy", "systemd")
ANALYZE = shutil.which("systemd-analyze") or "/usr/bin/systemd-analyze"
MAX_EXPOSURE = 2.0


def read(path):
    with open(path) as f:
        return f.read()


def settings(text):
    """{(section, key): [values]} of a unit file."""
    out, section = {}, None
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        k, _, v = line.partition("=")
        out.setdefault((section, k.strip()), []).append(v.strip())
    return out


def help_text():
    r = subprocess.run([H.familyd_bin(), "--help"], stdout=subprocess.PIPE, text=True,
                       timeout=30)
    assert r.returncode == 0
    return r.stdout


class Units(unittest.TestCase):
    def setUp(self):
        if not os.access(ANALYZE, os.X_OK):
            self.skipTest("systemd-analyze not installed (Debian package systemd)")
        self.tmp = H.short_tmpdir("fd-units-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        # The service as meson configures it, with ExecStart= the built binary (verify wants
        # an executable there).
        text = read(os.path.join(DEPLOY, "familyd.service.in"))
        text = text.replace("@sbindir@", os.path.dirname(os.path.abspath(H.familyd_bin())))
        text = text.replace("@sysconfdir@", "/etc").replace("@docdir@", "/usr/share/doc/familyd")
        self.assertIsNone(re.search(r"@[a-z_]+@", text), "an unsubstituted @variable@")
        self.service = os.path.join(self.tmp, "familyd.service")
        with open(self.service, "w") as f:
            f.write(text)
        self.sockets = []
        for name in ("familyd.socket", "familyd-shard.socket"):
            shutil.copy(os.path.join(DEPLOY, name), self.tmp)
            self.sockets.append(os.path.join(self.tmp, name))

    def analyze(self, *args):
        return subprocess.run([ANALYZE, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=120, cwd=self.tmp)

    def test_verify_is_silent(self):
        r = self.analyze("verify", "--man=no", self.service, *self.sockets)
        # verify exits 0 even for unknown keys and bad values ("..., ignoring"): any output
        # is a problem.
        self.assertEqual(r.returncode, 0, r.stdout)
        self.assertEqual(r.stdout.strip(), "", r.stdout)

    def test_verify_would_catch_a_mistake(self):
        # The check above is only as good as verify's voice: a typo must make it speak.
        with open(self.service) as f:
            text = f.read().replace("Type=notify", "Type=notfiy")
        bad = os.path.join(self.tmp, "bad.service")
        with open(bad, "w") as f:
            f.write(text)
        r = self.analyze("verify", "--man=no", bad)
        self.assertIn("notfiy", r.stdout)

    def test_security_exposure(self):
        r = self.analyze("security", "--offline=true", self.service)
        m = re.search(r"Overall exposure level for familyd\.service: (\d+\.\d+) (\w+)", r.stdout)
        self.assertIsNotNone(m, r.stdout)
        score = float(m.group(1))
        print("systemd-analyze security --offline=true familyd.service: overall exposure "
              "%.1f %s (limit %.1f)" % (score, m.group(2), MAX_EXPOSURE))
        for line in r.stdout.splitlines():
            if line.startswith("✗"):
                print("  " + re.sub(r"\s{2,}", "  ", line).strip())
        self.assertLessEqual(score, MAX_EXPOSURE, r.stdout)

    def test_units_agree_with_familyd(self):
        svc = settings(read(self.service))
        text = help_text()
        get = lambda k: svc.get(("Service", k), [None])[-1]
        self.assertEqual(get("Type"), "notify")
        self.assertEqual(get("NotifyAccess"), "main")
        self.assertTrue(get("WatchdogSec"))
        self.assertEqual(get("Restart"), "on-failure")
        self.assertIn("kill -HUP $MAINPID", get("ExecReload"))
        # The reload is guarded by the check a start would make, first.
        self.assertRegex(svc[("Service", "ExecReload")][0],
                         r"^/\S+/familyd --check-config=/\S+/familyd\.conf$")
        self.assertIsNone(get("PrivateNetwork"), "UCX needs the host's network")
        self.assertEqual(get("User"), "familyd")
        self.assertEqual(get("RuntimeDirectory"), "familyd")
        self.assertEqual(get("RuntimeDirectoryPreserve"), "yes")
        # The fd store holds what --fdstore-max allows by default.
        m = re.search(r"--fdstore-max N\s+[^\n]*\(default (\d+)\)", text)
        self.assertIsNotNone(m, text)
        self.assertEqual(get("FileDescriptorStoreMax"), m.group(1))
        with open(os.path.join(DEPLOY, "familyd.conf")) as f:
            self.assertIn("#fdstore-max = %s\n" % m.group(1), f.read())

        # The sockets are where familyd's defaults put them, named as familyd expects.
        m = re.search(r"--socket PATH\s+API socket \(default (\S+)\)", text)
        self.assertIsNotNone(m, text)
        api_default = m.group(1)
        want = {"familyd.socket": ("api", api_default),
                "familyd-shard.socket": ("shard",
                                         os.path.join(os.path.dirname(api_default), "shard.sock"))}
        listed = svc.get(("Service", "Sockets"), [""])[-1].split()
        for path in self.sockets:
            name = os.path.basename(path)
            sock = settings(read(path))
            fdname, listen = want[name]
            self.assertEqual(sock[("Socket", "FileDescriptorName")], [fdname], name)
            self.assertEqual(sock[("Socket", "ListenStream")], [listen], name)
            self.assertEqual(sock[("Socket", "SocketMode")], ["0660"], name)
            self.assertEqual(sock[("Socket", "SocketGroup")], ["familyd"], name)
            self.assertEqual(sock[("Socket", "Service")], ["familyd.service"], name)
            self.assertIn(name, listed, "familyd.service Sockets=")

    def test_sysusers_creates_the_user_and_group(self):
        root = os.path.join(self.tmp, "root")
        os.makedirs(os.path.join(root, "etc"))
        tool = shutil.which("systemd-sysusers")
        if not tool:
            self.skipTest("systemd-sysusers not installed")
        r = subprocess.run([tool, "--root", root, "--dry-run",
                            os.path.join(DEPLOY, "familyd.sysusers")],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stdout)
        self.assertIn("Creating group 'familyd'", r.stdout)
        self.assertIn("Creating user 'familyd'", r.stdout)

    def test_tmpfiles_creates_the_runtime_dir_and_copies_the_registry(self):
        tool = shutil.which("systemd-tmpfiles")
        if not tool:
            self.skipTest("systemd-tmpfiles not installed")
        root = os.path.join(self.tmp, "root")
        for d in ("etc", "run", "usr/share/familyd/registry"):
            os.makedirs(os.path.join(root, d))
        with open(os.path.join(root, "etc", "passwd"), "w") as f:
            f.write("familyd:x:995:995::/var/lib/familyd:/usr/sbin/nologin\n")
        with open(os.path.join(root, "etc", "group"), "w") as f:
            f.write("familyd:x:995:\n")
        with open(os.path.join(root, "usr/share/familyd/registry/a.yaml"), "w") as f:
            f.write("name: a\n")
        conf = os.path.join(self.tmp, "familyd-tmpfiles.conf")
        with open(conf, "w") as f:
            f.write(read(os.path.join(DEPLOY, "familyd.tmpfiles.in"))
                    .replace("@sysconfdir@", "/etc").replace("@datadir@", "/usr/share"))
        r = subprocess.run([tool, "--root", root, "--create", conf], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stdout)
        st = os.stat(os.path.join(root, "run", "familyd"))
        self.assertEqual((st.st_uid, st.st_gid, st.st_mode & 0o7777), (995, 995, 0o750))
        self.assertTrue(os.path.exists(os.path.join(root, "etc/familyd/registry/a.yaml")))


class Install(unittest.TestCase):
    def test_meson_installs_units_config_and_registry(self):
        build = os.path.dirname(os.path.dirname(os.path.abspath(H.familyd_bin())))
        meson = shutil.which("meson")
        if not meson or not os.path.exists(os.path.join(build, "meson-info")):
            self.skipTest("no meson build directory at %s" % build)
        r = subprocess.run([meson, "introspect", build, "--installed"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        installed = json.loads(r.stdout).values()
        names = {}
        for dest in installed:
            names.setdefault(os.path.basename(dest), []).append(dest)
        for unit in ("familyd.service", "familyd.socket", "familyd-shard.socket"):
            self.assertIn(unit, names, "meson does not install %s" % unit)
            self.assertTrue(names[unit][0].endswith("/systemd/system/" + unit), names[unit])
        confs = names.get("familyd.conf", [])
        self.assertTrue(any("/sysusers.d/" in d for d in confs), confs)
        self.assertTrue(any("/tmpfiles.d/" in d for d in confs), confs)
        self.assertTrue(any(d.endswith("/familyd/familyd.conf") and "/etc" in d for d in confs),
                        confs)
        self.assertTrue(any(d.endswith("/share/familyd/registry") for d in installed))
        # The installed service starts the installed binary with the installed config.
        svc = os.path.join(build, "deploy", "familyd.service")
        text = read(svc)
        sbin = [d for d in installed if d.endswith("/familyd") and "/sbin/" in d]
        self.assertEqual(len(sbin), 1, sbin)
        self.assertIn("ExecStart=%s --config " % sbin[0], text)
        self.assertIsNone(re.search(r"@[a-z_]+@", text))


if __name__ == "__main__":
    unittest.main(verbosity=2)
