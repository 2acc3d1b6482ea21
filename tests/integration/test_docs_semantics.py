#!/usr/bin/python3
"""docs/semantics.md stays true to the daemon.

1. Reason codes: every reason code the daemon's sources can send (collected from the calls of
   the error constructors, family_error_set() and violation_add(), and of every wrapper that
   passes a reason through to them) is in the doc's reason-code table with the same status
   codes, and every code of the table is in the sources.
2. Conformance: every exact message tests/conformance/cases.json expects is one of the doc's
   message templates (in a row with the expected status), or appears literally in the doc.
3. Live: errors provoked from a real daemon through real calls have exactly the text, status,
   reason and ErrorInfo field of one of the doc's rows, its placeholders filled in.

Each check is a function returning a list of problems; the tests assert the real doc has
none, and that a doc broken on purpose (a row dropped, a code added, a text reworded, a status
changed) has some, so no check passes vacuously.

Doc conventions relied on (docs/semantics.md, "How messages are written"):
- a table whose header has the columns `message`, `status` and `reason` (and optionally
  `field`) lists errors: every code span in its message cell is a template; `<name>` in a
  template stands for a value (one name twice: the same value), all else is literal; status is
  one gRPC status name, or `violation` for a Validate violation; field is `—` (no ErrorInfo
  metadata) or a code span, possibly with placeholders;
- the table whose first header cell is `reason code` lists every reason code (in backticks),
  its status names (and `violation`) and its meaning.
"""

import json
import os
import re
import shutil
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402

DOC = os.path.join(H.SOURCE_ROOT, "docs", "semantics.md")
DAEMON_SOURCES = os.path.join(H.SOURCE_ROOT, "daemon")
CASES = os.path.join(H.CONFORMANCE, "cases.json")
REGISTRY = os.path.join(H.CONFORMANCE, "registry")

STATUS_NAMES = {"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
                "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
                "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL",
                "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"}
VIOLATION = "violation"
MIN_LITERAL = 10   # a template must say something: at least this many literal characters


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


# ---------------------------------------------------------------------------------------------
# 1. Reason codes in the daemon's C sources
#
# The constructors of a user-facing failure are family_error_set() / family_error_setv()
# (daemon/core/error.h: reason is the third argument, status the second) and, for Validate,
# violation_add() (daemon/core/validate.c: reason third, no status). A function or macro that
# passes one of its own parameters as the reason of such a call is a wrapper, found here and
# treated the same way (fail_q, target_not_found, ...). At each call the reason must be a
# string literal (or literals, as in `cond ? "A" : "B"`) or a parameter of the enclosing
# wrapper; anything else is reported, so a new way of passing a reason cannot go unseen.

SEED_SINKS = {
    "family_error_setv": {"reason": 2, "status": ("arg", 1)},
    "family_error_set": {"reason": 2, "status": ("arg", 1)},
    "violation_add": {"reason": 2, "status": ("violation",)},
}
IDENT = r"[A-Za-z_]\w*"
LITERAL_RE = re.compile(r'"((?:[^"\\\n]|\\.)*)"')
STATUS_RE = re.compile(r"\bFAMILY_STATUS_([A-Z_]+)\b")
DECLARATION_RE = re.compile(r"^(?:const\s+)?char\s*\*\s*(?:const\s+)?\w+$")


def strip_comments(text):
    """C text without comments (line count kept); string and char literals untouched."""
    out, i, n = [], 0, len(text)
    while i < n:
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text[i] in "\"'":
            q, j = text[i], i + 1
            while j < n and text[j] != q and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def mask_literals(text):
    """The same text, the insides of string and char literals blanked (for bracket matching)."""
    return re.sub(r'"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'',
                  lambda m: m.group(0)[0] + " " * (len(m.group(0)) - 2) + m.group(0)[-1], text)


def call_arguments(text, masked, open_paren):
    """The top-level arguments of the call whose '(' is at open_paren."""
    depth, start, args = 0, open_paren + 1, []
    for i in range(open_paren, len(masked)):
        ch = masked[i]
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth == 0:
                args.append(text[start:i].strip())
                return args
        elif ch == "," and depth == 1:
            args.append(text[start:i].strip())
            start = i + 1
    raise ValueError("unbalanced parentheses")


def param_names(param_text):
    names = []
    for p in param_text.split(","):
        p = re.sub(r"\[[^\]]*\]", "", p).strip()
        ids = re.findall(IDENT, p)
        if ids and p not in ("void", "..."):
            names.append(ids[-1])
    return names


