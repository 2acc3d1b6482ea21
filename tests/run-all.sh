#!/usr/bin/env bash
# run-all.sh: installs what the tests need, builds familyd with ASan+UBSan and warnings as
# errors, and runs every suite (unit, integration, fuzz replays), then the unit tests and one
# integration session under valgrind in a build without sanitizers, then the daemon built as the
# README's first command builds it (-O2, warnings as errors), then the libFuzzer targets
# (clang) for 20 s each. CI runs exactly this (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."

bash deploy/dev/install-deps.sh --tests

build=${FAMILYD_TEST_BUILD:-build-ci}
if [[ ! -d "$build" ]]; then
    meson setup "$build" -Db_sanitize=address,undefined -Db_lundef=false -Dwerror=true >/dev/null
fi
ninja -C "$build"

export BUF="$(pwd)/node_modules/.bin/buf"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
status=0
meson test -C "$build" --no-rebuild --print-errorlogs --num-processes 2 || status=$?

# The unit tests again under valgrind, in a build without sanitizers (they do not mix).
vgbuild=${FAMILYD_VALGRIND_BUILD:-build-valgrind}
logs=("$build/meson-logs/testlog.json")
if command -v valgrind >/dev/null; then
    [[ -d "$vgbuild" ]] || meson setup "$vgbuild" -Dbuildtype=debug -Dwerror=true >/dev/null
    ninja -C "$vgbuild"
    meson test -C "$vgbuild" --no-rebuild --print-errorlogs --setup valgrind --suite unit \
        || status=$?
    logs+=("$vgbuild/meson-logs/testlog-valgrind.json")
    # One integration session against a daemon under valgrind: the test wraps the daemon itself
    # (not Python), so it runs without --setup; it is registered in builds without sanitizers.
    meson test -C "$vgbuild" --no-rebuild --print-errorlogs --suite valgrind || status=$?
    logs+=("$vgbuild/meson-logs/testlog.json")
fi

# The daemon and clients as the README's first command builds them (the project's default
# build type, -O2, warnings as errors, no tests): the optimiser finds warnings, such as
# -Wmaybe-uninitialized, that the sanitizer build does not. One result line for the summary.
o2build=${FAMILYD_O2_BUILD:-build-o2}
o2log=$(mktemp /tmp/fd-o2-result-XXXXXX.json)
if { [[ -d "$o2build" ]] || meson setup "$o2build" -Dtests=false >/dev/null; } && ninja -C "$o2build"; then
    echo '{"name": "build-o2", "result": "OK"}' >"$o2log"
else
    echo '{"name": "build-o2", "result": "FAIL"}' >"$o2log"
    status=1
fi
logs+=("$o2log")

# The libFuzzer targets, built with clang in their own folder, each run for $FUZZ_SECONDS
# (default 20) from its corpus: executions and covered daemon functions are printed, a crash
# fails (tests/fuzz/run-fuzzers.sh).
fuzzlog=$(mktemp /tmp/fd-fuzz-results-XXXXXX.json)
bash tests/fuzz/run-fuzzers.sh --build "${FAMILYD_FUZZ_BUILD:-build-fuzz}" \
    --seconds "${FUZZ_SECONDS:-20}" --results "$fuzzlog" || status=$?
logs+=("$fuzzlog")

# One plain closing line that any reader of CI logs understands.
/usr/bin/python3 - "${logs[@]}" <<'PY'
import json, sys
passed = failed = skipped = 0
failures = []
for path in sys.argv[1:]:
    for line in open(path):
        t = json.loads(line)
        r = t["result"]
        if r in ("OK", "EXPECTEDFAIL"):
            passed += 1
        elif r == "SKIP":
            skipped += 1
        else:
            failed += 1
            failures.append((path, t))
# What failed, again at the very end (a CI page often shows only the tail): each name, its
# log, and the last lines it printed.
for path, t in failures:
    print(f"FAILED {t['name']} ({t['result']}, {path})")
    out = ((t.get("stdout") or "") + (t.get("stderr") or "")).rstrip().splitlines()
    for l in out[-25:]:
        print(f"  | {l[:300]}")
print(f"familyd: {passed} passed, {failed} failed, {skipped} skipped")
PY
rm -f "$fuzzlog" "$o2log"
exit $status
