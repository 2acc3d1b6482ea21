#!/usr/bin/env bash
# run-sim.sh: the membership simulator's tables at 10 to 10,000 members, from an optimised build
# of familyd-sim alone (build-sim/, no sanitizers: they cost 3x and hide the heap's size).
#   bash tests/sim/run-sim.sh [--sizes 10,100,1000] [familyd-sim options...]
#   bash tests/sim/run-sim.sh --large [familyd-sim options...]
# Options go to familyd-sim (familyd-sim --help); the defaults are the daemon's timeouts, 10
# simulated minutes under each loss rate, 8 GPUs per node. The tables go to stdout.
# --large: 1,000 and 10,000 members with short windows (--sizes 1000,10000 --devices 1
# --rest-s 5 --partition-s 12 --loss-s 10), not in CI. With --membership swim 17 GB and about
# two hours at 10,000 (1 h 28 min with 2 s windows); all-to-all takes half an hour
# at 1,000 and does not fit at 10,000: a size
# whose estimated memory passes what this machine has free prints "not run" and why
# (docs/scale.md).
set -euo pipefail
cd "$(dirname "$0")/../.."

build=${FAMILYD_SIM_BUILD:-build-sim}
if [[ ! -d "$build" ]]; then
    meson setup "$build" -Dbuildtype=release -Dwerror=true >/dev/null
fi
ninja -C "$build" tests/sim/familyd-sim >/dev/null
if [[ "${1:-}" == --large ]]; then
    shift
    set -- --sizes 1000,10000 --devices 1 --rest-s 5 --partition-s 12 --loss-s 10 "$@"
fi
exec "$build/tests/sim/familyd-sim" "$@"