def bodies(masked):
    """[(start, end, name, parameter names)] of function bodies and function-like macros."""
    out = []
    for m in re.finditer(r"^[ \t]*#[ \t]*define[ \t]+(%s)\(([^)]*)\)((?:[^\n]*\\\n)*[^\n]*)"
                         % IDENT, masked, re.M):
        out.append((m.start(3), m.end(3), m.group(1), [p.strip() for p in m.group(2).split(",")
                                                       if p.strip()]))
    depth, header_start, i, n = 0, 0, 0, len(masked)
    while i < n:
        ch = masked[i]
        if ch == "#" and depth == 0 and (i == 0 or masked[i - 1] == "\n"):
            while True:   # a preprocessor line, with its continuations
                j = masked.find("\n", i)
                if j < 0:
                    j = n
                    break
                if masked[j - 1] != "\\":
                    break
                i = j + 1
            i = header_start = j
            continue
        if ch == "{":
            if depth == 0:
                header, body_start = masked[header_start:i], i
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                m = re.search(r"(%s)\s*\(([^()]*(?:\([^()]*\)[^()]*)*)\)\s*$" % IDENT, header)
                if m and "=" not in header:
                    out.append((body_start, i, m.group(1), param_names(m.group(2))))
                header_start = i + 1
        elif ch == ";" and depth == 0:
            header_start = i + 1
        i += 1
    return out


def c_sources(root):
    """[(path relative to the source root, text without comments)] of root's .c and .h files."""
    out = []
    for d, _, files in os.walk(root):
        for f in files:
            if f.endswith((".c", ".h")):
                p = os.path.join(d, f)
                out.append((os.path.relpath(p, H.SOURCE_ROOT), strip_comments(read(p))))
    return sorted(out)


def collect_reasons(sources):
    """({reason: {"statuses": set, "sites": [path:line]}}, [problems]) from [(path, text)]."""
    files = [(path, text, mask_literals(text)) for path, text in sources]
    files = [(path, text, masked, bodies(masked)) for path, text, masked in files]
    sinks = dict(SEED_SINKS)
    while True:
        reasons, problems, wrappers = {}, [], {}
        for path, text, masked, funcs in files:
            for name, sink in sinks.items():
                for m in re.finditer(r"(?<![\w.>])%s\s*\(" % re.escape(name), masked):
                    line_start = masked.rfind("\n", 0, m.start()) + 1
                    if re.match(r"\s*#\s*define\b", masked[line_start:m.start()]):
                        continue   # the macro's own definition
                    where = "%s:%d" % (path, text.count("\n", 0, m.start()) + 1)
                    args = call_arguments(text, masked, m.end() - 1)
                    if len(args) <= sink["reason"]:
                        problems.append("%s: %s() with too few arguments" % (where, name))
                        continue
                    reason_arg = args[sink["reason"]]
                    if DECLARATION_RE.match(reason_arg):
                        continue   # a declaration or definition, not a call
                    inside = [f for f in funcs if f[0] <= m.start() < f[1]]
                    owner, params = (inside[-1][2], inside[-1][3]) if inside else (None, [])

                    status_param, statuses = None, []
                    if sink["status"][0] == "violation":
                        statuses = [VIOLATION]
                    elif sink["status"][0] == "fixed":
                        statuses = list(sink["status"][1])
                    else:
                        status_arg = args[sink["status"][1]]
                        statuses = STATUS_RE.findall(status_arg)
                        bare = status_arg.strip("() ")
                        if not statuses and bare in params:
                            status_param = params.index(bare)
                        elif not statuses:
                            problems.append("%s: status argument %r of %s() not understood"
                                            % (where, status_arg, name))
                            continue

                    literals = LITERAL_RE.findall(reason_arg)
                    if literals:
                        bad = [x for x in literals if not re.fullmatch(r"[A-Z][A-Z0-9_]*", x)]
                        if bad or status_param is not None:
                            problems.append("%s: reason %r of %s() not an upper-case code with "
                                            "a known status" % (where, reason_arg, name))
                            continue
                        if len(literals) == len(statuses) == 2:   # cond ? A : B, twice
                            pairs = list(zip(literals, statuses))
                        else:
                            pairs = [(x, s) for x in literals for s in statuses]
                        for x, s in pairs:
                            r = reasons.setdefault(x, {"statuses": set(), "sites": []})
                            r["statuses"].add(s)
                            r["sites"].append(where)
                        continue

                    bare = reason_arg.strip("() ")
                    if owner and bare in params:
                        if owner not in sinks:
                            if status_param is not None:
                                status = ("arg", status_param)
                            elif statuses == [VIOLATION]:
                                status = ("violation",)
                            else:
                                status = ("fixed", tuple(sorted(set(statuses))))
                            wrappers[owner] = {"reason": params.index(bare), "status": status}
                        continue
                    problems.append("%s: reason argument %r of %s() is neither a literal nor a "
                                    "parameter of a wrapper" % (where, reason_arg, name))
        if not wrappers:
            return reasons, problems
        sinks.update(wrappers)


