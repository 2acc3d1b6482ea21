#!/usr/bin/python3
"""check-function-length.py on fixture folders: a 120-line function passes, a 121-line one is
named with its file, line, name and length; braces in comments, literals, macros and
initializers are not functions."""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
CHECKER = os.path.join(HERE, "check-function-length.py")


def function(name, lines, signature=None):
    """C text of a function whose body, braces included, spans exactly `lines` lines."""
    assert lines >= 2
    head = signature or "static int %s(int x)" % name
    body = ["        x++;"] * (lines - 3) + ["        return x;"]
    return "%s {\n%s\n}\n" % (head, "\n".join(body))


# Things that hold braces and are no function bodies, around the functions under test.
NOISE = r'''#include <stdio.h>

#define BLOCK(x) do {                     \
                if (x) {                  \
                        (void) 0;         \
                }                         \
        } while (0)

/* a comment with { an open brace
   over two lines */
struct point { int x, y; };
static const struct point origin = { 0, 0 };
static const char *const text = "} { \" }";
static const char brace = '{';
// a line comment {
enum colour { RED, GREEN };
'''


class TestCheckFunctionLength(unittest.TestCase):
    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="check-function-length-")
        self.addCleanup(shutil.rmtree, self.root)

    def write(self, rel, text):
        path = os.path.join(self.root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
        return path

    def run_checker(self, *args):
        p = subprocess.run([sys.executable, CHECKER] + list(args), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, universal_newlines=True)
        return p.returncode, p.stdout

    def test_120_lines_pass(self):
        self.write("a/ok.c", NOISE + function("exactly_120", 120) + function("short", 5))
        rc, out = self.run_checker(os.path.join(self.root, "a"))
        self.assertEqual(rc, 0, out)
        self.assertIn("2 functions, 0 over 120 lines", out)

    def test_121_lines_named(self):
        text = NOISE + function("fine", 120) + "\n" + function("too_long", 121)
        path = self.write("b/sub/long.c", text)
        first = text.splitlines().index("static int too_long(int x) {") + 1
        rc, out = self.run_checker(os.path.join(self.root, "b"))
        self.assertEqual(rc, 1, out)
        self.assertIn("%s:%d too_long 121\n" % (path, first), out)
        self.assertNotIn(" fine ", out)
        self.assertIn("2 functions, 1 over 120 lines", out)

    def test_signature_over_lines_and_headers(self):
        # A parameter list over two lines: counted from the line of the opening brace.
        sig = "static inline int\nsplit(int x,\n      int y)"
        path = self.write("c/h.h", "#pragma once\n" + function("split", 121, signature=sig))
        rc, out = self.run_checker(os.path.join(self.root, "c"))
        self.assertEqual(rc, 1, out)
        self.assertIn("%s:4 split 121\n" % path, out)

    def test_several_folders_and_max(self):
        self.write("d/one.c", function("f", 30))
        self.write("e/two.c", function("g", 10))
        rc, out = self.run_checker("--max", "20", os.path.join(self.root, "d"),
                                   os.path.join(self.root, "e"))
        self.assertEqual(rc, 1, out)
        self.assertIn("one.c:1 f 30", out)
        self.assertNotIn("two.c", out)

    def test_usage(self):
        rc, out = self.run_checker()
        self.assertEqual(rc, 2, out)
        rc, out = self.run_checker(os.path.join(self.root, "missing"))
        self.assertEqual(rc, 2, out)


if __name__ == "__main__":
    unittest.main(verbosity=2)
