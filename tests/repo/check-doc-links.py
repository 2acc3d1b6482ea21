#!/usr/bin/python3
"""Every relative link of the repository's Markdown files leads somewhere.

usage: check-doc-links.py ROOT

Reads every .md file that `git ls-files` lists under ROOT (or, with no git metadata, every .md
file outside build folders, .venv and node_modules). A link is `[text](target)` or a reference
definition `[name]: target`, outside fenced code blocks and inline code. A target with a scheme
(https:, mailto:, file:, ...) is left alone; any other names a file or folder relative to the
file that holds the link, which must exist, and its `#anchor`, if any, must be a heading of
that Markdown file (or of the same file, for `#anchor` alone), spelled as GitHub spells
heading anchors (lower case, punctuation dropped, spaces as hyphens, -1, -2, ... for repeats),
or an explicit `<a id="...">` / `<a name="...">`. Moving a document, renaming a section or
splitting a page must take its links along. Prints every broken link as FILE:LINE: target
(why) and exits 1 when there is one.
"""

import os
import re
import subprocess
import sys

LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s+<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
EXPLICIT = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")


def markdown_files(root):
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "-z", "--", "*.md"], check=True,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout
        files = [f for f in out.decode().split("\0") if f]
        if files or os.path.exists(os.path.join(root, ".git")):
            return files
    except (OSError, subprocess.CalledProcessError):
        pass
    files = []
    for folder, dirs, names in os.walk(root):
        rel = os.path.relpath(folder, root)
        dirs[:] = [d for d in dirs if not (rel == "." and (
            d.startswith("build") or d in (".git", ".venv", "node_modules")))]
        files += [os.path.normpath(os.path.join(rel, n)) for n in names if n.endswith(".md")]
    return files


def prose_lines(text):
    """(line number, line with its inline code blanked out, line) outside fenced code
    blocks."""
    fence = None
    for n, line in enumerate(text.splitlines(), 1):
        m = re.match(r"^\s{0,3}(`{3,}|~{3,})", line)
        if m:
            if fence is None:
                fence = m.group(1)[0] * len(m.group(1))
            elif m.group(1).startswith(fence):
                fence = None
            continue
        if fence is None:
            yield n, re.sub(r"`+[^`]*`+", "``", line), line


def slug(heading):
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"`", "", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)    # a link's text only
    text = re.sub(r"<[^>]+>", "", text)                       # inline HTML
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(path):
    found, seen = set(), {}
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    for _, _, line in prose_lines(text):
        m = HEADING.match(line)
        if m:
            base = slug(m.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else "%s-%d" % (base, count))
    # Explicit anchors count wherever they are, as GitHub renders them.
    found.update(EXPLICIT.findall(text))
    return found


def problems_of(root, rel, cache):
    path = os.path.join(root, rel)
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    problems = []
    for n, line, _ in prose_lines(text):
        targets = LINK.findall(line)
        m = REFERENCE.match(line)
        if m:
            targets.append(m.group(1))
        for target in targets:
            if SCHEME.match(target):
                continue
            file_part, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) \
                if file_part else path
            if not os.path.exists(dest):
                problems.append("%s:%d: %s (no such file or folder)" % (rel, n, target))
                continue
            if not anchor or not dest.endswith(".md") or os.path.isdir(dest):
                continue
            if dest not in cache:
                cache[dest] = anchors(dest)
            if anchor not in cache[dest]:
                problems.append("%s:%d: %s (no heading or anchor '%s' in %s)"
                                % (rel, n, target, anchor, os.path.relpath(dest, root)))
    return problems


def main(argv):
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    root = os.path.abspath(argv[1])
    files = markdown_files(root)
    cache, problems = {}, []
    for rel in sorted(files):
        if os.path.isfile(os.path.join(root, rel)):
            problems += problems_of(root, rel, cache)
    print("check-doc-links: %d Markdown files checked, %d broken links"
          % (len(files), len(problems)))
    for p in problems:
        print("  " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
