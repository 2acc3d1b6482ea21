#!/usr/bin/python3
"""docs/registry.md's examples, checked against the real familyd.

The document marks its examples with an HTML comment on the line right before the fenced block:

  <!-- registry-file: NAME.yaml -->        a complete registry file (```yaml)
  <!-- registry-error-file: NAME.yaml -->  a file that must not load (```yaml); the next fenced
                                           block (```text) holds the exact diagnostic lines
  <!-- registry-resolve: NAME.yaml -->     a ResolveRequest (```json, proto3 JSON) against the
                                           registry file NAME.yaml; the next fenced block is the
                                           answer: ```json (the ResolveResponse) or ```text
                                           ("CODE: message")

Every marked file is taken exactly as written and put alone into a fresh registry directory:
- registry-file: familyd starts on it, and ListFamilies lists exactly the families the block
  defines (their `name:` lines, in order), each with `source` in that file; then every
  registry-resolve example of that file gets the answer the document shows;
- registry-error-file: familyd exits with status 1 and logs exactly the documented lines and
  the summary; and a running familyd asked to Reload with that file added to its registry
  answers FAILED_PRECONDITION "registry reload failed: " + those lines, and keeps serving its
  previous registry (same generation, same family).
The document's samples of a failed start ("familyd: error: ...") and of a failed Reload
("registry reload failed: ...") are checked against what familyd prints and answers.
"""

import json
import os
import re
import shutil
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402
from google.protobuf import json_format  # noqa: E402  (present: the harness imported it)

DOC = os.path.join(H.SOURCE_ROOT, "docs", "registry.md")
MIN_FILES = 4
EXIT_START_FAILED = 1
DEFAULT_REGISTRY = "/etc/familyd/registry"

KEEP = """\
name: keep
baseline: itest.docs.Keep
default_variant: only
variants:
  only:
    constructor: itest.docs.Only
    accepts: [config]
"""
QUICK = float(os.environ.get("FAMILYD_BAD_START_TIMEOUT", "15"))   # ASan start-up included

MARKER = re.compile(r"^<!-- registry-(file|error-file|resolve): (\S+) -->\s*$")
FENCE_OPEN = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[A-Za-z]*)[ \t]*$")
# A family's name line: "name: X" at the top of a one-family file, "  - name: X" as the first
# key of an item of a families: list (the document's examples all write it so).
NAME_LINE = re.compile(r"^(?:[ \t]*-[ \t]+)?name:[ \t]*(?P<v>[^#\n]*?)[ \t]*(?:#.*)?$", re.M)


class Block:
    def __init__(self, lang, body, line):
        self.lang = lang
        self.body = body   # exactly as written, dedented by the fence's indentation, ends in \n
        self.line = line   # 1-based line of the opening fence


def read_block(lines, i):
    """The fenced block opening at lines[i] (None if lines[i] is not a fence) and the index
    after its closing fence."""
    m = FENCE_OPEN.match(lines[i])
    if not m:
        return None, i
    indent = m.group("indent")
    body = []
    j = i + 1
    while j < len(lines) and lines[j].rstrip() != indent + "```":
        ln = lines[j]
        body.append(ln[len(indent):] if ln.startswith(indent) else ln.lstrip())
        j += 1
    if j >= len(lines):
        raise AssertionError("docs/registry.md:%d: fenced block never closed" % (i + 1))
    return Block(m.group("lang"), "".join(x + "\n" for x in body), i + 1), j + 1


def next_block(lines, i):
    """The next fenced block at or after lines[i]: (block, index after it) or (None, len)."""
    while i < len(lines):
        b, k = read_block(lines, i)
        if b:
            return b, k
        i += 1
    return None, i


