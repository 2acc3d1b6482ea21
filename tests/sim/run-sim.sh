#!/usr/bin/env bash
# run-sim.sh: the membership simulator's tables at 10 to 10,000 members, from an optimised build
# of familyd-sim alone (build-sim/, no sanitizers: they cost 3x and hide the heap's size).
#   bash tests/sim/run-sim.sh [--sizes 10,100,1000] [familyd-sim options...]
# Options go to familyd-sim (familyd-sim --help); the defaults are the daemon's timeouts, 10
# simulated minutes under each loss rate, 8 GPUs per node. The tables go to stdout.
set -euo pipefail
cd "$(dirname "$0")/../.."

build=${FAMILYD_SIM_BUILD:-build-sim}
if [[ ! -d "$build" ]]; then
    meson setup "$build" -Dbuildtype=release -Dwerror=true >/dev/null
fi
ninja -C "$build" tests/sim/familyd-sim >/dev/null
exec "$build/tests/sim/familyd-sim" "$@"
