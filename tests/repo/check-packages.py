#!/usr/bin/python3
"""Every file outside the tree that the build read comes from a package install-deps.sh brings.

usage: check-packages.py BUILD_DIR [--without PACKAGE ... --expect-missing PACKAGE]

deploy/dev/install-deps.sh installs with --no-install-recommends, so a package that the build
needs but that arrives only as a recommendation (or was installed by hand on this machine) would
be missing on a fresh one. This check lists what the build in BUILD_DIR consumed from outside
the source and build trees:

- the headers of every compiled object (ninja's dependency log, `ninja -t deps`);
- the programs and files its commands name (`ninja -t commands`: protoc, protoc-c, the protos
  handed to them, xxd, the compiler and archiver);
- the protos protoc read through its import paths (every file of the build's descriptor set,
  proto/familyd.binpb, built with --include_imports);
- the pkg-config files of every dependency meson found, with the ones they require, and the
  libraries the link commands name with -l;
- the Python modules the tests and the client package import, as the tests' Python finds them
  (run this check with it: .venv/bin/python3): a module from its virtual environment must come
  from a distribution that deploy/dev/requirements.txt pins with ==, one from the interpreter's
  own library from Debian's package when the interpreter is Debian's;
- the programs the systemd units run (ExecReload=/bin/kill), which the unit tests verify.

Each file is looked up with `dpkg -S`; the check fails naming the file and its package unless
that package is listed by `install-deps.sh --list --tests`, is one every Debian system has
(Essential or Priority required), or is a hard dependency (Depends, Pre-Depends) of one of
those, recursively, following alternatives and virtual packages. A file no package owns fails
too: it was installed by hand. --without PACKAGE drops a listed package (or a pinned Python
distribution) and --expect-missing PACKAGE turns the check around: it passes only when it fails
naming that package, which shows that it catches a gap (the tests `install-deps-gap` and
`install-deps-gap-python`).

install-deps.sh chooses a few names by Debian release (systemd-dev from Debian 13 on); the list
checked is the one it gives on this machine. A listed name that is neither installed nor known
to this release's apt fails too: it belongs to another release.
"""

import argparse
import ast
import glob
import importlib.metadata
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.normpath(os.path.join(HERE, "..", ".."))

# Files from outside Debian that the build uses only where they are installed, never needs.
OPTIONAL = {
    "/usr/local/cuda/": "NVIDIA's CUDA toolkit: test-cuda-abi checks our driver declarations "
                        "against its cuda.h and test-cuda-fill assembles the PTX where present",
}


def run(argv, cwd=None, check=True):
    p = subprocess.run(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       universal_newlines=True)
    if check and p.returncode != 0:
        sys.exit("check-packages: %s failed (%d): %s" % (" ".join(argv), p.returncode, p.stderr))
    return p.stdout


def outside(path, trees):
    path = os.path.abspath(path)
    return not any(path == t or path.startswith(t + os.sep) for t in trees)


# ---- what the build read ----

def ninja_deps(build):
    """Headers recorded in ninja's dependency log."""
    files = set()
    for line in run(["ninja", "-C", build, "-t", "deps"]).splitlines():
        if line.startswith("    ") and line.strip().startswith("/"):
            files.add(line.strip())
    return files


def ninja_commands(build):
    """Existing files that the build commands name, and the programs they run."""
    files, proto_paths = set(), []
    for cmd in run(["ninja", "-C", build, "-t", "commands"]).splitlines():
        try:
            words = shlex.split(cmd)
        except ValueError:
            words = cmd.split()
        for i, w in enumerate(words):
            for part in w.split("="):
                if part.startswith("/") and os.path.isfile(part):
                    files.add(part)
            if w.startswith("--proto_path="):
                proto_paths.append(w.split("=", 1)[1])
            elif w == "-I" and i + 1 < len(words):
                proto_paths.append(words[i + 1])
            elif w.startswith("-l") and len(w) > 2 and not w.startswith("-l:"):
                lib = run(["cc", "-print-file-name=lib%s.so" % w[2:]]).strip()
                if lib.startswith("/") and os.path.exists(lib):
                    files.add(lib)
        if words:
            exe = words[0]
            if exe == "env":
                exe = next((x for x in words[1:] if "=" not in x), "")
            prog = shutil.which(exe) if exe and not exe.startswith("/") else exe
            if prog and os.path.isfile(prog):
                files.add(prog)
    return files, proto_paths


def descriptor_protos(build, proto_paths):
    """The import-path protos in the build's descriptor set (FileDescriptorSet with imports)."""
    from google.protobuf import descriptor_pb2
    path = os.path.join(build, "proto", "familyd.binpb")
    fds = descriptor_pb2.FileDescriptorSet.FromString(open(path, "rb").read())
    files = set()
    for fd in fds.file:
        for d in proto_paths:
            p = os.path.join(d, fd.name)
            if os.path.isfile(p):
                files.add(p)
                break
    return files


