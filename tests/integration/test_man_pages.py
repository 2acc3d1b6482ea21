#!/usr/bin/python3
"""The manual pages (docs/man/*.scd, built by meson with scdoc): they render, and they list
what the programs have.

- Each built page renders with `man -l` and groff's warnings on (`--warnings`), with nothing
  on stderr.
- familyd(8) names every long option of `familyd --help` (as *--NAME*), and lists no option
  familyd does not have; familyd.conf(5) names every key of `familyd --print-config` (as
  *KEY*).
- familyctl(1) names every verb and every global option of `familyctl --help`.
- The systemd unit's Documentation= names the pages.
"""

import glob
import os
import re
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402

BUILD = os.path.dirname(os.path.dirname(os.path.abspath(H.descriptor_set_path())))
MAN_BUILD = os.path.join(BUILD, "docs", "man")
MAN_SRC = os.path.join(H.SOURCE_ROOT, "docs", "man")
PAGES = ("familyd.8", "familyctl.1", "familyd.conf.5", "familyd-registry.5")


def source(page):
    with open(os.path.join(MAN_SRC, page + ".scd")) as f:
        return f.read()


def run(argv):
    return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=60).stdout


class TestManPages(unittest.TestCase):
    def test_pages_render_without_warnings(self):
        self.assertEqual(sorted(os.path.basename(p) for p in glob.glob(MAN_SRC + "/*.scd")),
                         sorted(p + ".scd" for p in PAGES))
        for page in PAGES:
            with self.subTest(page=page):
                path = os.path.join(MAN_BUILD, page)
                self.assertTrue(os.path.isfile(path), "%s not built" % path)
                p = subprocess.run(["man", "--warnings", "-l", path],
                                   env=dict(os.environ, MANWIDTH="80", MANPAGER="cat",
                                            PAGER="cat"),
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   timeout=60)
                self.assertEqual(p.returncode, 0, p.stderr)
                self.assertEqual(p.stderr.strip(), "", p.stderr)
                name = page.rsplit(".", 1)[0]
                self.assertIn("NAME", p.stdout)
                self.assertIn(name, p.stdout)

    def test_familyd_options(self):
        helptext = run([H.familyd_bin(), "--help"])
        have = set(re.findall(r"(?m)^\s+(?:-\w\s+)?(--[a-z][a-z0-9-]*)", helptext))
        have.add("--print-config")      # not in --help: it prints familyd.conf(5)
        # An option's earlier name, accepted but not in --help (the page says so).
        alias = "--max-connections-per-peer"
        r = subprocess.run([H.familyd_bin(), "--check-config=/dev/null", "--registry",
                            os.path.join(H.CONFORMANCE, "registry"), alias, "5"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=20)
        self.assertEqual(r.returncode, 0, r.stdout)
        have.add(alias)
        self.assertGreater(len(have), 20, helptext)
        page = source("familyd.8")
        named = set(re.findall(r"\*(--[a-z][a-z0-9-]*)\*", page))
        self.assertEqual(sorted(have - named), [], "options of familyd --help missing in "
                                                   "familyd.8.scd")
        self.assertEqual(sorted(named - have), [], "familyd.8.scd names options familyd does "
                                                   "not have")

    def test_config_keys(self):
        conf = run([H.familyd_bin(), "--print-config"])
        keys = set(re.findall(r"(?m)^#([a-z][a-z0-9-]*) =", conf))
        self.assertGreater(len(keys), 20, conf)
        named = set(re.findall(r"\*([a-z][a-z0-9-]*)\*", source("familyd.conf.5")))
        self.assertEqual(sorted(keys - named), [], "keys of --print-config missing in "
                                                   "familyd.conf.5.scd")

    def test_familyctl_verbs_and_options(self):
        helptext = run([H.familyctl_bin(), "--help"])
        verbs = set(re.findall(r"(?m)^  ([a-z][a-z-]*)\b(?=[ a-zA-Z|.\[<]*\s{2,}\S)", helptext))
        self.assertGreater(len(verbs), 12, helptext)
        options = set(re.findall(r"(--[a-z][a-z-]*)", helptext.split("Verbs")[0]))
        page = source("familyctl.1")
        verbs_section = page.split("# VERBS", 1)[1].split("# EXIT STATUS", 1)[0]
        named = set(re.findall(r"^\*([a-z][a-z-]*)[\* ]", verbs_section, re.M))
        named |= set(re.findall(r"; \*([a-z][a-z-]*)[\* ]", verbs_section))
        self.assertEqual(sorted(verbs - named), [], "verbs of familyctl --help missing in "
                                                    "familyctl.1.scd")
        for option in options:
            self.assertIn("*%s*" % option, page)

    def test_unit_documentation_names_the_pages(self):
        with open(os.path.join(H.SOURCE_ROOT, "deploy", "systemd", "familyd.service.in")) as f:
            unit = f.read()
        for ref in ("man:familyd(8)", "man:familyd.conf(5)", "man:familyd-registry(5)"):
            self.assertIn(ref, unit)


if __name__ == "__main__":
    unittest.main(verbosity=2)
