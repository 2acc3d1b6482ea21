#!/usr/bin/python3
"""A registry load error at start: familyd exits non-zero, quickly, with a FILE:LINE:COLUMN: line.

Each case is one small registry folder. Positions are computed from a marker substring of the
file, so the expected line (and, where the key itself is the culprit, column) are exact.
A valid base family is checked first so that every bad case fails for its stated reason.
"""

import os
import shutil
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402

QUICK = float(os.environ.get("FAMILYD_BAD_START_TIMEOUT", "15"))   # ASan start-up included

BASE = """\
name: fam
baseline: itest.bad.Fam
default_variant: v
parallel_axis: ep
selectors:
  s: {type: bool, default: false}
arguments:
  a: {type: int, default: 1}
variants:
  v:
    constructor: itest.bad.V
    accepts: [config, a]
  w:
    constructor: itest.bad.W
    accepts: [config]
rules:
  - when: {s: true}
    variant: w
parameters:
  p:
    shape: [n, m]
    placements: {ep: shard(0)}
"""


def edit(old, new, text=BASE):
    assert old in text, old
    return text.replace(old, new, 1)


def pos(text, marker):
    """1-based (line, column) of marker in text."""
    i = text.index(marker)
    line = text.count("\n", 0, i) + 1
    col = i - (text.rfind("\n", 0, i) + 1) + 1
    return line, col


SECOND = BASE.replace("name: fam", "name: fam2").replace("itest.bad.Fam", "itest.bad.Fam2")
LIST_OF_TWO = "families:\n" + "".join(
    "  - " + "\n    ".join(t.rstrip("\n").split("\n")) + "\n" for t in (BASE, SECOND))

# (case name, {file: text}, culprit file, marker, check column?, words the message must contain)
CASES = [
    ("syntax error", {"x.yaml": edit("accepts: [config, a]", "accepts: [config, a")},
     "x.yaml", None, False, []),
    ("tab indentation", {"x.yaml": edit("  v:\n", "\tv:\n")}, "x.yaml", None, False, []),
    ("duplicate key", {"x.yaml": edit("default_variant: v\n", "default_variant: v\nname: other\n")},
     "x.yaml", "name: other", True, ["name"]),
    ("unknown key", {"x.yaml": edit("parallel_axis: ep\n", "parallel_axis: ep\ncolour: red\n")},
     "x.yaml", "colour", True, ["colour"]),
    ("unknown key in a variant",
     {"x.yaml": edit("    accepts: [config]\n", "    accepts: [config]\n    colour: red\n")},
     "x.yaml", "colour", True, ["colour"]),
    ("wrong type: list for a string", {"x.yaml": edit("default_variant: v", "default_variant: [v]")},
     "x.yaml", "default_variant", False, ["default_variant"]),
    ("wrong type: selector default", {"x.yaml": edit("default: false}", "default: 3}")},
     "x.yaml", "s: {type", False, []),
    ("wrong type: unknown type name", {"x.yaml": edit("a: {type: int", "a: {type: integer")},
     "x.yaml", "a: {type", False, []),
    ("missing required baseline", {"x.yaml": edit("baseline: itest.bad.Fam\n", "")},
     "x.yaml", None, False, ["baseline"]),
    ("missing required variants",
     {"x.yaml": "name: fam\nbaseline: itest.bad.Fam\n"}, "x.yaml", None, False, ["variants"]),
    ("missing selector default", {"x.yaml": edit("s: {type: bool, default: false}", "s: {type: bool}")},
     "x.yaml", "s: {type", False, ["default"]),
    ("duplicate baseline across files",
     {"a.yaml": BASE, "b.yaml": edit("name: fam", "name: other")},
     "b.yaml", "baseline", False, []),
    ("duplicate baseline in one list",
     {"x.yaml": "families:\n" + "".join(
         "  - " + "\n    ".join(t.rstrip("\n").split("\n")) + "\n"
         for t in (BASE, BASE.replace("name: fam", "name: other")))},
     "x.yaml", None, False, []),
    ("rule naming a missing variant", {"x.yaml": edit("    variant: w", "    variant: nope")},
     "x.yaml", "variant: nope", False, ["nope"]),
    ("default_variant naming a missing variant", {"x.yaml": edit("default_variant: v", "default_variant: zz")},
     "x.yaml", "default_variant", False, ["zz"]),
    ("reserved selector name parallel", {"x.yaml": edit("  s: {type", "  parallel: {type")
                                         .replace("when: {s: true}", "when: {parallel: true}")},
     "x.yaml", "parallel: {type", False, ["parallel"]),
    ("accepts an undeclared name", {"x.yaml": edit("accepts: [config, a]", "accepts: [config, b]")},
     "x.yaml", "accepts: [config, b]", False, []),
    ("rule on an undeclared selector", {"x.yaml": edit("when: {s: true}", "when: {t: true}")},
     "x.yaml", "when: {t", False, []),
    ("requires a non-positive size",
     {"x.yaml": edit("    accepts: [config]\n", "    accepts: [config]\n    requires: {tp: 0}\n")},
     "x.yaml", "requires: {tp: 0}", False, []),
    ("unknown parallel axis", {"x.yaml": edit("parallel_axis: ep", "parallel_axis: xp")},
     "x.yaml", "parallel_axis", False, []),
    ("placement dim out of range", {"x.yaml": edit("shard(0)", "shard(2)")},
     "x.yaml", "placements", False, []),
    ("second family of a list is bad",
     {"x.yaml": LIST_OF_TWO.replace("name: fam2\n", "name: fam2\n    colour: red\n")},
     "x.yaml", "colour", True, ["colour"]),
    ("a later file is bad", {"a.yaml": BASE, "b.yml": edit("name: fam", "name: 7x\nbogus: 1")
                             .replace("itest.bad.Fam", "itest.bad.Other")},
     "b.yml", "bogus", True, ["bogus"]),
]


