#!/bin/sh
# gen-descriptors.sh OUT.c PROTOC SRCROOT GRPC_PROTO_DIR SYSTEM_PROTO_DIR PROTO...: the serialized
# FileDescriptorSet of familyd's protos plus health and reflection, with every import, as a C array
# for the reflection service.
set -eu
out=$1; protoc=$2; root=$3; grpc=$4; sys=$5; shift 5
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$protoc" --proto_path="$root" --proto_path="$grpc" --proto_path="$sys" --include_imports \
    --descriptor_set_out="$tmp/familyd_descriptors" "$@" \
    "$grpc/grpc/health/v1/health.proto" \
    "$grpc/grpc/reflection/v1/reflection.proto" \
    "$grpc/grpc/reflection/v1alpha/reflection.proto"
(cd "$tmp" && xxd -i familyd_descriptors) > "$out"