# ---------------------------------------------------------------------------------------------
# The doc

def split_row(line):
    """Cells of a markdown table row; a | inside a code span does not split."""
    cells, cur, in_code = [], [], False
    for ch in line.strip().strip("|"):
        if ch == "`":
            in_code = not in_code
        if ch == "|" and not in_code:
            cells.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    cells.append("".join(cur).strip())
    return cells


def tables(doc):
    """[(header cells lowercased, [(line number, {column: cell})])]."""
    out, lines, i = [], doc.split("\n"), 0
    while i < len(lines) - 1:
        if lines[i].startswith("|") and re.match(r"^\|\s*:?-{3,}", lines[i + 1]):
            header = [c.lower() for c in split_row(lines[i])]
            rows, i = [], i + 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append((i + 1, dict(zip(header, split_row(lines[i])))))
                i += 1
            out.append((header, rows))
        else:
            i += 1
    return out


def code_spans(text):
    return re.findall(r"`([^`]+)`", text)


def message_rows(doc):
    """Rows of the error tables: {"line", "templates", "status", "reason", "field"}."""
    rows = []
    for header, body in tables(doc):
        if not {"message", "status", "reason"} <= set(header):
            continue
        for line, cells in body:
            rows.append({"line": line, "templates": code_spans(cells["message"]),
                         "status": cells["status"].strip("` "),
                         "reason": cells["reason"].strip("` "),
                         "field": cells.get("field", "—").strip()})
    return rows


def reason_table(doc):
    """{code: (set of statuses and/or 'violation', line)} of the reason-code table, or None."""
    found = [body for header, body in tables(doc) if header and header[0] == "reason code"]
    if len(found) != 1:
        return None
    out = {}
    for line, cells in found[0]:
        code = cells["reason code"].strip("` ")
        if code in out:
            out[code] = (None, line)   # listed twice
            continue
        out[code] = (set(re.findall(r"[A-Z][A-Z_]+|%s" % VIOLATION, cells.get("status", ""))),
                     line)
    return out


PLACEHOLDER = re.compile(r"<([A-Za-z_][A-Za-z0-9_]*)>")


def template_regex(template):
    parts, seen, pos = [], set(), 0
    for m in PLACEHOLDER.finditer(template):
        parts.append(re.escape(template[pos:m.start()]))
        name = m.group(1)
        parts.append("(?P=%s)" % name if name in seen else "(?P<%s>.+?)" % name)
        seen.add(name)
        pos = m.end()
    parts.append(re.escape(template[pos:]))
    return re.compile("".join(parts), re.S)


def literal_length(template):
    return len(PLACEHOLDER.sub("", template))


def fill(template, values):
    """The template with its placeholders replaced, or None when a value is missing."""
    missing = [n for n in PLACEHOLDER.findall(template) if n not in values]
    if missing:
        return None
    return PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), template)


def doc_outside_error_tables(doc):
    """The doc without the rows of its error tables (for literal mentions)."""
    lines = doc.split("\n")
    for row in message_rows(doc):
        lines[row["line"] - 1] = ""
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# The checks: each returns a list of problems

def reason_problems(doc, reasons):
    table = reason_table(doc)
    if table is None:
        return ["docs/semantics.md: no single table whose first column is 'reason code'"]
    problems = []
    for code, (statuses, line) in sorted(table.items()):
        if statuses is None:
            problems.append("docs/semantics.md:%d: %s listed twice" % (line, code))
        elif code not in reasons:
            problems.append("docs/semantics.md:%d: reason code %s is not sent by the daemon "
                            "(no error constructor in daemon/ uses it)" % (line, code))
        elif statuses != reasons[code]["statuses"]:
            problems.append("docs/semantics.md:%d: %s documented as %s, the sources send it as "
                            "%s (%s)" % (line, code, sorted(statuses),
                                         sorted(reasons[code]["statuses"]),
                                         ", ".join(reasons[code]["sites"])))
    for code in sorted(set(reasons) - set(table)):
        problems.append("reason code %s (%s) is missing from the table in docs/semantics.md"
                        % (code, ", ".join(reasons[code]["sites"])))
    return problems


