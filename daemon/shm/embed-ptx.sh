#!/bin/sh
# embed-ptx.sh OUT.c IN.ptx: the fill kernel's PTX as a NUL-terminated C array, cuda_fill_ptx[]
# (cuModuleLoadData takes PTX as a C string).
set -eu
out=$1; in=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat "$in" > "$tmp/cuda_fill_ptx"
printf '\000' >> "$tmp/cuda_fill_ptx"
(cd "$tmp" && xxd -i cuda_fill_ptx) > "$out"
