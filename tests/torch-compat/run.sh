#!/usr/bin/env bash
# tests/torch-compat/run.sh: the torch tests against another torch release (not run in CI, which
# tests the torch pinned in deploy/dev/requirements.txt). Makes a venv outside the repository
# with the `python3` on PATH, installs torch==VERSION from the package index (with what it
# requires: its own sympy pin, for one) and every other line of deploy/dev/requirements.txt at
# its pinned version, then sets up a build folder whose tests run with that venv's python and
# runs the torch tests one at a time. docs/toolchain.md records the releases checked this way.
# Exit status: 0 every test passed, 1 a test failed, 2 the check could not run. --help.
set -euo pipefail

usage() {
    cat <<'EOF'
usage: tests/torch-compat/run.sh [OPTIONS]

options:
  --torch VERSION   the torch release to test (default 2.9.1, familyd.torch's oldest)
  --venv DIR        the venv to make or reuse (default /var/tmp/familyd-torch-VERSION)
  --build DIR       the build folder (default build-torch-VERSION in the repository)
  --tests "A B"     the meson tests to run (default: the torch tests that run on one machine,
                    see TESTS below)
  -h, --help        this text

A release older than familyd.torch's OLDEST_TORCH fails every test at `import familyd.torch`;
lower OLDEST_TORCH (client/python/familyd/torch/__init__.py) in a scratch checkout to try one.

exit status: 0 every test passed, 1 a test failed, 2 the check could not run here.
EOF
}

# torch-docs is left out: it pip-installs the pinned torch into a fresh venv of its own, so it
# would not test VERSION. torch-train-2node and torch-killed-rank are not in the default list
# either (two daemons, a killed rank: they check the daemon, not the torch API); --tests runs
# them.
TESTS="torch-build torch-dtensor torch-handout torch-modules torch-init torch-ecosystem torch-train torch-bench-smoke"
version=2.9.1
venv=""
build=""
root=$(cd "$(dirname "$0")/../.." && pwd)
while [[ $# -gt 0 ]]; do
    case $1 in
        --torch) version=$2; shift 2 ;;
        --venv) venv=$2; shift 2 ;;
        --build) build=$2; shift 2 ;;
        --tests) TESTS=$2; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; exit 2 ;;
    esac
done
venv=${venv:-/var/tmp/familyd-torch-$version}
build=${build:-$root/build-torch-$version}
req=$root/deploy/dev/requirements.txt

python=$(command -v python3) || { echo "torch-compat: no python3 on PATH" >&2; exit 2; }
if [[ ! -x $venv/bin/python3 ]]; then
    echo "torch-compat: making $venv with $python ($("$python" --version 2>&1))"
    "$python" -m venv "$venv" || exit 2
fi
# The pinned set but torch, without resolving, then torch VERSION with its requirements: pip
# replaces a pin that this torch does not accept (torch 2.5 and 2.6 require sympy 1.13.1).
others=$(mktemp)
trap 'rm -f "$others"' EXIT
grep -v '^torch==' "$req" >"$others"
"$venv/bin/python3" -m pip install --quiet --no-deps --requirement "$others" || exit 2
"$venv/bin/python3" -m pip install --quiet "torch==$version" || exit 2
"$venv/bin/python3" -m pip check || exit 2
"$venv/bin/python3" -c 'import torch, numpy, sympy
print("torch-compat: torch %s, numpy %s, sympy %s" % (torch.__version__, numpy.__version__,
                                                     sympy.__version__))'

if [[ -d $build ]]; then
    meson configure "$build" -Dtest_python="$venv/bin/python3" || exit 2
else
    meson setup "$build" "$root" -Dbuildtype=debug -Dtest_python="$venv/bin/python3" || exit 2
fi
ninja -C "$build" || exit 2

failed=0
for t in $TESTS; do
    meson test -C "$build" "$t" --print-errorlogs || failed=1
done
exit $failed