def pkg_config_files(build):
    """The .pc files of meson's dependencies, with the ones they require."""
    deps = json.load(open(os.path.join(build, "meson-info", "intro-dependencies.json")))
    names = {d["name"] for d in deps}
    seen, files = set(), set()
    while names:
        n = names.pop()
        if n in seen:
            continue
        seen.add(n)
        pc = run(["pkg-config", "--path", n], check=False).strip()
        if not pc:
            continue   # not a pkg-config dependency (threads, dl, m, a compiler library)
        files.add(pc)
        req = run(["pkg-config", "--print-requires", "--print-requires-private", n], check=False)
        names.update(line.split()[0] for line in req.splitlines() if line.strip())
    return files


def unit_programs():
    """The absolute programs the systemd units run (ExecStart=, ExecReload=, ...)."""
    files = set()
    for path in glob.glob(os.path.join(SOURCE, "deploy", "systemd", "*.service*")):
        for line in open(path):
            m = re.match(r"\s*Exec\w*=\s*[-@:+!]*(\S+)", line)
            if m and m.group(1).startswith("/") and "@" not in m.group(1):
                files.add(m.group(1))
    return files


def python_modules(trees):
    """(files, distributions): the files of the top-level modules that tests/ and
    client/python import from outside the virtual environment (the interpreter's own library),
    and {distribution: module} for those that come from the environment's site-packages."""
    names = set()
    for root in ("tests", os.path.join("client", "python")):
        for path in glob.glob(os.path.join(SOURCE, root, "**", "*.py"), recursive=True):
            try:
                tree = ast.parse(open(path).read(), path)
            except SyntaxError:
                continue
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    names.update(a.name for a in node.names)
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names.add(node.module)
    site = {os.path.realpath(sysconfig.get_paths()[k]) for k in ("purelib", "platlib")}
    in_venv = sys.prefix != sys.base_prefix
    by_top = importlib.metadata.packages_distributions()
    files, dists = set(), {}
    for n in sorted(names):
        # The top-level package, or the first level below a namespace package (google.protobuf).
        parts = n.split(".")
        for depth in range(1, len(parts) + 1):
            try:
                spec = importlib.util.find_spec(".".join(parts[:depth]))
            except (ImportError, ValueError):
                spec = None
            if spec is None or spec.origin not in (None, "namespace"):
                break
        if not (spec and spec.origin and spec.origin.startswith("/")):
            continue
        origin = os.path.realpath(spec.origin)
        if in_venv and any(origin.startswith(d + os.sep) for d in site):
            for d in by_top.get(parts[0], [origin]):
                dists.setdefault(d, n)
        elif outside(spec.origin, trees):
            files.add(spec.origin)
    return files, dists


