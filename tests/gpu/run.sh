#!/bin/bash
# run.sh [--dry-run] [--bundle DIR] [--out DIR] [--python PYTHON] [--size-mib N]
#
# The GPU check (tests/gpu/README.md) from a bundle made by pack.sh: starts familyd from the
# bundle with its carried libraries (LD_LIBRARY_PATH for familyd and the C probe only, never
# for the Python that runs the check, whose own torch and grpcio must keep their libraries),
# and runs gpu_check.py with the machine's Python. --dry-run runs the same check against the
# tests' fake CUDA driver (one fake GPU, like the GPU machine), with Debian's Python: CI runs
# it (tests/integration/test_cuda_gpu_script.py), so the script itself is tested everywhere.
# The whole check stops after 290 s.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
dry_run=0
bundle=""
out=""
python=""
size_mib=""
while [ $# -gt 0 ]; do
        case "$1" in
        --dry-run) dry_run=1 ;;
        --bundle) bundle=$2; shift ;;
        --out) out=$2; shift ;;
        --python) python=$2; shift ;;
        --size-mib) size_mib=$2; shift ;;
        -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
        *) echo "run.sh: unknown argument $1" >&2; exit 2 ;;
        esac
        shift
done

# The bundle: given, or this script's own folder (run.sh is copied into it), or
# build-gpu-bundle/ at the repository root.
if [ -z "$bundle" ]; then
        if [ -x "$here/bin/familyd" ]; then
                bundle=$here
        else
                bundle=$here/../../build-gpu-bundle
        fi
fi
if [ ! -x "$bundle/bin/familyd" ]; then
        echo "run.sh: no bundle at $bundle (make one: bash tests/gpu/pack.sh BUILD_DIR $bundle)" >&2
        exit 2
fi
bundle=$(cd "$bundle" && pwd)
out=${out:-${OUT:-$(mktemp -d /tmp/familyd-gpu-XXXXXX)}}
mkdir -p "$out"
out=$(cd "$out" && pwd)

if [ -z "$python" ]; then
        if [ "$dry_run" = 1 ]; then
                python=/usr/bin/python3
        else
                python=${FAMILYD_GPU_PYTHON:-python3}
        fi
fi

# glibc: the machine's when it is at least the one familyd was built with, else ours,
# through our own loader (a newer glibc runs older programs; the reverse fails to load).
built_glibc=$(awk '$1 == "glibc" { print $2 }' "$bundle/MANIFEST")
host_glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{ print $2 }' || true)
libpath=$bundle/lib
launcher=""
if [ -n "$built_glibc" ] && [ -n "$host_glibc" ] &&
   [ "$(printf '%s\n%s\n' "$built_glibc" "$host_glibc" | sort -V | head -1)" != "$built_glibc" ]; then
        loader=$(ls "$bundle"/lib/glibc/ld-linux*.so.* 2>/dev/null | head -1)
        libpath=$bundle/lib:$bundle/lib/glibc
        launcher="$loader --library-path $libpath"
        echo "run.sh: this machine's glibc $host_glibc is older than $built_glibc: using the bundle's"
fi

export FAMILYD_GPU_BUNDLE=$bundle
export FAMILYD_GPU_LD_LIBRARY_PATH=$libpath
export FAMILYD_GPU_LAUNCHER=$launcher
export FAMILYD_DESCRIPTORS=$bundle/familyd.binpb
export UCX_TLS=${UCX_TLS:-tcp}
export UCX_NET_DEVICES=${UCX_NET_DEVICES:-lo}
export UCX_LOG_LEVEL=${UCX_LOG_LEVEL:-error}

args=(--bundle "$bundle" --out "$out")
if [ "$dry_run" = 1 ]; then
        args+=(--dry-run)
        export FAMILYD_CUDA_DRIVER=$bundle/lib/fake/libfake-libcuda.so
        export FAKE_CUDA_DEVICES=${FAKE_CUDA_DEVICES:-1}
fi
[ -n "$size_mib" ] && args+=(--size-mib "$size_mib")

echo "run.sh: bundle $bundle, results in $out, python $python"
status=0
timeout --kill-after=10 290 "$python" "$bundle/gpu_check.py" "${args[@]}" 2>&1 |
        tee "$out/gpu-check.log" || status=${PIPESTATUS[0]}
exit "$status"
