#!/usr/bin/python3
"""mypy on the Python package, with its configuration (client/python/pyproject.toml).

usage: check-mypy.py SOURCE_ROOT

Passes when mypy finds no error in client/python/familyd; then checks that the configuration is
real: mypy-fixtures/good_calls.py (calls as the README shows them) passes, and
mypy-fixtures/wrong_calls.py fails with an error on exactly the lines marked "# error".
"""

import os
import re
import sys
import tempfile

from mypy import api

HERE = os.path.dirname(os.path.abspath(__file__))


def mypy(package_dir, cache, *targets):
    """mypy's (report, exit status) for targets, run from package_dir with its config."""
    cwd = os.getcwd()
    os.chdir(package_dir)
    try:
        out, err, status = api.run(["--config-file", "pyproject.toml", "--cache-dir", cache,
                                    "--no-error-summary", "--show-error-codes"] + list(targets))
    finally:
        os.chdir(cwd)
    return out + err, status


def error_lines(report, path):
    base = os.path.basename(path)
    return {int(m.group(1)) for m in re.finditer(r"^(?:.*/)?%s:(\d+): error:" % re.escape(base),
                                                 report, re.M)}


def main():
    root = os.path.abspath(sys.argv[1])
    package_dir = os.path.join(root, "client", "python")
    failures = []
    with tempfile.TemporaryDirectory() as cache:
        report, status = mypy(package_dir, cache)
        if status != 0:
            failures.append("mypy found errors in client/python/familyd (exit %d):\n%s"
                            % (status, report))
        good = os.path.join(HERE, "mypy-fixtures", "good_calls.py")
        report, status = mypy(package_dir, cache, good)
        if status != 0:
            failures.append("good_calls.py should pass (exit %d):\n%s" % (status, report))
        wrong = os.path.join(HERE, "mypy-fixtures", "wrong_calls.py")
        want = {i for i, line in enumerate(open(wrong), 1) if "# error" in line}
        report, status = mypy(package_dir, cache, wrong)
        got = error_lines(report, wrong)
        if status == 0 or got != want:
            failures.append("wrong_calls.py: mypy should report errors on lines %s, reported %s "
                            "(exit %d):\n%s" % (sorted(want), sorted(got), status, report))
        else:
            print("wrong_calls.py: errors on lines %s, as marked:\n%s" % (sorted(got), report))
    if failures:
        print("\n".join(failures))
        return 1
    print("mypy: client/python/familyd clean; the fixtures pass and fail as marked")
    return 0


if __name__ == "__main__":
    sys.exit(main())
