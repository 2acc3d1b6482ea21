#!/usr/bin/python3
"""Every C function body is at most 120 lines.

usage: check-function-length.py [--max N] DIR...

Reads every .c and .h file under each DIR. A function's length counts the lines from the one
that holds its opening brace to the one that holds its closing brace, both included: a body
`int f(void) {` ... `}` on lines 10 to 129 is 120 lines. Each function over the limit is
printed as FILE:LINE name length (LINE: where its body opens); the exit status is 1 when there
is any, 2 on a bad command line.

The scan knows enough C for this: comments, string and character literals and preprocessor
lines (with their continuations) are skipped; a brace at file level that follows a closing
parenthesis opens a function body (an initializer follows '=', a struct or enum body a name
or keyword).
"""

import os
import re
import sys

MAX_LINES = 120

IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def tokens(text):
    """(kind, value, line) for the braces, parentheses and identifiers of C text, without
    comments, literals and preprocessor lines. kind is the character itself or 'id'."""
    i, n, line = 0, len(text), 1
    at_line_start = True
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
            at_line_start = True
            continue
        if c in " \t\r\f\v":
            i += 1
            continue
        if c == "#" and at_line_start:
            # A preprocessor line, continued by a backslash at the end of a line.
            while i < n and text[i] != "\n":
                if text[i] == "\\" and i + 1 < n and text[i + 1] == "\n":
                    line += 1
                    i += 2
                    continue
                if text.startswith("/*", i):
                    end = text.find("*/", i + 2)
                    end = n if end < 0 else end + 2
                    line += text.count("\n", i, end)
                    i = end
                    continue
                i += 1
            continue
        at_line_start = False
        if text.startswith("//", i):
            while i < n and text[i] != "\n":
                i += 1
            continue
        if text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            line += text.count("\n", i, end)
            i = end
            continue
        if c in "\"'":
            i += 1
            while i < n and text[i] != c:
                if text[i] == "\\":
                    i += 1
                if i < n and text[i] == "\n":
                    line += 1
                i += 1
            i += 1
            continue
        if c in "{}()":
            yield c, c, line
            i += 1
            continue
        m = IDENT.match(text, i)
        if m:
            yield "id", m.group(0), line
            i = m.end()
            continue
        yield "other", c, line
        i += 1


def functions(text):
    """(name, first line, last line) of every function body in C text."""
    found = []
    depth = 0
    prev = []               # the tokens before the current one, at file level
    body = None             # (name, line) of the function whose body is open
    for kind, value, line in tokens(text):
        if kind == "{":
            if depth == 0 and prev and prev[-1][0] == ")":
                body = (function_name(prev), line)
            depth += 1
        elif kind == "}":
            depth -= 1
            if depth == 0:
                if body:
                    found.append((body[0], body[1], line))
                body = None
                prev = []
            continue
        if depth == 0:
            prev.append((kind, value))
            if kind == "other" and value == ";":
                prev = []
    return found


def function_name(prev):
    """The identifier before the parenthesis that opens the parameter list ending prev."""
    depth = 0
    for i in range(len(prev) - 1, -1, -1):
        kind = prev[i][0]
        if kind == ")":
            depth += 1
        elif kind == "(":
            depth -= 1
            if depth == 0:
                return prev[i - 1][1] if i > 0 and prev[i - 1][0] == "id" else "?"
    return "?"


def c_files(root):
    if os.path.isfile(root):
        yield root
        return
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            if name.endswith((".c", ".h")):
                yield os.path.join(dirpath, name)


def main(argv):
    args = argv[1:]
    limit = MAX_LINES
    if len(args) >= 2 and args[0] == "--max":
        limit = int(args[1])
        args = args[2:]
    if not args:
        sys.stderr.write(__doc__.split("\n\n")[1] + "\n")
        return 2
    over = []
    n = 0
    for root in args:
        if not os.path.exists(root):
            sys.stderr.write("check-function-length: %s: no such file or folder\n" % root)
            return 2
        for path in c_files(root):
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
            for name, first, last in functions(text):
                n += 1
                length = last - first + 1
                if length > limit:
                    over.append("%s:%d %s %d" % (path, first, name, length))
    for line in over:
        print(line)
    print("check-function-length: %d functions, %d over %d lines" % (n, len(over), limit))
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
