"""The guards' fixture tests: a checker of this folder run on a tree of files made for it."""

import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def run_checker(test, checker, files):
    """Writes files ({relative path: text}) into a fresh folder (removed when test ends), runs
    HERE/checker on it and returns (exit status, stdout and stderr together)."""
    root = tempfile.mkdtemp(prefix=checker.replace(".py", "-"))
    test.addCleanup(shutil.rmtree, root, True)
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    p = subprocess.run([sys.executable, os.path.join(HERE, checker), root],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       universal_newlines=True)
    return p.returncode, p.stdout