class TestBadRegistry(unittest.TestCase):
    def start_expect_failure(self, files):
        tmp = H.short_tmpdir("fd-badreg-")
        self.addCleanup(shutil.rmtree, tmp, True)
        reg = os.path.join(tmp, "registry")
        os.makedirs(reg)
        for name, text in files.items():
            with open(os.path.join(reg, name), "w") as f:
                f.write(text)
        d = H.Daemon(registry=reg, tmpdir=tmp)
        argv = d.argv()
        try:
            rc, out, secs = H.run_to_exit(argv, timeout=QUICK)
        except Exception as e:   # subprocess.TimeoutExpired
            return None, "did not exit within %.0f s (%s)" % (QUICK, e), QUICK, d
        return rc, out, secs, d

    def test_valid_controls_start(self):
        # the base family and the two-family list are valid: familyd starts and serves them
        for files, names in (({"x.yaml": BASE}, ["fam"]),
                             ({"x.yaml": LIST_OF_TWO}, ["fam", "fam2"]),
                             ({"b.yml": SECOND, "a.yaml": BASE, "notes.txt": "not: [yaml"},
                              ["fam", "fam2"]),
                             ({}, [])):
            with self.subTest(files=sorted(files)):
                tmp = H.short_tmpdir("fd-goodreg-")
                self.addCleanup(shutil.rmtree, tmp, True)
                reg = os.path.join(tmp, "registry")
                os.makedirs(reg)
                for name, text in files.items():
                    with open(os.path.join(reg, name), "w") as f:
                        f.write(text)
                with H.Daemon(registry=reg, tmpdir=tmp) as d:
                    res = d.client.call("familyd.v1.FamilyService/ListFamilies")
                    self.assertEqual(res.code, "OK", repr(res))
                    self.assertEqual([f.name for f in res.reply.families], names)

    def test_bad_registries_exit_with_position(self):
        failures = []
        for name, files, culprit, marker, check_col, words in CASES:
            rc, out, secs, d = self.start_expect_failure(files)
            lines = [ln for ln in out.splitlines() if H.FILE_LINE_COL.search(ln)]
            hits = [(ln, m) for ln in lines for m in [H.FILE_LINE_COL.search(ln)]
                    if os.path.basename(m.group("file")) == culprit]
            why = []
            if rc is None:
                why.append(out)
            elif rc == 0:
                why.append("exit status 0")
            elif rc < 0:
                why.append("killed by signal %d" % -rc)
            if rc is not None and not hits:
                why.append("no line matching %s:LINE:COLUMN:" % culprit)
            if hits and marker is not None:
                want_line, want_col = pos(files[culprit], marker)
                ln, m = hits[0]
                if int(m.group("line")) != want_line:
                    why.append("line %s, expected %d" % (m.group("line"), want_line))
                if check_col and int(m.group("col")) != want_col:
                    why.append("column %s, expected %d" % (m.group("col"), want_col))
            for w in words:
                if hits and w not in hits[0][0]:
                    why.append("message does not mention %r" % w)
            if rc is not None and secs > QUICK / 2:
                why.append("took %.1f s" % secs)
            status = "ok  " if not why else "FAIL"
            first = hits[0][0].strip() if hits else (out.strip().splitlines() or [""])[-1]
            print("%s %-44s rc=%s %.2fs | %s" % (status, name, rc, secs, first[:150]))
            if why:
                failures.append("%s: %s\n    output: %s" % (name, "; ".join(why),
                                                           out.strip().replace("\n", "\n    ")[:600]))
        self.assertEqual(failures, [], "\n" + "\n".join(failures))