def row_problems(doc):
    """Every error row: known reason, a status that reason has, templates that say something."""
    table = reason_table(doc) or {}
    problems = []
    for row in message_rows(doc):
        where = "docs/semantics.md:%d" % row["line"]
        if row["status"] not in STATUS_NAMES | {VIOLATION}:
            problems.append("%s: status %r is not a gRPC status name nor %r"
                            % (where, row["status"], VIOLATION))
        known = table.get(row["reason"], (None,))[0]
        if not known:
            problems.append("%s: reason %r is not in the reason-code table"
                            % (where, row["reason"]))
        elif row["status"] not in known:
            problems.append("%s: %s with status %s, the reason-code table says %s"
                            % (where, row["reason"], row["status"], sorted(known)))
        if not row["templates"]:
            problems.append("%s: no message template in the row" % where)
        for t in row["templates"]:
            if literal_length(t) < MIN_LITERAL:
                problems.append("%s: template %r has fewer than %d literal characters"
                                % (where, t, MIN_LITERAL))
        if row["field"] != "—" and not code_spans(row["field"]):
            problems.append("%s: field %r is neither '—' nor a code span" % (where, row["field"]))
    return problems


def expected_messages(cases):
    """[(case name, rpc, code, message)] of every step that expects an exact message."""
    out = []
    for case in cases["cases"]:
        for step in case["steps"]:
            e = step.get("expect", {})
            if "message" in e:
                out.append((case["name"], step["rpc"], e.get("code", "OK"), e["message"]))
    return out


def conformance_problems(doc, expected):
    rows = message_rows(doc)
    mentions = set(code_spans(doc_outside_error_tables(doc)))
    problems = []
    for name, rpc, code, message in expected:
        matches = [r for r in rows for t in r["templates"] if template_regex(t).fullmatch(message)]
        if any(r["status"] == code for r in matches):
            continue
        if message in mentions:
            continue
        if matches:
            problems.append("case %r (%s): %r matches docs/semantics.md:%s, but with status %s, "
                            "not %s" % (name, rpc, message,
                                        ",".join(str(r["line"]) for r in matches),
                                        "/".join(sorted({r["status"] for r in matches})), code))
        else:
            problems.append("case %r (%s): %s %r is in no template of docs/semantics.md"
                            % (name, rpc, code, message))
    return problems


def live_problems(doc, observations):
    """observations: dicts rpc, code, message, reason, field (None: no metadata), values."""
    rows = message_rows(doc)
    problems = []
    for o in observations:
        candidates = [r for r in rows if r["reason"] == o["reason"]]
        hits = [r for r in candidates for t in r["templates"]
                if fill(t, o["values"]) == o["message"]]
        what = "%s: %s %s %r" % (o["rpc"], o["code"], o["reason"], o["message"])
        if not hits:
            problems.append("%s: no row of docs/semantics.md with reason %s gives this text "
                            "(with %r); candidates: %s" % (what, o["reason"], o["values"], "; ".join(
                                "%d: %s" % (r["line"], " / ".join(r["templates"]))
                                for r in candidates) or "none"))
            continue
        ok = False
        for r in hits:
            if r["status"] != o["code"]:
                continue
            if o["code"] == VIOLATION:
                ok = True
                break
            if r["field"] == "—":
                ok = o["field"] is None
            else:
                ok = o["field"] is not None and \
                    o["field"] in [fill(f, o["values"]) for f in code_spans(r["field"])]
            if ok:
                break
        if not ok:
            problems.append("%s (field %r) does not agree with the status or field of "
                            "docs/semantics.md:%s" % (what, o["field"],
                                                      ",".join(str(r["line"]) for r in hits)))
    return problems


# ---------------------------------------------------------------------------------------------
# Broken docs, to show that each check can fail

def drop_reason_row(doc, code):
    return "\n".join(l for l in doc.split("\n") if not l.startswith("| `%s` |" % code))


def add_reason_row(doc, code):
    return doc.replace("| `AMBIGUOUS_FAMILY` |", "| `%s` | INTERNAL | made up |\n"
                       "| `AMBIGUOUS_FAMILY` |" % code, 1)


def set_reason_status(doc, code, status):
    return re.sub(r"^\| `%s` \| [^|]+\|" % code, "| `%s` | %s |" % (code, status), doc,
                  flags=re.M)


def set_row_status(doc, reason, old, new):
    return doc.replace("| %s | %s |" % (old, reason), "| %s | %s |" % (new, reason))


