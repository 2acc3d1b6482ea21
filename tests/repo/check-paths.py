#!/usr/bin/python3
"""No tracked file reaches outside the repository.

usage: check-paths.py [SOURCE_DIR]

A clone is everything a user gets, so no file may name a folder beside the checkout, a design
file that is not in the repository, a home directory, the absolute folder of a checkout (the
one this runs in, or the one the project was developed in), or an issue of the project's
tracker by its number (users do not have the tracker: a file says what it means instead). The patterns are built from
pieces so that this file does not match itself. Files are those `git ls-files` lists, or, with
no git metadata (an exported tarball, or no git installed), every file outside build folders,
.venv and node_modules.
Prints every match as FILE:LINE: text and exits 1 when there is one.
"""

import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def patterns(source):
    dot2 = "." + "."
    pats = [
        (re.escape(dot2 + "/" + "shared"), "a folder beside the checkout"),
        (r"\b" + "FAMILYD" + "_SHARED" + r"\b", "a variable naming a folder beside the checkout"),
        (r"\bdesign/" + r"(api|semantics|architecture)\.md", "a design file not in the repository"),
        ("/" + "root" + "/", "root's home directory"),
        ("/" + "home" + "/", "a home directory"),
        (r"(?<![\w.-])/" + "work" + r"/", "the folder of one development machine"),
        (r"\b[Ii]ssue" + r"s? #?[0-9]+\b", "a tracker's issue number, which users do not have: "
         "say what it means"),
    ]
    for folder in {source, os.path.realpath(source)}:
        if folder not in ("", "/"):
            pats.append((re.escape(folder) + r"(?![\w.-])", "this checkout's absolute folder"))
    return [(re.compile(p), why) for p, why in pats]


def tracked_files(source):
    try:
        out = subprocess.run(["git", "-C", source, "ls-files", "-z"], check=True,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout
        return [f for f in out.decode().split("\0") if f]
    except (OSError, subprocess.CalledProcessError):
        files = []
        for root, dirs, names in os.walk(source):
            rel = os.path.relpath(root, source)
            # Not the project's: build folders, git's, npm's and the Python environment.
            dirs[:] = [d for d in dirs if not (rel == "." and (
                d.startswith("build") or d in (".git", ".venv", "node_modules")))]
            files += [os.path.normpath(os.path.join(rel, n)) for n in names]
        return files


def main(argv):
    source = os.path.abspath(argv[1] if len(argv) > 1 else os.path.join(HERE, "..", ".."))
    pats = patterns(source)
    files = tracked_files(source)
    hits = []
    for rel in files:
        path = os.path.join(source, rel)
        try:
            data = open(path, "rb").read()
        except OSError:
            continue
        if b"\0" in data[:8192]:
            continue   # binary
        for n, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
            for rx, why in pats:
                if rx.search(line):
                    hits.append("%s:%d: %s (%s)" % (rel, n, line.strip()[:160], why))
    print("check-paths: %d files checked, %d lines reach outside the repository"
          % (len(files), len(hits)))
    for h in hits:
        print("  " + h)
    return 1 if hits else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
