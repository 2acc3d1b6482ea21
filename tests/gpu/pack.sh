#!/bin/bash
# pack.sh BUILD_DIR BUNDLE_DIR: everything the GPU check needs on a machine without a package
# registry, in one folder (tests/gpu/README.md):
#
#   bin/        familyd and shard-import-probe (the C client's second process), from BUILD_DIR
#   lib/        every shared library they link, found with ldd, but glibc's own; libfamilyd
#   lib/glibc/  glibc's libraries and loader, used only where the GPU machine's glibc is older
#   lib/ucx/    UCX's shared-memory transport module (UCX looks for modules beside libucs)
#   lib/fake/   the tests' fake CUDA driver (for run.sh --dry-run only)
#   python/     the familyd Python module; python-fallback/ a pure-Python protobuf, used only
#               when the GPU machine's Python has none
#   familyd.binpb, registry/, gpu_check.py, run.sh, MANIFEST
#
# The bundle is plain files; nothing is installed anywhere.
set -euo pipefail

if [ $# -ne 2 ]; then
        echo "usage: $0 BUILD_DIR BUNDLE_DIR" >&2
        exit 2
fi
build=$(cd "$1" && pwd)
out=$2
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)

for f in daemon/familyd tests/fake-cuda/shard-import-probe proto/familyd.binpb; do
        if [ ! -e "$build/$f" ]; then
                echo "pack.sh: $build/$f is missing: build it first (ninja -C $build)" >&2
                exit 1
        fi
done

rm -rf "$out"
mkdir -p "$out"/bin "$out"/lib/glibc "$out"/lib/ucx "$out"/lib/fake "$out"/python \
        "$out"/python-fallback "$out"/registry
out=$(cd "$out" && pwd)

cp "$build/daemon/familyd" "$build/tests/fake-cuda/shard-import-probe" "$out/bin/"
cp "$build/proto/familyd.binpb" "$out/"
cp "$here/registry/"*.yaml "$out/registry/"
cp "$here/gpu_check.py" "$here/run.sh" "$out/"
cp -r "$root/client/python/familyd" "$out/python/"
rm -rf "$out/python/familyd/__pycache__"
if [ -e "$build/tests/fake-cuda/libfake-libcuda.so" ]; then
        cp "$build/tests/fake-cuda/libfake-libcuda.so" "$out/lib/fake/"
fi

# glibc's own: these must come from one glibc, the machine's or all of ours.
is_glibc() {
        case "$(basename "$1")" in
        libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*|libresolv.so.*|\
        libutil.so.*|libanl.so.*|ld-linux*.so.*|libmvec.so.*)
                return 0 ;;
        esac
        return 1
}

# Every library of every object, transitively (ldd already resolves the whole tree).
copy_deps() {
        ldd "$1" | while read -r line; do
                path=$(echo "$line" | awk '/=>/ { print $3; next } /^\// { print $1 }')
                [ -n "$path" ] && [ -e "$path" ] || continue
                if is_glibc "$path"; then
                        dest="$out/lib/glibc/$(basename "$path")"
                else
                        dest="$out/lib/$(basename "$path")"
                fi
                [ -e "$dest" ] || cp -L "$path" "$dest"
        done
}

# From the build folder: the copies' relative run paths ($ORIGIN/...) lead nowhere.
copy_deps "$build/daemon/familyd"
copy_deps "$build/tests/fake-cuda/shard-import-probe"
# UCX loads its transport modules from <dir of libucs>/ucx: shared memory (cma) only; tcp is
# built into libuct, and the check's peers talk over tcp on loopback.
ucs=$(ldd "$out/bin/familyd" | awk '/libucs\.so/ { print $3 }')
if [ -n "$ucs" ] && [ -d "$(dirname "$ucs")/ucx" ]; then
        for m in "$(dirname "$ucs")"/ucx/libuct_cma.so.0; do
                [ -e "$m" ] || continue
                cp -L "$m" "$out/lib/ucx/"
                copy_deps "$m"
        done
fi

# A pure-Python protobuf, for a GPU machine whose Python has grpcio but not protobuf.
pb=$(/usr/bin/python3 -c 'import google.protobuf, os; print(os.path.dirname(google.protobuf.__file__))' 2>/dev/null || true)
if [ -n "$pb" ] && [ -d "$pb" ]; then
        mkdir -p "$out/python-fallback/google"
        cp -r "$pb" "$out/python-fallback/google/"
        find "$out/python-fallback" \( -name '*.so' -o -name __pycache__ \) -prune -exec rm -rf {} +
fi

{
        echo "glibc $(getconf GNU_LIBC_VERSION | awk '{ print $2 }')"
        echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) from $(git -C "$root" describe --always --dirty 2>/dev/null || echo unknown)"
        echo "familyd $("$out/bin/familyd" --version 2>/dev/null | head -1 || true)"
        echo "sanitizers $(ldd "$out/bin/familyd" | grep -c -E 'libasan|libubsan' || true)"
} > "$out/MANIFEST"
du -sh "$out" | awk '{ print "pack.sh: " $2 " (" $1 ")" }'
