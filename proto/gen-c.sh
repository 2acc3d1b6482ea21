#!/bin/sh
# gen-c.sh OUTDIR SRCROOT PROTO...: runs protoc-c over PROTOs (absolute paths under SRCROOT) and
# writes flat outputs into OUTDIR, because meson's custom_target outputs cannot name subfolders.
#
# Debian's protoc-c 1.4.1 cannot read proto3 `optional`. It is wire- and JSON-compatible with a
# one-field oneof, so the C code is generated from a copy where `optional T x = N;` reads
# `oneof _x { T x = N; }` (presence is then x's oneof case). Reflection and Python see the real
# files. Generated includes "a/b/c.pb-c.h" are rewritten to the flat "a-b-c.pb-c.h".
set -eu
out=$1; root=$2; shift 2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/src" "$tmp/out"
rels=
for p in "$@"; do
    rel=${p#"$root"/}
    mkdir -p "$tmp/src/$(dirname "$rel")"
    sed -E 's/^([[:space:]]*)optional[[:space:]]+([A-Za-z0-9_.]+)[[:space:]]+([A-Za-z0-9_]+)[[:space:]]*=[[:space:]]*([0-9]+)[[:space:]]*;/\1oneof _\3 { \2 \3 = \4; }/' \
        "$p" > "$tmp/src/$rel"
    rels="$rels $tmp/src/$rel"
done
# shellcheck disable=SC2086
"${PROTOC_C:-protoc-c}" --proto_path="$tmp/src" --proto_path="${SYSTEM_PROTO_DIR:-/usr/include}" \
    --c_out="$tmp/out" $rels
(cd "$tmp/out" && find . -type f -name '*.pb-c.[ch]') | while read -r f; do
    f=${f#./}
    flat=$(printf '%s' "$f" | tr '/' '-')
    sed -E '/^#include "[^"]*\.pb-c\.h"/{s#/#-#g}' \
        "$tmp/out/$f" > "$out/$flat"
done
