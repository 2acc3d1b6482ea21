#!/usr/bin/python3
"""check-dead-code.py on a fixture tree: functions used in every way pass, and a function
defined and used nowhere (its prototype is no use) is named with its file and line."""

import unittest

import fixture_tree


TREE = {
    "common/util.h": "#pragma once\nint called(int x);\nint unused(void);\n"
                     "static inline int inline_used(void) { return called(1); }\n"
                     "#define VIA_MACRO(x) macro_target(x)\n",
    "common/util.c": '#include "util.h"\n'
                     "/* unused() in a comment is no use */\n"
                     "int called(int x) { return x; }\n"
                     "int unused(void) {\n        return 0;\n}\n"
                     "static int by_pointer(void) { return 2; }\n"
                     "int macro_target(int x) { return x; }\n"
                     "static int (*table[])(void) = { by_pointer };\n"
                     "DEFINE_CLEANUP(int, cleaned);\n"
                     "void cleaned(int x) { (void) x; }\n",
    "daemon/main.c": '#include "common/util.h"\n'
                     'int main(void) { const char *s = "unused()"; (void) s;\n'
                     "        return inline_used() + VIA_MACRO(2) + table[0](); }\n",
    "client/libfamilyd/lib.c": "int familyd_exported(void) { return 0; }\n",
    "client/libfamilyd/libfamilyd.sym": "LIBFAMILYD_1 {\n global:\n  familyd_exported;\n local: *;\n};\n",
}


class TestCheckDeadCode(unittest.TestCase):
    def run_checker(self, files):
        return fixture_tree.run_checker(self, 'check-dead-code.py', files)

    def test_only_the_unused_function_is_named(self):
        rc, out = self.run_checker(TREE)
        self.assertEqual(rc, 1, out)
        self.assertIn("1 used nowhere", out)
        self.assertIn("common/util.c:4 unused", out)

    def test_a_use_clears_it(self):
        files = dict(TREE)
        files["daemon/main.c"] = TREE["daemon/main.c"].replace("table[0]();",
                                                               "table[0]() + unused();")
        rc, out = self.run_checker(files)
        self.assertEqual(rc, 0, out)
        self.assertIn("0 used nowhere", out)


if __name__ == "__main__":
    unittest.main(verbosity=2)