class TestReasonCodes(unittest.TestCase):
    """Check 1: the reason-code table against the daemon's sources (no daemon needed)."""

    @classmethod
    def setUpClass(cls):
        cls.doc = read(DOC)
        cls.reasons, cls.problems = collect_reasons(c_sources(DAEMON_SOURCES))

    def test_collector_understands_every_call(self):
        self.assertEqual(self.problems, [])
        # Sites from every way a reason reaches a client: a direct call, a macro around it
        # (MESH_INVALID, SHAPE_ERROR), a function wrapper (target_not_found), a macro wrapper
        # (fail_qq), a ternary (BUILD_QUEUE), a violation.
        for code, status in (("UNKNOWN_ARGUMENTS", "INVALID_ARGUMENT"),
                             ("MESH_INVALID", "INVALID_ARGUMENT"),
                             ("SHAPE", "INVALID_ARGUMENT"),
                             ("UNKNOWN_FAMILY", "NOT_FOUND"),
                             ("AMBIGUOUS_FAMILY", "INVALID_ARGUMENT"),
                             ("BINDING", "INVALID_ARGUMENT"),
                             ("BUILD_QUEUE", "RESOURCE_EXHAUSTED"),
                             ("SHUTTING_DOWN", "UNAVAILABLE"),
                             ("UNKNOWN_BUILD", VIOLATION)):
            self.assertIn(code, sorted(self.reasons))
            self.assertEqual(self.reasons[code]["statuses"], {status}, code)
        self.assertGreaterEqual(len(self.reasons), 40)

    def test_collector_reports_what_it_cannot_read(self):
        src = r'''
static int wrap(FamilyError *e, const char *why, const char *what) {
        return family_error_set(e, FAMILY_STATUS_NOT_FOUND, why, NULL, "%s", what);
}
int a(FamilyError *e) { return wrap(e, "WRAPPED", "x"); }
int b(FamilyError *e, const char *r) { const char *x = r; return family_error_set(e, FAMILY_STATUS_INTERNAL, x, NULL, "y"); }
int c(FamilyError *e) { return family_error_set(e, FAMILY_STATUS_INTERNAL, "lower", NULL, "z"); }
'''
        reasons, problems = collect_reasons([("x.c", strip_comments(src))])
        self.assertEqual(reasons["WRAPPED"]["statuses"], {"NOT_FOUND"})
        self.assertEqual(len(problems), 2, problems)

    def test_table_matches_sources(self):
        self.assertEqual(reason_problems(self.doc, self.reasons), [])

    def test_error_rows_are_consistent(self):
        self.assertEqual(row_problems(self.doc), [])

    def test_checks_fail_on_a_wrong_table(self):
        self.assertTrue(reason_problems(drop_reason_row(self.doc, "SHAPE"), self.reasons))
        self.assertTrue(reason_problems(add_reason_row(self.doc, "MADE_UP"), self.reasons))
        self.assertTrue(reason_problems(set_reason_status(self.doc, "MESH_IN_USE", "NOT_FOUND"),
                                        self.reasons))
        self.assertTrue(reason_problems(self.doc.replace("| reason code |", "| code |"),
                                        self.reasons))
        more = dict(self.reasons, NEW_CODE={"statuses": {"INTERNAL"}, "sites": ["x.c:1"]})
        self.assertTrue(reason_problems(self.doc, more))
        self.assertTrue(row_problems(set_row_status(self.doc, "MESH_IN_USE",
                                                    "FAILED_PRECONDITION", "NOT_FOUND")))
        self.assertTrue(row_problems(drop_reason_row(self.doc, "DTYPE")))


class TestConformanceMessages(unittest.TestCase):
    """Check 2: the messages the conformance cases expect are documented."""

    @classmethod
    def setUpClass(cls):
        cls.doc = read(DOC)
        with open(CASES, encoding="utf-8") as f:
            cls.expected = expected_messages(json.load(f))

    def test_cases_expect_messages(self):
        self.assertGreaterEqual(len(self.expected), 20)

    def test_every_expected_message_is_documented(self):
        self.assertEqual(conformance_problems(self.doc, self.expected), [])

    def test_templates(self):
        r = template_regex("variant '<variant>' requires <axis>=<value>; job has <axis>=<size>")
        self.assertTrue(r.fullmatch("variant 'mxfp8' requires tp=1; job has tp=2"))
        self.assertFalse(r.fullmatch("variant 'mxfp8' requires tp=1; job has ep=2"))
        self.assertFalse(r.fullmatch("variant 'mxfp8' requires tp=1; job had tp=2"))
        self.assertTrue(template_regex("selector '<key>' must be <type>").fullmatch(
            "selector 'use_mxfp8' must be bool"))
        self.assertEqual(fill("mesh '<id>' is used by <n> builds", {"id": "m", "n": 2}),
                         "mesh 'm' is used by 2 builds")
        self.assertIsNone(fill("mesh '<id>' not found", {}))

    def test_checks_fail_on_a_wrong_doc(self):
        reworded = self.doc.replace("must identify exactly one registration",
                                    "must name exactly one registration")
        self.assertTrue(conformance_problems(reworded, self.expected))
        wrong_status = set_row_status(self.doc, "UNKNOWN_FAMILY", "NOT_FOUND", "INVALID_ARGUMENT")
        self.assertTrue(conformance_problems(wrong_status, self.expected))
        dropped = "\n".join(l for l in self.doc.split("\n") if "| REQUIREMENT |" not in l)
        self.assertTrue(conformance_problems(dropped, self.expected))


