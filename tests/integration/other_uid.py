"""What a test needs to run something as another uid: world-readable copies and an interpreter.

A process of another uid (setpriv --reuid) cannot open files in a clone that sits under a
folder it cannot traverse (root's home is 0700 on Debian), so it runs from copies:

    copy = ReadableCopy({"test_ownership.py": __file__, "familyd.binpb": path, ...})
    argv = ["setpriv", ...] + [other_uid_python(), copy.path("test_ownership.py")]
    ...
    copy.cleanup()

ReadableCopy puts each file or folder into a fresh mkdtemp folder (0755; folders 0755, files
0644, 0755 when the source is executable by anyone of its owner, group or others), removed by
cleanup(). other_uid_python() is Debian's /usr/bin/python3 (with Debian's grpcio, protobuf and
numpy), once checked that other uids can run it and that it imports them; else it fails saying
what stops it, rather than let the test skip.
"""

import json
import os
import shutil
import stat
import subprocess
import tempfile


class OtherUidError(RuntimeError):
    """A file that a process of another uid must use is out of its reach."""


def _parents(path):
    """Every folder above path, from / down."""
    out = []
    d = os.path.dirname(path)
    while True:
        out.append(d)
        up = os.path.dirname(d)
        if up == d:
            break
        d = up
    return out[::-1]


def unreachable_part(path, execute=False):
    """The first path on the way to `path` that a process of another uid, in none of the
    owner's groups, cannot pass: a folder without o+x, or `path` itself without o+r (and o+x
    when execute). Symbolic links are followed, both where they are and where they point.
    None when nothing stops it."""
    path = os.path.abspath(path)
    seen = set()
    for p in (path, os.path.realpath(path)):
        for d in _parents(p):
            if d in seen:
                continue
            seen.add(d)
            try:
                st = os.stat(d)
            except OSError:
                return d
            if stat.S_ISDIR(st.st_mode) and not st.st_mode & stat.S_IXOTH:
                return d
    try:
        st = os.stat(path)
    except OSError:
        return path
    need = stat.S_IROTH | (stat.S_IXOTH if execute else 0)
    if stat.S_ISDIR(st.st_mode):
        need = stat.S_IROTH | stat.S_IXOTH
    if st.st_mode & need != need:
        return os.path.realpath(path)
    return None


def _require(path, what, execute=False):
    bad = unreachable_part(path, execute)
    if bad:
        raise OtherUidError(
            "%s %s is out of reach of other uids: %s is mode %s (a process run as another "
            "uid needs o+x on every folder on the way, o+r on the file); run the tests with "
            "an interpreter and from a place other uids can read" %
            (what, path, bad, oct(os.stat(bad).st_mode & 0o7777) if os.path.exists(bad)
             else "missing"))


# The interpreter of processes run as another uid: Debian's, with Debian's python3-grpcio,
# python3-protobuf and python3-numpy (deploy/dev/install-deps.sh --tests). Not the tests' own
# virtual environment: it is made with the python3 on PATH, which may live in root's 0700 home
# (a pyenv build), out of every other uid's reach, wherever the venv itself is.
OTHER_UID_PYTHON = "/usr/bin/python3"
OTHER_UID_MODULES = ("grpc", "google.protobuf", "numpy")