class TestSymlinks(unittest.TestCase):
    """Registry files that are symbolic links: followed while they stay in the directory,
    refused (without reading the target) when they lead outside it; the directory itself may
    be a link."""

    def make(self):
        tmp = H.short_tmpdir("fd-linkreg-")
        self.addCleanup(shutil.rmtree, tmp, True)
        reg = os.path.join(tmp, "registry")
        os.makedirs(os.path.join(reg, "parts"))
        return tmp, reg

    def test_links_inside_the_directory_and_a_linked_directory_load(self):
        tmp, reg = self.make()
        with open(os.path.join(reg, "parts", "fam.txt"), "w") as f:
            f.write(BASE)
        os.symlink("parts/fam.txt", os.path.join(reg, "x.yaml"))
        os.symlink(reg, os.path.join(tmp, "registry-link"))
        for path in (reg, os.path.join(tmp, "registry-link")):
            with self.subTest(registry=path):
                with H.Daemon(registry=path, tmpdir=tmp) as d:
                    res = d.client.call("familyd.v1.FamilyService/ListFamilies")
                    self.assertEqual([f.name for f in res.reply.families], ["fam"])

    def test_links_leading_outside_are_refused_unread(self):
        tmp, reg = self.make()
        secret = os.path.join(tmp, "secret.yaml")
        with open(secret, "w") as f:
            f.write("name: fam\nsecret_token: do-not-echo-7f3a\n")
        for target in (secret, "../secret.yaml", "parts/../../secret.yaml"):
            with self.subTest(target=target):
                link = os.path.join(reg, "x.yaml")
                if os.path.lexists(link):
                    os.unlink(link)
                os.symlink(target, link)
                d = H.Daemon(registry=reg, tmpdir=tmp)
                rc, out, _ = H.run_to_exit(d.argv(), timeout=QUICK)
                self.assertEqual(rc, 1, out)
                self.assertIn("error: x.yaml: a symbolic link that leads outside the registry "
                              "directory", out)
                self.assertNotIn("do-not-echo-7f3a", out)
                self.assertNotIn("secret_token", out)

if __name__ == "__main__":
    unittest.main(verbosity=2)
