#!/usr/bin/env bash
# install-deps.sh [--tests] [--list]: installs what familyd needs to build and run on Debian 12
# or 13 (as root), and with --tests what the test suite needs too (cmocka, valgrind, buf from
# npm, the Python environment .venv/ of deploy/dev/python-env.sh). --list prints the Debian
# packages, one a line, and installs nothing.
#
# Every package whose files the build or the tests read is named here, or is a dependency of one
# named here: packages come with --no-install-recommends, as on a minimal machine.
# tests/repo/check-packages.py (the test `install-deps`) proves it for every file the build read.
# The few names that differ between releases are chosen by /etc/os-release (debian_release).
set -euo pipefail
cd "$(dirname "$0")/../.."

tests=false list=false
for arg in "$@"; do
    case "$arg" in
    --tests) tests=true ;;
    --list) list=true ;;
    -h|--help) sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install-deps.sh: unknown option '$arg' (see --help)" >&2; exit 2 ;;
    esac
done

# Debian's major release: VERSION_ID (12 bookworm, 13 trixie); testing and unstable have none
# and count as newer than any release.
debian_release() {
    local id
    # shellcheck disable=SC1091
    id=$(. /etc/os-release 2>/dev/null && echo "${VERSION_ID:-}")
    id=${id%%.*}
    [[ $id =~ ^[0-9]+$ ]] && echo "$id" || echo 99
}
release=$(debian_release)

packages=(
    meson ninja-build pkg-config gcc xxd
    libgrpc-dev protobuf-c-compiler libprotobuf-c-dev protobuf-compiler libprotobuf-dev
    libyaml-dev libsystemd-dev libucx-dev ucx-utils libhwloc-dev
    libjansson-dev libsmartcols-dev libsodium-dev
    # The manual pages (docs/man/) are written in scdoc.
    scdoc
    # The unit's ExecReload= runs /bin/kill, which a minimal Debian lacks.
    procps
    # --metrics-listen: the embedded HTTP server (daemon/metrics/).
    libmicrohttpd-dev
)
# systemd.pc (where deploy/meson.build installs the units; setup fails without it) is in systemd
# on Debian 12 and in systemd-dev, which Debian 12 lacks, from Debian 13 on.
if (( release >= 13 )); then
    packages+=(systemd-dev)
else
    packages+=(systemd)
fi
if $tests; then
    packages+=(libcmocka-dev valgrind)
    # The Python side (grpcio, protobuf, numpy, torch 2, mypy, ...) lives in a virtual
    # environment made below from deploy/dev/requirements.txt with the `python3` on PATH; where
    # that is Debian's own, it needs pip and venv.
    packages+=(python3-pip python3-venv)
    # torch.compile's inductor compiles C++ for the CPU (test torch-ecosystem): a minimal Debian
    # has gcc but no g++.
    packages+=(g++)
    # The clients that tests run as other uids (tests/integration/other_uid.py): Debian's
    # interpreter, which every uid can run, with Debian's grpcio, protobuf and numpy.
    packages+=(python3-grpcio python3-protobuf python3-numpy)
    # test man-pages renders the pages with man -l and groff's warnings on.
    packages+=(man-db groff-base)
    # The libFuzzer targets (tests/fuzz/run-fuzzers.sh): clang, its fuzzer runtime, and
    # llvm-symbolizer for the coverage report. The unversioned names follow the release's default
    # clang (14 on Debian 12, 19 on Debian 13), so the runtime always matches the compiler.
    packages+=(clang libclang-rt-dev llvm)
    # The systemd tests: systemd-analyze (verify, security), systemd-socket-activate,
    # systemd-sysusers and systemd-tmpfiles come with the systemd package (no PID 1 needed);
    # unshare (the journal test's private /run) with util-linux.
    packages+=(systemd util-linux)
    # ss (coord-bench.py, test coordinator-bench-smoke) reads the daemons' sockets to etcd.
    packages+=(iproute2)
    # checkpoint-bench.py (test checkpoint-bench-smoke) times fio's reads of the same files as
    # its baselines (psync and io_uring engines; Debian's fio links liburing).
    packages+=(fio)
    # and fincore (util-linux-extra, not util-linux, on Debian 12 and 13) checks that the files'
    # pages were evicted before a cold load.
    packages+=(util-linux-extra)
    # test etcd-client: a real etcd (and etcdctl), started by the test on free loopback ports;
    # openssl makes its TLS certificates.
    packages+=(etcd-server etcd-client openssl)
    # npm may come with a Node.js that is not Debian's; ask apt only when there is none.
    command -v npm >/dev/null || packages+=(npm)
    # promtool checks /metrics (tests metrics, metrics-abuse); the package brings services,
    # kept from starting below.
    packages+=(prometheus)
fi
# Each name once (systemd is in both lists on Debian 12).
mapfile -t packages < <(printf '%s\n' "${packages[@]}" | awk '!seen[$0]++')
if $list; then
    printf '%s\n' "${packages[@]}"
    exit 0
fi

missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if (( ${#missing[@]} > 0 )); then
    echo "familyd: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # Packages such as prometheus and etcd-server start their services when installed: not here
    # (the tests bind free ports of their own). A policy-rc.d that refuses every start, only
    # where none exists, removed afterwards.
    policy=/usr/sbin/policy-rc.d policy_ours=false
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\n# install-deps.sh: no service starts while it installs\nexit 101\n' >"$policy"
        chmod 755 "$policy"
        policy_ours=true
        trap 'rm -f "$policy"' EXIT
    fi
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    if $policy_ours; then
        rm -f "$policy"
        trap - EXIT
    fi
fi

# The tests' Python environment (.venv/, deploy/dev/python-env.sh): torch 2, grpcio, numpy, ...
if $tests; then
    bash deploy/dev/python-env.sh
fi

# buf stands in for grpcurl (not in Debian): `buf curl` speaks gRPC over a Unix socket and
# discovers the API by reflection.
if $tests && [[ ! -x node_modules/.bin/buf ]]; then
    echo "familyd: installing buf (npm @bufbuild/buf)"
    npm install --no-save --no-audit --no-fund --loglevel=error @bufbuild/buf >/dev/null
fi