def other_uid_python():
    """Debian's /usr/bin/python3, after checking that another uid can run it and that it
    imports what the clients need; raises OtherUidError naming what stops it."""
    exe = OTHER_UID_PYTHON
    _require(exe, "The Python interpreter", execute=True)
    code = "import %s" % ", ".join(OTHER_UID_MODULES)
    p = subprocess.run([exe, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    if p.returncode != 0:
        raise OtherUidError("%s cannot import %s (install python3-grpcio python3-protobuf "
                            "python3-numpy: bash deploy/dev/install-deps.sh --tests):\n%s"
                            % (exe, ", ".join(OTHER_UID_MODULES), p.stdout[-2000:]))
    return exe


def _ignore(folder, names):
    return [n for n in names if n == "__pycache__" or n.endswith(".pyc")]


def _make_readable(path):
    for top, dirs, files in os.walk(path):
        os.chmod(top, 0o755)
        for n in files:
            p = os.path.join(top, n)
            if os.path.islink(p):
                continue
            executable = os.stat(p).st_mode & (stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
            os.chmod(p, 0o755 if executable else 0o644)


class ReadableCopy:
    """Copies of files and folders that every uid can read, in a fresh folder of their own.

    entries: {name in the copy: source path} (a name may hold a "/": "client/python/familyd"),
    or an iterable of source paths, each copied under its base name."""

    def __init__(self, entries, prefix="fd-uid-"):
        if not isinstance(entries, dict):
            entries = {os.path.basename(os.path.normpath(p)): p for p in entries}
        self.root = tempfile.mkdtemp(prefix=prefix)
        try:
            os.chmod(self.root, 0o755)
            _require(self.root, "The folder of copies for other uids")
            for name, src in entries.items():
                dst = self.path(name)
                os.makedirs(os.path.dirname(dst), mode=0o755, exist_ok=True)
                if os.path.isdir(src):
                    shutil.copytree(src, dst, ignore=_ignore)
                else:
                    shutil.copyfile(src, dst)
                    shutil.copymode(src, dst)
            _make_readable(self.root)
        except BaseException:
            self.cleanup()
            raise

    def path(self, name):
        return os.path.join(self.root, name)

    def cleanup(self):
        if self.root:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.cleanup()


HERE = os.path.dirname(os.path.abspath(__file__))


def harness_copy(*extra, package=False, familyctl=None, prefix="fd-uid-"):
    """A ReadableCopy of what this folder's client scripts import: familyd_harness.py,
    shard_client.py and this module, the descriptor set (as familyd.binpb), with package the
    Python package (as client/python/familyd, where familyd_harness.SOURCE_ROOT finds it under
    harness_env()), with familyctl that binary and its library where its RUNPATH looks
    ($ORIGIN/libfamilyd/libfamilyd.so.0, as in the build folder), and each of extra (paths,
    copied under their base names)."""
    import familyd_harness as H

    entries = {n: os.path.join(HERE, n)
               for n in ("familyd_harness.py", "shard_client.py", "other_uid.py")}
    entries["familyd.binpb"] = H.descriptor_set_path()
    if package:
        entries["client/python/familyd"] = os.path.join(H.SOURCE_ROOT, "client", "python",
                                                        "familyd")
    if familyctl:
        entries["familyctl"] = familyctl
        entries["libfamilyd/libfamilyd.so.0"] = os.path.join(os.path.dirname(familyctl),
                                                             "libfamilyd", "libfamilyd.so.0")
    for p in extra:
        entries[os.path.basename(p)] = p
    return ReadableCopy(entries, prefix=prefix)


def harness_env(copy, **more):
    """The environment for a client script run from a harness_copy(): its descriptor set and
    source root are the copy's."""
    return dict(os.environ, FAMILYD_DESCRIPTORS=copy.path("familyd.binpb"),
                FAMILYD_SOURCE_ROOT=copy.root, PYTHONDONTWRITEBYTECODE="1", **more)


class LineClient:
    """A client process that answers each JSON line it reads with one JSON line: the tests'
    harness scripts run as `--client` (as another uid through setpriv, or as root). argv starts
    the process; copy is the ReadableCopy it runs from (its cwd and environment)."""

    def __init__(self, argv, copy):
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=harness_env(copy), cwd=copy.root)

    def ask(self, rpc, request=None):
        return self.send({"rpc": rpc, "request": request or {}})

    def send(self, cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError("client %d died" % self.proc.pid)
        return json.loads(line)

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write('{"op": "exit"}\n')
                self.proc.stdin.flush()
            except BrokenPipeError:
                pass
            self.proc.wait(10)
        self.proc.stdin.close()
        self.proc.stdout.close()
