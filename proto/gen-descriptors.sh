#!/bin/sh
# gen-descriptors.sh OUT PROTOC SRCROOT SYSTEM_PROTO_DIR PROTO...: the serialized
# FileDescriptorSet of PROTOs (familyd's, health and reflection, all under SRCROOT), with every
# import, that the daemon's reflection service serves. OUT ending in .c: as a C array (familyd_descriptors) to
# embed in the daemon; else the set itself (familyd.binpb, for Python clients and
# `buf curl --schema`). Both come from this one command, so they are the same set.
#
# --include_source_info keeps the comments of the .proto files, which are the API reference:
# reflection hands them to `grpcurl describe` and to any client that reads the descriptors.
set -eu
out=$1; protoc=$2; root=$3; sys=$4; shift 4
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$protoc" --proto_path="$root" --proto_path="$sys" --include_imports \
    --include_source_info --descriptor_set_out="$tmp/familyd_descriptors" "$@"
case $out in
    *.c) (cd "$tmp" && xxd -i familyd_descriptors) > "$out" ;;
    *) cp "$tmp/familyd_descriptors" "$out" ;;
esac
