#!/usr/bin/python3
"""Play conformance cases (cases.json) against one real familyd.

usage: /usr/bin/python3 conformance.py [CASES.json ...]
       (default: $FAMILYD_CONFORMANCE/cases.json, i.e. tests/conformance/cases.json)

Each file names its daemon options ("daemon": {"registry": DIR relative to the file,
"host_devices": N}); one daemon serves all cases of a file. Matching follows
tests/conformance/README.md:

- expect.code: the gRPC status name; expect.message: the status message, exact;
- expect.response: the reply in proto3 JSON, compared as a subset: every key given must be
  present with that value; `{}` means the field is absent or empty; an expected false, 0, "",
  [] or {} also matches an absent field; lists compare whole, element by element; integers
  may be JSON numbers or strings;
- capture: {name: "dotted.path"} stores a reply field, and "{{name}}" in later requests and
  expectations of the same case is replaced by it.

Prints one line per case, then every mismatch; exits 1 on any mismatch. Without arguments it
also checks the fixtures' inventory: at least MIN_CASES cases with unique names, each listed in
the README beside cases.json and each README row naming a case, so no case is lost silently.
"""

import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402

PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z0-9_.-]+)\s*\}\}")
INT_STR = re.compile(r"^-?[0-9]+$")


class CaseError(Exception):
    pass


def substitute(obj, captures):
    if isinstance(obj, str):
        whole = PLACEHOLDER.fullmatch(obj)
        if whole:
            name = whole.group(1)
            if name not in captures:
                raise CaseError("{{%s}} used before it was captured" % name)
            return captures[name]

        def one(m):
            if m.group(1) not in captures:
                raise CaseError("{{%s}} used before it was captured" % m.group(1))
            return str(captures[m.group(1)])
        return PLACEHOLDER.sub(one, obj)
    if isinstance(obj, list):
        return [substitute(x, captures) for x in obj]
    if isinstance(obj, dict):
        return {substitute(k, captures): substitute(v, captures) for k, v in obj.items()}
    return obj


def as_int(x):
    """An integer from a JSON number or an integer string; None otherwise."""
    if isinstance(x, bool):
        return None
    if isinstance(x, int):
        return x
    if isinstance(x, float) and x.is_integer():
        return int(x)
    if isinstance(x, str) and INT_STR.match(x):
        return int(x)
    return None


def is_default(x):
    """Values proto3 JSON omits: false, 0, "", [], {} (integers also as strings)."""
    if x is False or x == "" or x == [] or x == {}:
        return True
    return as_int(x) == 0 and not isinstance(x, bool)


def match(expected, actual, path, errors):
    """Subset match of expected against actual; appends 'path: why' strings to errors."""
    where = path or "<reply>"
    if isinstance(expected, dict):
        if not expected:
            if actual not in (None, {}):
                errors.append("%s: expected absent or empty, got %s" % (where, json.dumps(actual)))
            return
        if actual is None:
            actual = {}
        if not isinstance(actual, dict):
            errors.append("%s: expected an object, got %s" % (where, json.dumps(actual)))
            return
        for k, v in expected.items():
            sub = "%s.%s" % (path, k) if path else k
            if k not in actual:
                if not is_default(v):
                    errors.append("%s: missing (expected %s)" % (sub, json.dumps(v)))
                continue
            match(v, actual[k], sub, errors)
        return
    if isinstance(expected, list):
        if actual is None:
            actual = []
        if not isinstance(actual, list):
            errors.append("%s: expected a list, got %s" % (where, json.dumps(actual)))
            return
        if len(actual) != len(expected):
            errors.append("%s: expected %d elements %s, got %d %s"
                          % (where, len(expected), json.dumps(expected), len(actual),
                             json.dumps(actual)))
            return
        for i, (e, a) in enumerate(zip(expected, actual)):
            match(e, a, "%s[%d]" % (path, i), errors)
        return
    if actual is None:
        if not is_default(expected):
            errors.append("%s: missing (expected %s)" % (where, json.dumps(expected)))
        return
    if isinstance(expected, bool) or isinstance(actual, bool):
        if expected is not actual:
            errors.append("%s: expected %s, got %s" % (where, json.dumps(expected), json.dumps(actual)))
        return
    ei, ai = as_int(expected), as_int(actual)
    if ei is not None and ai is not None:
        if ei != ai:
            errors.append("%s: expected %s, got %s" % (where, json.dumps(expected), json.dumps(actual)))
        return
    if isinstance(expected, (int, float)) and isinstance(actual, (int, float, str)):
        try:
            ok = float(actual) == float(expected)
        except ValueError:
            ok = False
        if not ok:
            errors.append("%s: expected %s, got %s" % (where, json.dumps(expected), json.dumps(actual)))
        return
    if expected != actual:
        errors.append("%s: expected %s, got %s" % (where, json.dumps(expected), json.dumps(actual)))


def lookup(obj, dotted):
    cur = obj
    for part in dotted.split("."):
        m = re.fullmatch(r"(.*)\[(\d+)\]", part)
        idx = None
        if m:
            part, idx = m.group(1), int(m.group(2))
        if not isinstance(cur, dict) or part not in cur:
            raise CaseError("capture: no field %r in the reply" % dotted)
        cur = cur[part]
        if idx is not None:
            if not isinstance(cur, list) or idx >= len(cur):
                raise CaseError("capture: no element %r in the reply" % dotted)
            cur = cur[idx]
    return cur


