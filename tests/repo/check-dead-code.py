#!/usr/bin/python3
"""No C function is defined and used nowhere.

usage: check-dead-code.py ROOT [DIR...]

Reads every .c and .h file under ROOT's common/, daemon/, client/ and tests/ (or the DIRs
given, relative to ROOT). A function with a body (check-function-length.py's scan) is used
when its name appears anywhere else in those files: called, taken as a pointer, named in a
macro or a table. Prototypes and forward declarations (a statement `TYPE name(...);`) do not
count, nor does the definition itself. Entry points are exempt: main, the libFuzzer entry, and
the C library's exported symbols (client/libfamilyd/libfamilyd.sym). Each unused function is printed as
FILE:LINE name; the exit status is 1 when there is any.
"""

import importlib.util
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("fnlen", os.path.join(HERE,
                                                                     "check-function-length.py"))
fnlen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fnlen)

DIRS = ("common", "daemon", "client", "tests")
ENTRY_POINTS = {"main", "LLVMFuzzerTestOneInput", "LLVMFuzzerInitialize"}
# The tests' fake CUDA driver: the daemon finds its functions by name (dlsym).
DRIVER_FILE = os.path.join("tests", "fake-cuda", "fake-libcuda.c")
DRIVER_NAME = re.compile(r"^cu[A-Z]")
# Comments and literals, removed before names are counted (the literal's quotes kept apart).
NOISE = re.compile(r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)
# A prototype or forward declaration: from a statement's start to its ';', no body, the name
# the first identifier followed by '('.
PROTOTYPE = re.compile(r'(?m)(?:^|(?<=[;}]))[^;{}()#]*?\b([A-Za-z_]\w*)\s*\([^;{}]*\)'
                       r'(?:\s*__attribute__\s*\(\([^;{}]*\)\))?\s*;')
IDENT = re.compile(r"[A-Za-z_]\w*")


def _blank(m):
    """A prototype blanked out; a macro's invocation (an all-capitals name:
    DEFINE_TRIVIAL_CLEANUP_FUNC(T, f);) is a use of what it names, kept."""
    return m.group(0) if m.group(1).isupper() else " "


def without_prototypes(text):
    """text with the prototypes at file level (outside every brace) blanked out; a call
    inside a body looks like one, so bodies are left as they are."""
    out, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c == "{":
            if depth == 0:
                out.append(PROTOTYPE.sub(_blank, text[start:i]))
                start = i
            depth += 1
        elif c == "}" and depth > 0:
            depth -= 1
            if depth == 0:
                out.append(text[start:i + 1])
                start = i + 1
    out.append(PROTOTYPE.sub(_blank, text[start:]) if depth == 0 else text[start:])
    return "".join(out)


def exported(root):
    path = os.path.join(root, "client", "libfamilyd", "libfamilyd.sym")
    if not os.path.exists(path):
        return set()
    with open(path) as f:
        return set(re.findall(r"\b(familyd_\w+)\s*;", f.read()))


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    root = os.path.abspath(argv[1])
    dirs = argv[2:] or DIRS
    files = []
    for d in dirs:
        top = os.path.join(root, d)
        if os.path.exists(top):
            files += list(fnlen.c_files(top))
    defined = []        # (file, line, name)
    uses = {}
    for path in files:
        with open(path, errors="replace") as f:
            text = f.read()
        for name, first, _ in fnlen.functions(text):
            defined.append((os.path.relpath(path, root), first, name))
        clean = without_prototypes(NOISE.sub(" ", text))
        for m in IDENT.finditer(clean):
            uses[m.group(0)] = uses.get(m.group(0), 0) + 1
    definitions = {}
    for _, _, name in defined:
        definitions[name] = definitions.get(name, 0) + 1
    exempt = ENTRY_POINTS | exported(root)
    dead = sorted((rel, line, name) for rel, line, name in defined
                  if name not in exempt and name != "?"
                  and not (rel == DRIVER_FILE and DRIVER_NAME.match(name))
                  and uses.get(name, 0) <= definitions[name])
    print("check-dead-code: %d files, %d functions, %d used nowhere"
          % (len(files), len(defined), len(dead)))
    for rel, line, name in dead:
        print("  %s:%d %s" % (rel, line, name))
    return 1 if dead else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
