#!/usr/bin/python3
"""check-doc-links.py on fixture trees: links to files, folders and headings (GitHub's anchors,
repeats and explicit anchors included) pass, links in code are not links, and a link to a
missing file, a missing heading of another page or of the same page is named with its file
and line."""

import unittest

import fixture_tree


GOOD = {
    "README.md": "# Project\n\n"
                 "See [operating](docs/operating.md), [its limits](docs/operating.md#limits-and-caps)\n"
                 "and [the second one](docs/operating.md#limits-and-caps-1), the\n"
                 "[`--flag` section](docs/operating.md#the---flag-option), [docs](docs/),\n"
                 "[an anchor](docs/operating.md#kept), [here](#project), [web](https://x.org/a b)\n"
                 "and [a file](LICENSE).\n\n"
                 "[ref]: docs/operating.md#limits-and-caps\n",
    "docs/operating.md": "# Operating\n\nBack to the [README](../README.md).\n\n"
                         "## Limits and caps\n\n## Limits and caps\n\n"
                         "## The `--flag` option\n\n<a id=\"kept\"></a>\n\n"
                         "```\n[not a link](missing.md)\n# not a heading\n```\n\n"
                         "Inline `[not a link](missing.md)` either.\n",
    "LICENSE": "text\n",
}

BAD = {
    "README.md": "# Project\n\n"
                 "[gone](docs/gone.md) and [moved](docs/operating.md#running)\n"
                 "and [self](#no-such-section).\n",
    "docs/operating.md": "# Operating\n\n## Limits\n\n"
                         "```\n# Running\n```\n",
}


class TestCheckDocLinks(unittest.TestCase):
    def run_checker(self, files):
        return fixture_tree.run_checker(self, 'check-doc-links.py', files)

    def test_good_links_pass(self):
        rc, out = self.run_checker(GOOD)
        self.assertEqual(rc, 0, out)
        self.assertIn("2 Markdown files checked, 0 broken links", out)

    def test_broken_links_are_named(self):
        rc, out = self.run_checker(BAD)
        self.assertEqual(rc, 1, out)
        self.assertIn("3 broken links", out)
        self.assertIn("README.md:3: docs/gone.md (no such file or folder)", out)
        # A heading inside a code block is no heading.
        self.assertIn("README.md:3: docs/operating.md#running (no heading or anchor 'running' "
                      "in docs/operating.md)", out)
        self.assertIn("README.md:4: #no-such-section (no heading or anchor 'no-such-section' "
                      "in README.md)", out)


if __name__ == "__main__":
    unittest.main(verbosity=2)
