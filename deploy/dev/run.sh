#!/usr/bin/env bash
# run.sh: installs the build dependencies, builds familyd and runs it in the foreground with the
# example registry on a socket inside the working tree. Ctrl-C stops it.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)

bash deploy/dev/install-deps.sh
if [[ ! -d build-run ]]; then
    log=$(mktemp)
    meson setup build-run -Dtests=false >"$log" 2>&1 || { cat "$log"; rm -rf build-run "$log"; exit 1; }
    rm -f "$log"
fi
ninja -C build-run --quiet   # says nothing unless a step fails, then shows its output

mkdir -p run
sock="$root/run/familyd.sock"
cat <<MSG
familyd: starting on $sock with the example registry (deploy/registry), 8 host devices.
Query it from another terminal:
  build-run/client/familyctl --socket $sock families
  build-run/client/familyctl --socket $sock resolve grouped_experts use_mxfp8=true --ep 2
  build-run/client/familyctl --socket $sock mesh create dp=2,tp=4
  build-run/client/familyctl --socket $sock status
  node_modules/.bin/buf curl --protocol grpc --unix-socket $sock --list-services http://localhost
  node_modules/.bin/buf curl --protocol grpc --unix-socket $sock -d '{"family":"grouped_experts","context":{"epSize":"4"}}' http://localhost/familyd.v1.FamilyService/Resolve
  FAMILYD_DESCRIPTORS=build-run/proto/familyd.binpb .venv/bin/python3 client/python/examples/moe_forward.py --socket $sock --ep 4
  (buf and the Python environment .venv/ come with: bash deploy/dev/install-deps.sh --tests)
MSG
exec build-run/daemon/familyd --socket "$sock" --registry "$root/deploy/registry" --host-devices 8