def run_step(client, protos, step, captures):
    """Returns a list of mismatch strings for one step (empty when it matches)."""
    rpc = step["rpc"]
    request = substitute(step.get("request", {}), captures)
    expect = substitute(step.get("expect", {}), captures)
    try:
        path, req_cls, resp_cls, streaming = protos.method(rpc)
    except KeyError:
        return ["unknown rpc %r in the descriptor set" % rpc]
    try:
        req = protos.from_json(req_cls.DESCRIPTOR.full_name, request)
    except Exception as e:  # json_format.ParseError and friends
        return ["request does not parse as %s: %s" % (req_cls.DESCRIPTOR.full_name, e)]
    if streaming:
        res = client.stream_first(rpc, req)
    else:
        res = client.call(rpc, req)
    errors = []
    want_code = expect.get("code", "OK")
    if res.code != want_code:
        errors.append("code: expected %s, got %s (%r)" % (want_code, res.code, res.message))
        return errors
    if "message" in expect and res.message != expect["message"]:
        errors.append("message: expected %r, got %r" % (expect["message"], res.message))
    reply_json = H.to_json(res.reply) if res.reply is not None else None
    if "response" in expect:
        if reply_json is None:
            errors.append("response: expected a reply, got none")
        else:
            match(expect["response"], reply_json, "", errors)
    for name, field in (step.get("capture") or {}).items():
        if reply_json is None:
            errors.append("capture %s: no reply" % name)
            continue
        try:
            captures[name] = lookup(reply_json, field)
        except CaseError as e:
            errors.append(str(e))
    return errors


def run_file(cases_path, protos):
    with open(cases_path) as f:
        doc = json.load(f)
    cases = doc.get("cases") or []
    if not cases:
        print("%s: no cases" % cases_path)
        return ["%s: no cases" % cases_path], 0
    opts = doc.get("daemon") or {}
    base = os.path.dirname(os.path.abspath(cases_path))
    registry = os.path.join(base, opts.get("registry", "registry"))
    host_devices = int(opts.get("host_devices", 8))
    extra = [str(a) for a in opts.get("args", [])]

    failures = []
    print("# %s: %d cases, registry %s, --host-devices %d"
          % (cases_path, len(cases), registry, host_devices))
    with H.Daemon(registry=registry, host_devices=host_devices, protos=protos,
                  extra_args=extra) as d:
        for i, case in enumerate(cases):
            name = case.get("name", "case %d" % i)
            captures = {}
            case_errors = []
            t0 = time.monotonic()
            for j, step in enumerate(case.get("steps", [])):
                try:
                    errs = run_step(d.client, protos, step, captures)
                except CaseError as e:
                    errs = [str(e)]
                for e in errs:
                    case_errors.append("step %d (%s): %s" % (j + 1, step.get("rpc"), e))
                if errs:
                    break   # later steps usually depend on this one
            ms = (time.monotonic() - t0) * 1000
            status = "ok  " if not case_errors else "FAIL"
            print("%s %3d %-62s %6.1f ms" % (status, i + 1, name, ms))
            for e in case_errors:
                print("       %s" % e)
                failures.append("%s: %s: %s" % (os.path.basename(cases_path), name, e))
            if not d.alive():
                failures.append("familyd died during case %r" % name)
                break
    return failures, len(cases)


# The cases the suite has always played; the count may grow, never shrink.
MIN_CASES = 35


def inventory_errors(cases_path, readme_path):
    """Mismatches between cases.json and the table of cases in its README."""
    with open(cases_path) as f:
        names = [c.get("name") for c in json.load(f).get("cases") or []]
    with open(readme_path) as f:
        text = f.read()
    section = text.split("## The cases", 1)[-1]
    rows = [m.group(1).strip() for m in re.finditer(r"^\|([^|]+)\|[^|]*\|\s*$", section, re.M)]
    rows = [r for r in rows if r != "case" and not set(r) <= set("-: ")]
    errors = []
    if len(names) < MIN_CASES:
        errors.append("%s has %d cases, fewer than the %d it must keep"
                      % (cases_path, len(names), MIN_CASES))
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        errors.append("case names used twice: %s" % ", ".join(dup))
    for n in names:
        if n not in rows:
            errors.append("case %r has no row in %s" % (n, readme_path))
    for r in rows:
        if r not in names:
            errors.append("%s lists %r, which is not a case" % (readme_path, r))
    return errors


def main(argv):
    paths = argv[1:] or [os.path.join(H.CONFORMANCE, "cases.json")]
    protos = H.Protos()
    failures = []
    total = 0
    if not argv[1:]:
        failures += inventory_errors(paths[0], os.path.join(H.CONFORMANCE, "README.md"))
        for f in failures:
            print("inventory: " + f)
    for p in paths:
        try:
            f, n = run_file(p, protos)
        except H.DaemonError as e:
            f, n = ["%s: %s" % (p, e)], 0
        failures += f
        total += n
    print()
    if failures:
        print("%d mismatch(es) in %d case(s):" % (len(failures), total))
        for f in failures:
            print("  " + f)
        return 1
    print("all %d cases passed" % total)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