def parse_doc(path=DOC):
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    files, errors, resolves, all_blocks = [], [], [], []
    i = 0
    while i < len(lines):
        m = MARKER.match(lines[i])
        if not m:
            b, k = read_block(lines, i)
            if b:
                all_blocks.append(b)
                i = k
            else:
                i += 1
            continue
        kind, name = m.groups()
        where = "docs/registry.md:%d" % (i + 1)
        block, k = read_block(lines, i + 1)
        want_lang = "json" if kind == "resolve" else "yaml"
        if block is None or block.lang != want_lang:
            raise AssertionError("%s: the marker must be immediately followed by a ```%s block"
                                 % (where, want_lang))
        all_blocks.append(block)
        if kind == "file":
            files.append((name, block))
            i = k
            continue
        answer, k2 = next_block(lines, k)
        if answer is None:
            raise AssertionError("%s: no answer block after the example" % where)
        all_blocks.append(answer)
        if kind == "error-file":
            if answer.lang != "text":
                raise AssertionError("%s: the expected diagnostics must be a ```text block" % where)
            errors.append((name, block, answer))
        else:
            if answer.lang not in ("json", "text"):
                raise AssertionError("%s: a Resolve answer is ```json or ```text" % where)
            resolves.append((name, block, answer))
        i = k2
    return files, errors, resolves, all_blocks


def family_names(text):
    """The names of the families a registry file defines, read from its name: lines."""
    names = []
    for m in NAME_LINE.finditer(text):
        v = m.group("v")
        if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"":
            v = v[1:-1]
        names.append(v)
    return names


def yaml_family_names(text):
    """The same through a YAML parser, when /usr/bin/python3 has one (None otherwise)."""
    try:
        import yaml
    except ImportError:
        return None
    doc = yaml.safe_load(text)
    if doc is None:
        return []
    if "families" in doc:
        return [f["name"] for f in doc["families"]]
    return [doc["name"]]


FILES, ERRORS, RESOLVES, ALL_BLOCKS = parse_doc()


def make_registry(testcase, files):
    tmp = H.short_tmpdir("fd-docreg-")
    testcase.addCleanup(shutil.rmtree, tmp, True)
    reg = os.path.join(tmp, "registry")
    os.makedirs(reg)
    for name, text in files.items():
        with open(os.path.join(reg, name), "w", encoding="utf-8") as f:
            f.write(text)
    return tmp, reg


