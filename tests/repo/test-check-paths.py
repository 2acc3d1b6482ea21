#!/usr/bin/python3
"""check-paths.py on fixture trees (no git metadata: every file is checked): a tree that names
only its own files and public trackers passes, and each reach outside the repository, a
tracker's issue number among them, is named with its file and line. The fixtures' strings are
built from pieces so that the real check does not find them in this file."""

import unittest

import fixture_tree

ISSUE = "iss" + "ue"

GOOD = {
    "README.md": "# Project\n\nSee docs/security.md; an %s of its own, a t%s 5,\n"
                 "and grpc/grpc#34782 upstream.\n" % (ISSUE, ISSUE),
    "src/a.c": "/* a.c: nothing outside. */\n",
}

BAD = {
    "src/b.c": "/* the %s 37 fix */\n" % ISSUE,
    "docs/c.md": "As %s #16 asked.\n" % ISSUE.capitalize(),
    "tests/d.py": "# %ss 31 and 32\n" % ISSUE,
    "tests/e.sh": "cat " + ".." + "/" + "shared/notes.md\n",
}


class TestCheckPaths(unittest.TestCase):
    def run_checker(self, files):
        return fixture_tree.run_checker(self, 'check-paths.py', files)

    def test_good_tree_passes(self):
        rc, out = self.run_checker(GOOD)
        self.assertEqual(rc, 0, out)
        self.assertIn("2 files checked, 0 lines reach outside the repository", out)

    def test_each_reach_is_named(self):
        rc, out = self.run_checker(dict(GOOD, **BAD))
        self.assertEqual(rc, 1, out)
        self.assertIn("4 lines reach outside the repository", out)
        why = "a tracker's %s number, which users do not have: say what it means" % ISSUE
        for rel, line in (("src/b.c", "/* the %s 37 fix */" % ISSUE),
                          ("docs/c.md", "As %s #16 asked." % ISSUE.capitalize()),
                          ("tests/d.py", "# %ss 31 and 32" % ISSUE)):
            self.assertIn("%s:1: %s (%s)" % (rel, line, why), out)
        self.assertIn("tests/e.sh:1:", out)
        self.assertIn("a folder beside the checkout", out)


if __name__ == "__main__":
    unittest.main()
