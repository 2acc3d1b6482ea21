#!/usr/bin/env bash
# python-env.sh [--venv DIR] [--print]: makes the Python environment of the tests and examples,
# a virtual environment (default .venv/ in the repository) made with the `python3` on PATH and
# holding exactly deploy/dev/requirements.txt. Run again, it does nothing while the requirements
# are those it installed (a stamp in the venv keeps their digest); after they change it installs
# what differs. --print prints the venv's interpreter and installs nothing.
#
# Not Debian's python3-torch, python3-grpcio or python3-numpy: familyd.torch needs torch 2 (and a
# torch whose torchrun starts: Debian 13's 2.6 is built without libuv), and one pinned file
# gives every machine the same versions. `bash deploy/dev/install-deps.sh --tests` runs this.
set -euo pipefail
cd "$(dirname "$0")/../.."

venv=.venv print=false
while (( $# > 0 )); do
    case "$1" in
    --venv) venv=${2:?python-env.sh: --venv needs a folder}; shift ;;
    --print) print=true ;;
    -h|--help) sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "python-env.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
if $print; then
    echo "$(cd "$(dirname "$venv")" && pwd)/$(basename "$venv")/bin/python3"
    exit 0
fi

req=deploy/dev/requirements.txt
want=$(sha256sum "$req" | cut -d' ' -f1)
stamp=$venv/.familyd-requirements
if [[ -x $venv/bin/python3 && -f $stamp && $(cat "$stamp") == "$want" ]]; then
    exit 0
fi

python=$(command -v python3) || { echo "python-env.sh: no python3 on PATH" >&2; exit 1; }
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
    echo "python-env.sh: $python is Python $("$python" -c 'import platform; print(platform.python_version())'); torch 2.13 needs 3.10 or newer" >&2
    exit 1
fi
if [[ ! -x $venv/bin/python3 ]]; then
    echo "familyd: making the Python environment $venv with $python ($("$python" --version 2>&1))"
    "$python" -m venv "$venv"
fi
echo "familyd: installing $req into $venv"
# --no-deps: the file pins every package, what torch and transformers pull in too, so that pip
# resolves nothing on its own; `pip check` then proves the set is complete and consistent.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! "$venv/bin/python3" -m pip install --quiet --no-deps --requirement "$req" >"$log" 2>&1; then
    cat "$log" >&2
    echo "python-env.sh: pip could not install $req into $venv" >&2
    exit 1
fi
"$venv/bin/python3" -m pip check >"$log" 2>&1 || { cat "$log" >&2; exit 1; }
echo "$want" >"$stamp"