class TestDocsRegistry(unittest.TestCase):
    def test_document_has_the_examples(self):
        self.assertGreaterEqual(len(FILES), MIN_FILES,
                                "docs/registry.md marks fewer than %d complete registry files"
                                % MIN_FILES)
        self.assertGreaterEqual(len(ERRORS), 1, "docs/registry.md shows no load-error example")
        names = [n for n, _ in FILES] + [n for n, _, _ in ERRORS]
        self.assertEqual(len(names), len(set(names)), "example file names repeat: %r" % names)
        for n in names:
            self.assertRegex(n, r"^[A-Za-z0-9_.-]+\.ya?ml$", "not a registry file name")
        for n, _, _ in RESOLVES:
            self.assertIn(n, [f for f, _ in FILES], "a Resolve example names no example file")
        for n, block in FILES:
            names = family_names(block.body)
            self.assertTrue(names, "%s (line %d) defines no family" % (n, block.line))
            parsed = yaml_family_names(block.body)
            if parsed is not None:
                self.assertEqual(names, parsed, "%s: name: lines disagree with the YAML" % n)

    def check_resolve(self, client, fname, request, answer):
        where = "%s, request at docs/registry.md:%d" % (fname, request.line)
        req = json.loads(request.body)
        res = client.call("familyd.v1.FamilyService/Resolve", req)
        if answer.lang == "json":
            self.assertEqual(res.code, "OK", "%s: %r" % (where, res))
            self.assertEqual(json_format.MessageToDict(res.reply), json.loads(answer.body), where)
        else:
            code, _, message = answer.body.rstrip("\n").partition(": ")
            self.assertEqual((res.code, res.message), (code, message), where)

    def test_complete_examples_load(self):
        checked_resolves = 0
        for fname, block in FILES:
            with self.subTest(example=fname):
                tmp, reg = make_registry(self, {fname: block.body})
                with H.Daemon(registry=reg, tmpdir=tmp) as d:
                    res = d.client.call("familyd.v1.FamilyService/ListFamilies")
                    self.assertEqual(res.code, "OK", repr(res))
                    self.assertEqual([f.name for f in res.reply.families],
                                     family_names(block.body), fname)
                    for f in res.reply.families:
                        self.assertTrue(f.source.startswith(fname + ":"), f.source)
                    for rname, request, answer in RESOLVES:
                        if rname == fname:
                            self.check_resolve(d.client, fname, request, answer)
                            checked_resolves += 1
        self.assertEqual(checked_resolves, len(RESOLVES))

    def test_error_examples_at_start(self):
        # the document's terminal samples ("familyd: error: ..." lines) are shown for a registry
        # at the default path: each must be the error output of one example
        samples = [b.body.rstrip("\n") for b in ALL_BLOCKS
                   if b.lang == "text" and b.body.startswith("familyd: error: ")]
        outputs = set()
        for fname, block, expected in ERRORS:
            with self.subTest(example=fname):
                tmp, reg = make_registry(self, {fname: block.body})
                d = H.Daemon(registry=reg, tmpdir=tmp)
                rc, out, _ = H.run_to_exit(d.argv(), timeout=QUICK)
                self.assertEqual(rc, EXIT_START_FAILED, out)
                want = expected.body.rstrip("\n").split("\n")
                want.append("Failed to load the registry %s (%d problem%s)."
                            % (reg, len(want), "" if len(want) == 1 else "s"))
                got = [ln[len("familyd: error: "):] for ln in out.splitlines()
                       if ln.startswith("familyd: error: ")]
                self.assertEqual(got, want, out)
                self.assertFalse(os.path.exists(d.socket), "a failed start left its socket")
                outputs.add("\n".join("familyd: error: " + ln.replace(reg, DEFAULT_REGISTRY)
                                       for ln in got))
        for sample in samples:
            self.assertIn(sample, outputs, "the document's start output is not what familyd prints")

    def test_error_examples_on_reload(self):
        # a registry in service, whose baseline no example uses
        tmp, reg = make_registry(self, {"keep.yaml": KEEP})
        reload_samples = [b.body.rstrip("\n") for b in ALL_BLOCKS
                          if b.lang == "text" and b.body.startswith("registry reload failed: ")]
        self.assertTrue(reload_samples, "docs/registry.md shows no failed Reload answer")
        answers = set()
        with H.Daemon(registry=reg, tmpdir=tmp) as d:
            g0 = d.client.call("familyd.v1.AdminService/GetStatus").reply.registry_generation
            for fname, block, expected in ERRORS:
                with self.subTest(example=fname):
                    path = os.path.join(reg, fname)
                    with open(path, "w", encoding="utf-8") as f:
                        f.write(block.body)
                    try:
                        res = d.client.call("familyd.v1.AdminService/Reload")
                    finally:
                        os.unlink(path)
                    want = "registry reload failed: " + expected.body.rstrip("\n")
                    self.assertEqual((res.code, res.message), ("FAILED_PRECONDITION", want))
                    answers.add(res.message)
                    st = d.client.call("familyd.v1.AdminService/GetStatus").reply
                    self.assertEqual((st.registry_generation, st.families), (g0, 1))
                    r = d.client.call("familyd.v1.FamilyService/Resolve", family="keep")
                    self.assertEqual((r.code, r.reply.resolved.variant if r.ok else None),
                                     ("OK", "only"), repr(r))
            for sample in reload_samples:
                self.assertIn(sample, answers,
                              "the document's Reload answer is not one familyd gives")
            # the directory is whole again: the next reload succeeds
            res = d.client.call("familyd.v1.AdminService/Reload")
            self.assertEqual((res.code, res.reply.registry_generation if res.ok else None),
                             ("OK", g0 + 1), repr(res))


if __name__ == "__main__":
    unittest.main(verbosity=2)