def normalise(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def pinned_requirements(path):
    """{normalised distribution name: version} of the requirements file's name==version lines."""
    pins = {}
    for line in open(path):
        line = line.split("#", 1)[0].strip()
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*(\S+)$", line)
        if m:
            pins[normalise(m.group(1))] = m.group(2)
    return pins


# ---- Debian's view ----

def owners(paths):
    """{path: [packages]} by dpkg -S, trying the resolved path and the /usr-merged twin too."""
    result = {}
    pending = {p: [p, os.path.realpath(p)] for p in paths}
    for p, cands in pending.items():
        for c in list(cands):
            if c.startswith("/usr/"):
                cands.append(c[4:])
            elif c.startswith(("/lib", "/bin", "/sbin")):
                cands.append("/usr" + c)
    asked = sorted({c for cands in pending.values() for c in cands})
    found = {}
    for i in range(0, len(asked), 500):
        out = run(["dpkg", "-S"] + asked[i:i + 500], check=False)
        for line in out.splitlines():
            if ": " not in line or line.startswith("dpkg-query:") or line.startswith("diversion "):
                continue
            pkgs, path = line.split(": ", 1)
            found.setdefault(path, [x.strip().split(":")[0] for x in pkgs.split(",")])
    for p, cands in pending.items():
        result[p] = next((found[c] for c in cands if c in found), [])
    return result


def installed_packages():
    """{name: {depends: [[alternatives]], provides: [...], base: bool}} of installed packages."""
    fmt = "${Package}\\t${db:Status-Abbrev}\\t${Essential}\\t${Priority}\\t${Depends}\\t" \
          "${Pre-Depends}\\t${Provides}\\n"
    pkgs = {}
    for line in run(["dpkg-query", "-W", "-f", fmt]).splitlines():
        name, status, essential, priority, dep, pre, prov = (line.split("\t") + [""] * 7)[:7]
        if not status.startswith("ii"):
            continue
        groups = [[re.split(r"[\s:(]", alt.strip(), maxsplit=1)[0] for alt in g.split("|")]
                  for g in (dep + "," + pre).split(",") if g.strip()]
        provides = [re.split(r"[\s:(]", x.strip(), maxsplit=1)[0] for x in prov.split(",") if x.strip()]
        pkgs[name] = {"depends": groups, "provides": provides,
                      "base": essential == "yes" or priority == "required"}
    return pkgs


def unknown_to_apt(names, pkgs):
    """Listed names neither installed nor installable here (apt-cache policy: no candidate)."""
    provided = {v for p in pkgs.values() for v in p["provides"]}
    rest = [n for n in names if n not in pkgs and n not in provided]
    if not rest:
        return []
    known, name = set(), None
    for line in run(["apt-cache", "policy"] + rest, check=False).splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            name = line[:-1].split(":")[0]
        elif name and line.strip().startswith("Candidate:") and "(none)" not in line:
            known.add(name)
    return [n for n in rest if n not in known]


def closure(roots, pkgs):
    providers = {}
    for name, p in pkgs.items():
        for v in p["provides"]:
            providers.setdefault(v, []).append(name)
    have, todo = set(), list(roots)
    while todo:
        n = todo.pop()
        for real in ([n] if n in pkgs else providers.get(n, [])):
            if real in have:
                continue
            have.add(real)
            for group in pkgs[real]["depends"]:
                # An alternative group is met by what is installed of it: on a fresh machine
                # apt takes the first installable one, which is what this machine has too.
                met = [a for a in group if a in pkgs or a in providers]
                todo.extend(met[:1] if met else [])
    return have


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("build")
    ap.add_argument("--without", action="append", default=[],
                    help="drop this package from install-deps.sh's list (to see the check fail)")
    ap.add_argument("--expect-missing", metavar="PACKAGE",
                    help="pass only if the check fails naming PACKAGE")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    trees = [SOURCE, build, os.path.realpath(SOURCE), os.path.realpath(build)]

    listed = run(["bash", os.path.join(SOURCE, "deploy", "dev", "install-deps.sh"),
                  "--list", "--tests"]).split()
    listed = [p for p in listed if p not in args.without]

    files = ninja_deps(build)
    cmd_files, proto_paths = ninja_commands(build)
    files |= cmd_files
    files |= descriptor_protos(build, proto_paths)
    files |= pkg_config_files(build)
    py_files, py_dists = python_modules(trees)
    files |= py_files
    files |= unit_programs()
    files = {f for f in files if outside(f, trees)}
    # The interpreter's own library, where the interpreter is not Debian's (a pyenv python3 on
    # PATH): Python itself, which the tests' environment is made with, not a package to name.
    if not sys.base_prefix.startswith("/usr"):
        own = {f for f in files if f.startswith(sys.base_prefix + os.sep)}
        if own:
            print("check-packages: %d file(s) of the interpreter's own library under %s (the "
                  "python3 the environment was made with)" % (len(own), sys.base_prefix))
        files -= own
    for prefix, why in OPTIONAL.items():
        n = len([f for f in files if f.startswith(prefix)])
        if n:
            print("check-packages: %d file(s) under %s not checked: %s" % (n, prefix, why))
            files = {f for f in files if not f.startswith(prefix)}

    pkgs = installed_packages()
    base = [n for n, p in pkgs.items() if p["base"]]
    allowed = closure(listed + base, pkgs)

    by_file = owners(sorted(files))
    problems = ["%s: listed by deploy/dev/install-deps.sh, but neither installed nor known to "
                "apt here (a name of another Debian release?)" % n
                for n in unknown_to_apt(listed, pkgs)]
    requirements = os.path.join(SOURCE, "deploy", "dev", "requirements.txt")
    pins = pinned_requirements(requirements)
    for d in args.without:
        pins.pop(normalise(d), None)
    for d, module in sorted(py_dists.items()):
        if normalise(d) not in pins:
            problems.append("Python module %s: from distribution %s, which %s does not pin "
                            "(add %s)" % (module, d, os.path.relpath(requirements, SOURCE), d))
    if py_dists:
        print("check-packages: Python distributions imported: %s (each pinned in %s)"
              % (" ".join(sorted(py_dists)), os.path.relpath(requirements, SOURCE)))
    for f, ps in sorted(by_file.items()):
        if not ps:
            problems.append("%s: no Debian package owns it (installed by hand?)" % f)
        elif not any(p in allowed for p in ps):
            problems.append("%s: from %s, which deploy/dev/install-deps.sh neither lists nor "
                            "pulls in (add %s)" % (f, " or ".join(ps), ps[0]))
    used = sorted({p for ps in by_file.values() for p in ps})
    print("check-packages: packages read: %s" % " ".join(used))
    print("check-packages: %d files outside the tree from %d packages; %d listed, %d allowed "
          "with dependencies and the base system" % (len(files), len(used), len(listed),
                                                      len(allowed)))
    for p in problems:
        print("  " + p)
    if args.expect_missing:
        named = [p for p in problems if "(add %s)" % args.expect_missing in p]
        print("check-packages: %d file(s) named the missing %s: %s"
              % (len(named), args.expect_missing, "caught" if named else "NOT caught"))
        return 0 if named else 1
    if problems:
        print("check-packages: %d file(s) from packages a fresh machine would not have"
              % len(problems))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