# ---------------------------------------------------------------------------------------------
# 3. Live: a real daemon's errors

GE = "grouped_experts"
ATT = "attention"
GE_CFG = {"num_experts": 4, "hidden_size": 8, "moe_intermediate_size": 4,
          "initializer_range": 0.02}
ATT_CFG = {"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "hidden_size": 32,
           "initializer_range": 0.02}
BUDGET = 65536
MAX_BUILDS = 4


class TestLiveErrors(unittest.TestCase):
    """Check 3: errors of a real daemon, through real calls, against the doc's rows."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = H.short_tmpdir("fd-docsem-")
        cls.registry = os.path.join(cls.tmp, "registry")
        shutil.copytree(REGISTRY, cls.registry)
        cls.d = H.Daemon(registry=cls.registry, host_devices=8,
                         extra_args=["--shm-budget", str(BUDGET), "--max-builds", str(MAX_BUILDS),
                                     "--build-grace-ms", "0"])
        try:
            cls.d.start()
            cls.P = cls.d.protos
            cls.observations = []
            cls.provoke()
        except BaseException:
            cls.d.cleanup()
            shutil.rmtree(cls.tmp, ignore_errors=True)
            raise

    @classmethod
    def tearDownClass(cls):
        try:
            cls.d.stop()
        finally:
            cls.d.cleanup()
            shutil.rmtree(cls.tmp, ignore_errors=True)

    # Calls -----------------------------------------------------------------------------------

    @classmethod
    def call(cls, rpc, request=None, **fields):
        return cls.d.client.call("familyd.v1." + rpc, request, **fields)

    @classmethod
    def ok(cls, res):
        if res.code != "OK":
            raise AssertionError("expected OK: %r" % (res,))
        return res.reply

    @classmethod
    def error(cls, rpc, res, values):
        """Records a failed call: its code, text, and the reason and field of its ErrorInfo."""
        if res.code == "OK":
            raise AssertionError("%s succeeded, an error was expected" % rpc)
        st, infos = cls.d.client.error_details(res)
        if st is None or len(infos) != 1 or infos[0].domain != "familyd" or \
                st.message != res.message:
            raise AssertionError("%s: %r has no proper google.rpc.Status detail: %s"
                                 % (rpc, res, st))
        cls.observations.append({"rpc": rpc, "code": res.code, "message": res.message,
                                 "reason": infos[0].reason,
                                 "field": infos[0].metadata.get("field"), "values": values})

    @classmethod
    def build_request(cls, family, config=None, module=None, args=None, mesh_id="",
                      context=None, materialize=None):
        req = cls.P.cls("familyd.v1.BuildRequest")(family=family, mesh_id=mesh_id)
        for k, v in (args or {}).items():
            req.arguments[k].CopyFrom(cls.P.value(v))
        if config is not None:
            req.config.SetInParent()
            for k, v in config.items():
                req.config.fields[k].CopyFrom(cls.P.value(v))
        if module is not None:
            req.module.SetInParent()
            req.module.fqn = module
        for k, v in (context or {}).items():
            setattr(req.context, k, v)
        if materialize is not None:
            req.materialize.enabled = True
            # Each its own build (identical requests would share one), freed by its release
            # (--build-grace-ms 0).
            req.private_build = True
            for k, v in materialize.items():
                if k == "ranks":
                    req.materialize.ranks.extend(v)
                else:
                    setattr(req.materialize, k, v)
        return req

    @classmethod
    def build(cls, *a, **kw):
        return cls.call("FamilyService/Build", cls.build_request(*a, **kw))

    @classmethod
    def resolve(cls, family, args=None, context=None):
        req = cls.P.cls("familyd.v1.ResolveRequest")(family=family)
        for k, v in (args or {}).items():
            req.arguments[k].CopyFrom(cls.P.value(v))
        for k, v in (context or {}).items():
            setattr(req.context, k, v)
        return cls.call("FamilyService/Resolve", req)

    @classmethod
    def create_mesh(cls, dims, ranks=None, **sizes):
        m = {"deviceMesh": [{"name": n, "size": s} for n, s in dims]}
        if ranks is not None:
            m["ranks"] = [str(r) for r in ranks]
        for k, v in sizes.items():
            m[k] = str(v)
        return cls.call("MeshService/CreateMesh", {"mesh": m})

    @classmethod
    def provoke(cls):
        err = cls.error
        # Resolve and GetFamily
        err("GetFamily", cls.call("FamilyService/GetFamily", family="nope"), {"target": "nope"})
        err("Resolve", cls.resolve("norm"), {"target": "norm"})
        err("Resolve", cls.resolve("engram"), {})
        err("Resolve", cls.resolve(GE, {"zeta": 1, "alpha": 2}),
            {"family": GE, "keys": repr(["alpha", "zeta"])})
        err("Resolve", cls.resolve(ATT, {"window": "wide"}), {"key": "window", "type": "int"})
        err("Resolve", cls.resolve(GE, context={"cp_size": 0}), {"axis": "cp"})
        err("Resolve", cls.resolve(GE, context={"ep": True}), {"axis": "ep"})
        err("Resolve", cls.resolve(GE, {"use_mxfp8": True}, {"ep_size": 4}),
            {"variant": "mxfp8", "axis": "ep", "values": "[1, 2]", "size": 4})
        # Meshes
        err("CreateMesh", cls.create_mesh([("tp", 2), ("tp", 4)]), {"dim": "tp"})
        err("CreateMesh", cls.create_mesh([("dp", 2), ("tp", 4)], ep_size=4),
            {"axis": "ep", "size": 4, "names": repr(("dp", "tp"))})
        err("CreateMesh", cls.create_mesh([("dp", 2), ("tp", 2)]),
            {"view": "device_mesh", "product": 4, "n": 8})
        mesh = cls.ok(cls.create_mesh([("dp", 2), ("ep", 4)])).mesh_id
        b = cls.ok(cls.build(GE, GE_CFG, mesh_id=mesh)).build.build_id
        err("DeleteMesh", cls.call("MeshService/DeleteMesh", mesh_id=mesh),
            {"mesh_id": mesh, "n": 1})
        cls.ok(cls.call("FamilyService/ReleaseBuild", build_id=b))
        cls.ok(cls.call("MeshService/DeleteMesh", mesh_id=mesh))
        err("GetMesh", cls.call("MeshService/GetMesh", mesh_id=mesh), {"mesh_id": mesh})
        # Build
        cfg = dict(GE_CFG)
        del cfg["hidden_size"]
        err("Build", cls.build(GE, cfg),
            {"parameter": "gate_up_proj", "config_field": "hidden_size"})
        err("Build", cls.build(ATT, dict(ATT_CFG, hidden_size=-3)),
            {"parameter": "wq", "dim": 1, "value": -3})
        err("Build", cls.build(GE, GE_CFG, module="layers.0.mlp"), {})
        err("Build", cls.build(GE, GE_CFG, args={"use_mxfp8": True, "activation": "gelu"}),
            {"variant": "mxfp8", "keys": repr(["activation"])})
        err("Build", cls.build(GE, GE_CFG, materialize={"dtype": "int8"}), {"dtype": "int8"})
        four = cls.ok(cls.create_mesh([("dp", 4)], ranks=[0, 1, 2, 3])).mesh_id
        err("Build", cls.build(GE, GE_CFG, mesh_id=four, materialize={"ranks": [1, 5]}),
            {"rank": 5})
        ep4 = cls.ok(cls.create_mesh([("dp", 2), ("ep", 4)])).mesh_id
        err("Build", cls.build(GE, dict(GE_CFG, num_experts=6), mesh_id=ep4),
            {"parameter": "gate_up_proj", "experts": 6, "dim": 0, "ep": 4})
        err("GetBuild", cls.call("FamilyService/GetBuild", build_id="bld-nope"),
            {"build_id": "bld-nope"})
        # Budgets: 4 experts x 32 x 64 + 4 x 32 x 32 float32 = 49152 bytes, one rank.
        big = dict(GE_CFG, hidden_size=32, moe_intermediate_size=32)
        need = (4 * 32 * 64 + 4 * 32 * 32) * 4
        held = [cls.ok(cls.build(GE, big, materialize={})).build.build_id]
        err("Build", cls.build(GE, big, materialize={}),
            {"need": need, "used": need, "budget": BUDGET})
        while cls.ok(cls.call("AdminService/GetStatus")).builds < MAX_BUILDS:
            held.append(cls.ok(cls.build(GE, GE_CFG)).build.build_id)
        err("Build", cls.build(GE, GE_CFG), {"max": MAX_BUILDS})
        for b in held:
            cls.ok(cls.call("FamilyService/ReleaseBuild", build_id=b))
        # References: a pinned build this process no longer holds.
        pinned = cls.ok(cls.build(GE, GE_CFG, materialize={})).build.build_id
        cls.ok(cls.call("FamilyService/PinBuild", build_id=pinned))
        cls.ok(cls.call("FamilyService/ReleaseBuild", build_id=pinned))
        err("ReleaseBuild", cls.call("FamilyService/ReleaseBuild", build_id=pinned),
            {"build_id": pinned, "pid": os.getpid()})
        cls.ok(cls.call("FamilyService/ReleaseBuild", build_id=pinned, force=True))
        # Validate: violations, with their own reasons and no status
        plain = cls.ok(cls.build(GE, GE_CFG)).build.build_id
        reply = cls.ok(cls.call("FamilyService/Validate", {
            "boundaries": [{"fqns": ["a", "b"], "buildId": "bld-nope"},
                           {"fqns": ["layers.0.moe"], "buildId": plain}],
            "context": {"epSize": "4"}}))
        values = [{"build_id": "bld-nope"},
                  {"fqns": repr(("layers.0.moe",)), "axis": "ep", "built": 1, "job": 4}]
        if len(reply.violations) != len(values):
            raise AssertionError("Validate: %s" % reply)
        for v, val in zip(reply.violations, values):
            cls.observations.append({"rpc": "Validate", "code": VIOLATION, "message": v.message,
                                     "reason": v.reason, "field": None, "values": val})
        cls.ok(cls.call("FamilyService/ReleaseBuild", build_id=plain))
        # The server, Health, Reload
        res = cls.d.client.raw_call("/familyd.v1.FamilyService/Nope", b"")
        err("Nope", res, {"method": "/familyd.v1.FamilyService/Nope"})
        err("Health", cls.d.client.health("nope"), {"service": "nope"})
        broken = os.path.join(cls.registry, "zz-broken.yaml")
        with open(broken, "w") as f:
            f.write("name: broken\nbaseline: x.Broken\nvariants: {}\nbogus: 1\n")
        res = cls.call("AdminService/Reload")
        os.unlink(broken)
        prefix = "registry reload failed: "
        diagnostics = res.message[len(prefix):] if res.message.startswith(prefix) else None
        if diagnostics is None or not re.search(r"zz-broken\.yaml:\d+:\d+: ", diagnostics):
            raise AssertionError("Reload: %r" % res)
        err("Reload", res, {"diagnostics": diagnostics})

    # Tests -----------------------------------------------------------------------------------

    def test_live_errors_match_the_doc(self):
        self.assertGreaterEqual(len(self.observations), 25)
        reasons = {o["reason"] for o in self.observations}
        for code in ("UNKNOWN_FAMILY", "MESH_IN_USE", "SHAPE", "SHM_BUDGET", "BUILD_LIMIT",
                     "UNKNOWN_BUILD", "AXIS_SIZE_MISMATCH", "RELOAD_FAILED"):
            self.assertIn(code, reasons)
        self.assertEqual(live_problems(read(DOC), self.observations), [])

    def test_live_check_fails_on_a_wrong_doc(self):
        doc = read(DOC)
        for broken in (doc.replace("is used by <n> builds", "is used by <n> build(s)"),
                       doc.replace("build limit reached: <max> builds", "<max> builds exist"),
                       set_row_status(doc, "DTYPE", "INVALID_ARGUMENT", "FAILED_PRECONDITION"),
                       doc.replace("| RANK_NOT_LOCAL | `materialize.ranks` |",
                                   "| RANK_NOT_LOCAL | `ranks` |"),
                       doc.replace("| UNKNOWN_METHOD | — |", "| UNKNOWN_METHOD | `method` |"),
                       doc.replace("was constructed with <axis>=<built>",
                                   "was built with <axis>=<built>")):
            self.assertNotEqual(broken, doc)
            self.assertTrue(live_problems(broken, self.observations))


if __name__ == "__main__":
    unittest.main(verbosity=2)
