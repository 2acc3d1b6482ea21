#!/usr/bin/env bash
# tests/fresh/run.sh: release check (not run in CI). Builds a minimal Debian 12 root (or Debian 13
# with --release trixie) with debootstrap from the package source this machine's apt uses, adds
# what a fresh machine of this workplace has beside Debian (the pyenv python3, pip's
# configuration and wheel folders), clones the repository into it and runs the README's two
# commands there, as root, with nothing else installed:
#   bash deploy/dev/run.sh      (until familyd serves; one `familyctl status`; SIGTERM, exit 0)
#   bash tests/run-all.sh       (its closing line `familyd: N passed, N failed, N skipped`)
# Exit status: 0 both passed, 1 a check failed, 2 the check could not run. --help for options.
set -euo pipefail

usage() {
    cat <<'EOF'
usage: tests/fresh/run.sh [OPTIONS]        (as root, on a Debian 12 host)

Runs the README's two commands in a fresh, minimal Debian 12 (bookworm) or 13 (trixie) root
made with `debootstrap --variant=minbase` from the mirror and suites this machine's apt uses.

options:
  --release NAME      bookworm (default) or trixie: the Debian release of the root; the host's
                      bookworm suites are read as NAME, NAME-updates and NAME-security
  --work DIR          work folder (default /var/tmp/familyd-fresh, /var/tmp/familyd-fresh-trixie
                      for trixie): the cached base root, the root, logs/
  --host-python DIR   the interpreter tree mounted read-only at the same path in the root, its
                      bin/ first on PATH (default: the prefix of the python3 on this PATH when
                      it is not Debian's; none: no such interpreter)
  --repo PATH         the git repository to clone (default: the one this script is in)
  --commit REV        the commit to check (default HEAD of that repository)
  --working-tree      clone HEAD, then copy in the uncommitted changes and untracked,
                      not-ignored files of the repository's working tree
  --reuse-base        reuse the base root cached by an earlier run (made from the same package
                      source) instead of running debootstrap again
  --keep              keep the root after the run for inspection (default: removed; the
                      cached base and the logs are always kept)
  --run-only          run only the first command (deploy/dev/run.sh), not the test suite
  --tests "NAME..."   instead of the whole second command, the named meson tests only, in the
                      build tests/run-all.sh makes (ASan+UBSan, warnings as errors): to check
                      again what a full run found, without the hours of the rest
  --run-timeout S     seconds deploy/dev/run.sh may take to install, build and serve (default 3600)
  --test-timeout S    seconds tests/run-all.sh may take (default 21600)
  -h, --help          this text

exit status: 0 both commands passed, 1 a check failed, 2 the check could not run here.
EOF
}

# --- options ---------------------------------------------------------------------------------
script=$(readlink -f "${BASH_SOURCE[0]}")
args=("$@")
release=bookworm
work=''
host_python=''
repo=$(dirname "$(dirname "$(dirname "$script")")")
commit=HEAD
working_tree=0
reuse_base=0
keep=0
run_only=0
only_tests=''
run_timeout=3600
test_timeout=21600

die() { echo "fresh: $*" >&2; exit 2; }
need_arg() { [[ $# -ge 2 && -n $2 ]] || die "$1 needs a value (see --help)"; }
while [[ $# -gt 0 ]]; do
    case $1 in
        --release) need_arg "$@"; release=$2; shift 2 ;;
        --work) need_arg "$@"; work=$2; shift 2 ;;
        --host-python) need_arg "$@"; host_python=$2; shift 2 ;;
        --repo) need_arg "$@"; repo=$2; shift 2 ;;
        --commit) need_arg "$@"; commit=$2; shift 2 ;;
        --working-tree) working_tree=1; shift ;;
        --reuse-base) reuse_base=1; shift ;;
        --keep) keep=1; shift ;;
        --run-only) run_only=1; shift ;;
        --tests) need_arg "$@"; only_tests=$2; shift 2 ;;
        --run-timeout) need_arg "$@"; run_timeout=$2; shift 2 ;;
        --test-timeout) need_arg "$@"; test_timeout=$2; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "fresh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
    esac
done
[[ $run_timeout =~ ^[1-9][0-9]*$ && $test_timeout =~ ^[1-9][0-9]*$ ]] \
    || die "--run-timeout and --test-timeout take a number of seconds"
case $release in
    bookworm) release_name="Debian 12" ;;
    trixie) release_name="Debian 13" ;;
    *) die "--release '$release': bookworm or trixie" ;;
esac
# Each release its own work folder by default: roots, cached bases and locks apart.
if [[ -z $work ]]; then
    work=/var/tmp/familyd-fresh
    [[ $release == bookworm ]] || work+=-$release
fi
[[ $(id -u) -eq 0 ]] || die "run this as root (debootstrap, mount and chroot need it)"
[[ $(uname -s) == Linux ]] || die "this check runs on Linux only"
mkdir -p "$work"
work=$(readlink -f "$work")
[[ $work != / && $work =~ ^/[A-Za-z0-9._/+-]+$ ]] \
    || die "--work '$work': use an absolute path of letters, digits and ._+-/ other than /"
repo=$(readlink -f "$repo")
[[ $working_tree -eq 0 || $commit == HEAD ]] || die "--working-tree goes with HEAD, not --commit"
command -v git >/dev/null || die "git is not installed on this host"
git -C "$repo" rev-parse --git-dir >/dev/null 2>&1 || die "$repo is not a git repository"
sha=$(git -C "$repo" rev-parse --verify --quiet "$commit^{commit}") \
    || die "$repo has no commit '$commit'"

# --- a private mount namespace ---------------------------------------------------------------
# Every mount below is made in a mount namespace of this script's own, so none of them can
# propagate to the host's /dev or /sys, and the kernel drops them all when the script ends,
# however it ends. The EXIT trap unmounts them too.
if [[ -z ${FRESH_CHECK_PRIVATE_NS:-} ]]; then
    if err=$(unshare --mount --propagation private true 2>&1); then
        export FRESH_CHECK_PRIVATE_NS=1
        exec unshare --mount --propagation private -- "$BASH" "$script" "${args[@]}"
    fi
    echo "fresh: warning: no private mount namespace (unshare --mount: ${err:-failed});" \
        "mounting in the host's namespace (each mount made a slave of the host's)" >&2
fi

# --- phases, timings, cleanup ----------------------------------------------------------------
root=$work/root
# Where the clone lives inside the root: /src/ and the project's name (nothing else under /src).
project=familyd
src=/src/$project
logs=$work/logs
base_tar=$work/base/$release-minbase.tar
base_stamp=$work/base/$release-minbase.source
sock_rel=run/familyd.sock
exec 9>"$work/.lock"
flock -n 9 || die "another run is using $work (lock $work/.lock)"
phase_names=() phase_secs=() phase_results=()
cur_phase='' cur_start=0
outcome='' daemon_pid='' tail_pid=''
result=2    # until a check decides otherwise

log() { echo "fresh: $*"; }
fmt_secs() { local s=$1; if (( s >= 60 )); then printf '%dm%02ds' $((s / 60)) $((s % 60)); else printf '%ds' "$s"; fi; }
begin() { cur_phase=$1; cur_start=$SECONDS; log "== $1"; }
finish() {
    phase_names+=("$cur_phase") phase_secs+=($((SECONDS - cur_start))) phase_results+=("$1")
    log "   $cur_phase: $1 in $(fmt_secs $((SECONDS - cur_start)))"
    cur_phase=''
}
# fail CODE MESSAGE: the current phase failed; CODE 1 = the project failed the check,
# 2 = the check could not run here.
fail() {
    local code=$1; shift
    outcome="$*"
    [[ -n $cur_phase ]] && finish FAILED
    result=$code
    exit "$code"
}

# Processes whose root directory is the chroot: only ones this script started there.
root_pids() {
    local p r
    for p in /proc/[0-9]*; do
        r=$(readlink "$p/root" 2>/dev/null) || continue
        if [[ $r == "$root" ]]; then echo "${p#/proc/}"; fi
    done
    return 0
}
kill_root_processes() {
    local pids i
    pids=$(root_pids)
    [[ -z $pids ]] && return 0
    log "stopping what still runs in the root: $(echo $pids)"
    kill -TERM $pids 2>/dev/null || true
    for i in 1 2 3 4 5 6 7 8 9 10; do
        pids=$(root_pids); [[ -z $pids ]] && return 0; sleep 1
    done
    kill -KILL $pids 2>/dev/null || true
    sleep 1
}
# Mount points at or under $root, deepest first (mountinfo field 5; no whitespace in $root).
root_mounts() { awk -v r="$root" '$5 == r || index($5, r "/") == 1 { print $5 }' /proc/self/mountinfo | sort -r; }
unmount_root() {
    local m
    for m in $(root_mounts); do
        umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || echo "fresh: could not unmount $m" >&2
    done
}
remove_root() {
    [[ -d $root ]] || return 0
    if [[ -n $(root_mounts) ]]; then
        echo "fresh: not removing $root: something is still mounted there" >&2
        return 1
    fi
    rm -rf --one-file-system "$root"
}

cleanup() {
    local rc=$? i
    trap - EXIT INT TERM HUP
    set +e
    [[ -n $tail_pid ]] && kill "$tail_pid" 2>/dev/null
    if [[ -n $cur_phase ]]; then
        i=FAILED; (( result == 129 || result == 130 || result == 143 )) && i=INTERRUPTED
        phase_names+=("$cur_phase") phase_secs+=($((SECONDS - cur_start))) phase_results+=("$i")
        [[ -z $outcome ]] && outcome="stopped during '$cur_phase' (exit status $rc${err_where:+, a command failed at $err_where})"
    fi
    [[ -d $root ]] && kill_root_processes
    unmount_root
    if [[ -d $root ]]; then
        if (( keep )); then
            log "kept the root: $root (the clone is $root$src)"
        else
            remove_root || true
        fi
    fi
    echo
    log "phase timings"
    for i in "${!phase_names[@]}"; do
        printf 'fresh:   %-50s %8s  %s\n' "${phase_names[$i]}" "$(fmt_secs "${phase_secs[$i]}")" "${phase_results[$i]}"
    done
    log "logs: $logs"
    if (( result == 0 )); then
        log "PASSED: ${outcome}"
    else
        log "FAILED: ${outcome:-exit status $rc${err_where:+, a command failed at $err_where}}"
    fi
    exit "$result"
}
err_where=''
trap 'err_where="line $LINENO of $script"' ERR
trap cleanup EXIT
trap 'outcome="interrupted (SIGINT)"; result=130; exit 130' INT
trap 'outcome="interrupted (SIGTERM)"; result=143; exit 143' TERM
trap 'outcome="interrupted (SIGHUP)"; result=129; exit 129' HUP
mkdir -p "$logs" "$work/base"
rm -f "$logs"/*.log

# Commands run in the root as a root login shell would run them, from the clone: env -i, a sane
# PATH, HOME=/root, no FAMILYD_* variable (the host's interpreter and PIP_* variables are added
# below).
root_env=(/usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
    HOME=/root USER=root LOGNAME=root SHELL=/bin/bash TERM="${TERM:-dumb}" LANG=C.UTF-8)
# start_in_root LOG COMMAND: runs COMMAND in the root in the background, its output in LOG and
# shown here as it comes (tail_pid). bg_pid is chroot's own process, which execs env, bash and
# COMMAND (`exec bash deploy/dev/run.sh` ends up as familyd itself). In the background, a Ctrl-C
# reaches this script at once, and its EXIT trap stops whatever runs in the root.
start_in_root() {
    : >"$1"
    chroot "$root" "${root_env[@]}" /bin/bash -c "cd $src && $2" >"$1" 2>&1 </dev/null &
    bg_pid=$!
    tail -n +1 -f --pid="$bg_pid" "$1" &
    tail_pid=$!
}
alive() { [[ -d /proc/$1 ]] && [[ $(cut -d' ' -f3 "/proc/$1/stat" 2>/dev/null) != Z ]]; }
# reap PID: its exit status in rc, once its output has been shown.
reap() {
    rc=0; wait "$1" || rc=$?
    if [[ -n $tail_pid ]]; then
        sleep 1; kill "$tail_pid" 2>/dev/null || true; wait "$tail_pid" 2>/dev/null || true; tail_pid=''
    fi
    return 0
}

# --- the host's package source ---------------------------------------------------------------
# One line per entry of type deb in /etc/apt/sources.list, sources.list.d/*.list (one-line
# format) and sources.list.d/*.sources (deb822):  URI|SUITE|COMPONENTS|OPTIONS|SIGNED-BY
read_apt_sources() {
    local f
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [[ -f $f ]] || continue
        awk '
            { sub(/#.*/, "") }
            $1 != "deb" { next }
            {
                i = 2; opts = ""
                if ($2 ~ /^\[/) {
                    s = $2
                    while (s !~ /\]$/ && i < NF) { i++; s = s " " $i }
                    opts = substr(s, 2, length(s) - 2); i++
                }
                comps = ""
                for (j = i + 2; j <= NF; j++) comps = comps (comps == "" ? "" : " ") $j
                signed = ""; keep = ""
                n = split(opts, o, /[ \t]+/)
                for (k = 1; k <= n; k++) {
                    if (o[k] == "") continue
                    if (o[k] ~ /^signed-by=/) signed = substr(o[k], 11)
                    else keep = keep (keep == "" ? "" : " ") o[k]
                }
                gsub(/,/, " ", signed)
                print $i "|" $(i + 1) "|" comps "|" keep "|" signed
            }' "$f"
    done
    for f in /etc/apt/sources.list.d/*.sources; do
        [[ -f $f ]] || continue
        awk '
            function flush(   n, m, a, b, U, S) {
                if (types ~ /(^| )deb( |$)/ && tolower(enabled) != "no") {
                    n = split(uris, U, / +/); m = split(suites, S, / +/)
                    for (a = 1; a <= n; a++) for (b = 1; b <= m; b++)
                        if (U[a] != "" && S[b] != "") print U[a] "|" S[b] "|" comps "|" opts "|" signed
                }
                types = uris = suites = comps = opts = signed = enabled = field = ""
            }
            /^#/ { next }
            /^[ \t]*$/ { flush(); next }
            # A key written out in Signed-By (continuation lines) is not carried: the root
            # trusts the Debian archive keys of its debian-archive-keyring.
            /^[ \t]/ { if (field == "signed-by") signed = ""; next }
            {
                c = index($0, ":"); field = tolower(substr($0, 1, c - 1)); val = substr($0, c + 1)
                gsub(/^[ \t]+|[ \t]+$/, "", val); gsub(/[ \t]+/, " ", val)
                if (field == "types") types = val
                else if (field == "uris") uris = val
                else if (field == "suites") suites = val
                else if (field == "components") comps = val
                else if (field == "enabled") enabled = val
                else if (field == "signed-by") signed = val
                else if (field == "architectures") { gsub(/ /, ",", val); opts = opts (opts == "" ? "" : " ") "arch=" val }
                else if (field == "trusted") opts = opts (opts == "" ? "" : " ") "trusted=" val
            }
            END { flush() }' "$f"
    done
}
# The Debian 12 suites a default install reads (bookworm, -updates, -security), `stable` named
# as bookworm; every other entry (backports, third-party repositories) is left out. For
# --release trixie the same mirrors serve trixie, trixie-updates and trixie-security.
debian_sources() {
    read_apt_sources | awk -F '|' -v OFS='|' -v rel="$release" '
        { sub(/^stable/, "bookworm", $2) }
        $2 ~ /^bookworm(-updates|-security)?$/ { sub(/^bookworm/, rel, $2) }
        $2 ~ ("^" rel "(-updates|-security)?$") && !seen[$1 FS $2]++ { print }'
}

# --- checks on the host ----------------------------------------------------------------------
begin "host: debootstrap, package source, mounts"
if ! command -v debootstrap >/dev/null; then
    log "installing debootstrap on the host"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap \
        >"$logs/host-apt.log" 2>&1 \
        || { tail -n 20 "$logs/host-apt.log" >&2; fail 2 "could not install debootstrap (apt-get: see $logs/host-apt.log)"; }
fi
sources=$(debian_sources)
[[ -n $sources ]] || fail 2 "the host's apt reads no Debian 12 suite (bookworm, bookworm-updates, bookworm-security) from /etc/apt/sources.list or /etc/apt/sources.list.d/"
main_line=$(awk -F '|' -v rel="$release" '$2 == rel { print; exit }' <<<"$sources")
[[ -n $main_line ]] || fail 2 "the host's apt reads no 'bookworm' suite; debootstrap needs one"
IFS='|' read -r mirror _ components _ main_signed <<<"$main_line"
case $mirror in
    http://*|https://*|file:/*) ;;
    *) fail 2 "debootstrap cannot read the host's mirror '$mirror' (http, https or file only)" ;;
esac
log "package source (from the host's apt):"
while IFS='|' read -r u s c o k; do
    log "   deb ${o:+[$o] }$u $s $c${k:+  (signed-by $k)}"
done <<<"$sources"
skipped=$(read_apt_sources | awk -F '|' '{ s = $2; sub(/^stable/, "bookworm", s) } s !~ /^bookworm(-updates|-security)?$/ { print "   " $1 " " $2 }' | sort -u)
[[ -n $skipped ]] && log "left out (not part of a default $release_name install):" && echo "$skipped" | sed 's/^/fresh: /'
# debootstrap fetches without apt: give it the proxy apt uses, if any.
if [[ -z ${http_proxy:-} ]]; then
    eval "$(apt-config shell http_proxy Acquire::http::Proxy https_proxy Acquire::https::Proxy)"
    [[ -n ${http_proxy:-} && $http_proxy != DIRECT ]] && export http_proxy || unset http_proxy
    [[ -n ${https_proxy:-} && $https_proxy != DIRECT ]] && export https_proxy || unset https_proxy
fi
# Can this machine mount at all? (A container without CAP_SYS_ADMIN cannot.)
probe=$work/.mount-probe
mkdir -p "$probe"
if ! err=$(mount -t tmpfs fresh-probe "$probe" 2>&1); then
    rmdir "$probe" 2>/dev/null || true
    fail 2 "mount is not permitted here (mount -t tmpfs: $err); the check needs root with CAP_SYS_ADMIN, e.g. a VM or a privileged container"
fi
umount "$probe"; rmdir "$probe"

# What a fresh machine of this workplace has beside Debian, reproduced in the root: the python3
# first on PATH (a pyenv CPython, not Debian's), pip's configuration files and PIP_* variables,
# and the local wheel folders they point at.
if [[ -z $host_python ]]; then
    host_python=none
    if command -v python3 >/dev/null && prefix=$(python3 -c 'import sys; print(sys.base_prefix)' 2>/dev/null) \
            && [[ $prefix != /usr && $prefix != /usr/local && -x $prefix/bin/python3 ]]; then
        host_python=$prefix
    fi
fi
if [[ $host_python != none ]]; then
    host_python=$(readlink -f "$host_python")
    [[ -x $host_python/bin/python3 ]] || fail 2 "--host-python $host_python: no bin/python3 there"
    [[ $host_python =~ ^/[A-Za-z0-9._/+-]+$ ]] || fail 2 "--host-python '$host_python': a path of letters, digits and ._+-/ only"
    log "python3: $host_python/bin/python3 ($("$host_python/bin/python3" -V 2>&1)), mounted read-only at the same path, first on PATH"
    root_env=("${root_env[@]/#PATH=/PATH=$host_python/bin:}")
fi
pip_files=()
home=${HOME:-/root}
for f in /etc/xdg/pip/* /etc/pip.conf "$home/.pip/pip.conf" "$home/.config/pip/pip.conf"; do
    [[ -f $f ]] && pip_files+=("$f")
done
pip_vars=()
while IFS= read -r v; do pip_vars+=("$v"); done < <(env | grep -E '^PIP_[A-Z0-9_]+=' | sort || true)
root_env+=("${pip_vars[@]}")
wheel_dirs=()
for d in /opt/wheels /opt/pypi /opt/pypi-more; do
    [[ -d $d ]] && wheel_dirs+=("$d")
done
(( ${#pip_files[@]} )) && log "pip configuration copied in: ${pip_files[*]}"
(( ${#pip_vars[@]} )) && log "pip variables passed: ${pip_vars[*]%%=*}"
(( ${#wheel_dirs[@]} )) && log "wheel folders mounted read-only: ${wheel_dirs[*]}"
finish ok

# --- the base root ---------------------------------------------------------------------------
# The base depends on the package source; a cached one is reused only when it came from the same.
source_id=$(printf 'debootstrap --variant=minbase %s %s %s\n%s\n' "$release" "$mirror" "$components" "$sources")
kill_root_processes
unmount_root
remove_root || fail 2 "cannot remove the previous root $root"
if (( reuse_base )) && [[ -f $base_tar && -f $base_stamp ]] && [[ $(cat "$base_stamp") == "$source_id" ]]; then
    begin "base root: cached (made $(date -r "$base_tar" '+%F %T'))"
    mkdir -p "$root"
    tar -C "$root" --numeric-owner -xpf "$base_tar" || fail 2 "cannot unpack $base_tar"
    finish ok
else
    (( reuse_base )) && log "no cached base root from this package source in $work/base: running debootstrap"
    begin "base root: debootstrap --variant=minbase $release"
    include=()
    # apt needs ca-certificates to read an https source; minbase does not have it.
    grep -q '^https://' <<<"$sources" && include=(--include=ca-certificates)
    keyring=()
    [[ -n $main_signed && -f ${main_signed%% *} ]] && keyring=(--keyring="${main_signed%% *}")
    log "debootstrap --variant=minbase --components=${components// /,} ${include[*]} ${keyring[*]} $release $root $mirror"
    if ! debootstrap --variant=minbase --components="${components// /,}" "${include[@]}" "${keyring[@]}" \
            "$release" "$root" "$mirror" >"$logs/debootstrap.log" 2>&1; then
        tail -n 25 "$logs/debootstrap.log" >&2
        [[ -f $root/debootstrap/debootstrap.log ]] && cp "$root/debootstrap/debootstrap.log" "$logs/debootstrap-detail.log" \
            && echo "--- $root/debootstrap/debootstrap.log (last lines)" >&2 && tail -n 15 "$logs/debootstrap-detail.log" >&2
        fail 2 "debootstrap could not make the base root from $mirror (see $logs/debootstrap.log)"
    fi
    unmount_root
    log "caching the base root in $base_tar"
    tar -C "$root" --numeric-owner -cpf "$base_tar.new" . || fail 2 "cannot write $base_tar"
    mv "$base_tar.new" "$base_tar"
    printf '%s\n' "$source_id" >"$base_stamp"
    finish ok
fi

# --- the root: package source, no services, the clone ----------------------------------------
begin "root: apt source, mounts, git clone"
{
    echo "# The package source of the host that made this root (tests/fresh/run.sh)."
    while IFS='|' read -r u s c o k; do
        opt=$o
        if [[ -n $k ]]; then
            for key in $k; do
                # A keyring the root lacks comes from the host (a mirror with its own key).
                if [[ $key == /* && -f $key && ! -e $root$key ]]; then
                    mkdir -p "$root$(dirname "$key")" && cp "$key" "$root$key"
                fi
            done
            opt="${opt:+$opt }signed-by=${k// /,}"
        fi
        echo "deb ${opt:+[$opt] }$u $s $c"
    done <<<"$sources"
} >"$root/etc/apt/sources.list"
rm -f "$root"/etc/apt/sources.list.d/*.list "$root"/etc/apt/sources.list.d/*.sources
# The host's settings for reaching that source: its proxy, and whether it checks Release dates
# (a pinned snapshot mirror has an old Date/Valid-Until).
apt-config dump | grep -E '^Acquire::(Check-Valid-Until|Check-Date|https?::Proxy(::[^ ]+)?) ' \
    >"$root/etc/apt/apt.conf.d/99host-package-source" || rm -f "$root/etc/apt/apt.conf.d/99host-package-source"
# Packages never start services in the root.
printf '#!/bin/sh\n# No service starts in this root.\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
chmod 755 "$root/usr/sbin/policy-rc.d"
cp -L /etc/resolv.conf "$root/etc/resolv.conf" || fail 2 "cannot copy /etc/resolv.conf into the root"
# The root shares the host's network and name (no namespaces), so it resolves names as the host
# does, with the host's /etc/hosts: debootstrap's leaves out the host's own name and maps
# localhost to ::1 as well, and torchrun's rendezvous, which connects to both names, failed in
# the root with it while it succeeds on the host.
cp -L /etc/hosts "$root/etc/hosts" || fail 2 "cannot copy /etc/hosts into the root"
# The host's own CA certificates (the Debian place for a site's CAs, e.g. those of a
# TLS-intercepting proxy on this network): the ca-certificates package adds them to the root's
# store when apt installs it, so that npm reaches its registry from here as it does from the host.
if compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null; then
    mkdir -p "$root/usr/local/share/ca-certificates"
    cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
    log "the host's CA certificates go with it: $(cd /usr/local/share/ca-certificates && echo *.crt)"
fi

# pip's configuration files at their places; HOME is root's home in the root (its passwd),
# whatever it is here.
root_home=$(awk -F: '$1 == "root" { print $6 }' "$root/etc/passwd")
for f in "${pip_files[@]}"; do
    t=$f
    [[ $f == "$home"/* ]] && t=$root_home/${f#"$home"/}
    mkdir -p "$root$(dirname "$t")" && cp -L "$f" "$root$t" || fail 2 "cannot copy $f into the root"
done

mkdir -p "$root/src"
git clone --quiet --no-hardlinks "$repo" "$root$src" >"$logs/clone.log" 2>&1 \
    || { cat "$logs/clone.log" >&2; fail 2 "git clone $repo failed"; }
git -C "$root$src" -c advice.detachedHead=false checkout --quiet --detach "$sha" >>"$logs/clone.log" 2>&1 \
    || { cat "$logs/clone.log" >&2; fail 2 "commit $sha is not reachable from any branch or tag of $repo"; }
what="$(git -C "$repo" log -1 --format='%h %s' "$sha")"
if (( working_tree )); then
    # Tracked files as they are now (modified or deleted) and untracked, not-ignored ones.
    git -C "$repo" ls-tree -r -z --name-only HEAD \
        | while IFS= read -r -d '' f; do if [[ ! -e $repo/$f && ! -L $repo/$f ]]; then printf '%s\0' "$f"; fi; done \
        | (cd "$root$src" && xargs -0 -r rm -f --)
    git -C "$repo" ls-files -z --cached --others --exclude-standard \
        | while IFS= read -r -d '' f; do if [[ -e $repo/$f || -L $repo/$f ]]; then printf '%s\0' "$f"; fi; done \
        | tar -C "$repo" --null -T - -cf - | tar -C "$root$src" -xf - \
        || fail 2 "cannot copy the working tree of $repo"
    what="$what + the working tree of $repo ($(git -C "$root$src" status --porcelain | wc -l) paths differ)"
fi
log "checking: $what"
log "the root's /src holds only: $(ls "$root/src")"

# /proc, /sys and /dev (with /dev/pts) as the host has them, a /dev/shm of the root's own. Each
# bind is made a slave at once, so that nothing mounted under it reaches the host's tree.
mnt() { local err; err=$(mount "$@" 2>&1) || fail 2 "mount $* failed here: $err"; }
mnt -t proc proc "$root/proc"
mnt --rbind /sys "$root/sys"; mnt --make-rslave "$root/sys"
mnt --bind /dev "$root/dev"; mnt --make-slave "$root/dev"
mnt --bind /dev/pts "$root/dev/pts"; mnt --make-slave "$root/dev/pts"
mnt -t tmpfs -o mode=1777,nosuid,nodev fresh-shm "$root/dev/shm"
# The host's interpreter and wheel folders, read-only: the root uses them, never changes them.
for d in ${host_python/#none/} "${wheel_dirs[@]}"; do
    mkdir -p "$root$d"
    mnt --bind "$d" "$root$d"; mnt -o remount,bind,ro "$root$d"
done
if ! err=$(chroot "$root" /bin/true 2>&1); then
    fail 2 "chroot is not permitted here (chroot $root /bin/true: $err)"
fi
finish ok

# --- command 1: bash deploy/dev/run.sh -------------------------------------------------------
# run.sh sends ninja's output to /dev/null: after a failed build, build once more to show it.
show_build_error() {
    local dir=$root$src/build-run
    if [[ -f $dir/build.ninja ]]; then
        echo "--- the build's error (ninja -C build-run, run again in the root):" >&2
        timeout 600 chroot "$root" "${root_env[@]}" /bin/bash -c "cd $src && ninja -C build-run" >"$logs/run-build-error.log" 2>&1 || true
        grep -v '^\[[0-9]*/[0-9]*\] ' "$logs/run-build-error.log" | tail -n 30 >&2
    elif [[ -f $dir/meson-logs/meson-log.txt ]]; then
        echo "--- build-run/meson-logs/meson-log.txt (last lines):" >&2
        tail -n 30 "$dir/meson-logs/meson-log.txt" >&2
    fi
}
begin "run: bash deploy/dev/run.sh until familyd serves"
run_log=$logs/run.log
sock=$root$src/$sock_rel
start_in_root "$run_log" 'exec bash deploy/dev/run.sh'
daemon_pid=$bg_pid
deadline=$((SECONDS + run_timeout))
served_at=''
while :; do
    if ! alive "$daemon_pid"; then
        reap "$daemon_pid"; daemon_pid=''
        echo "--- $run_log (last lines):" >&2
        tail -n 15 "$run_log" >&2
        show_build_error
        fail 1 "'bash deploy/dev/run.sh' exited with status $rc before familyd served (log: $run_log)"
    fi
    if [[ -S $sock ]]; then
        [[ -z $served_at ]] && served_at=$SECONDS
        # Ready when it says so; a socket with no such line for 30 s is taken as ready too.
        grep -q 'familyd serving' "$run_log" && break
        (( SECONDS - served_at >= 30 )) && { log "the socket is there but familyd printed no 'familyd serving' line; going on"; break; }
    fi
    if (( SECONDS >= deadline )); then
        fail 1 "'bash deploy/dev/run.sh' did not serve on $sock_rel within ${run_timeout}s (log: $run_log)"
    fi
    sleep 2
done
comm=$(cat "/proc/$daemon_pid/comm" 2>/dev/null || echo '?')
[[ $comm == familyd ]] || log "note: the process started as run.sh is now '$comm', not familyd (run.sh no longer ends in exec?)"
finish ok

begin "run: familyctl --socket $sock_rel status"
rc=0
timeout 60 chroot "$root" "${root_env[@]}" /bin/bash -c "cd $src && build-run/client/familyctl --socket $sock_rel status" \
    >"$logs/status.log" 2>&1 || rc=$?
sed 's/^/  | /' "$logs/status.log"
(( rc == 0 )) || fail 1 "'build-run/client/familyctl --socket $sock_rel status' exited with status $rc"
finish ok

begin "run: SIGTERM familyd, exit status 0"
kill -TERM "$daemon_pid"
for _ in $(seq 60); do alive "$daemon_pid" || break; sleep 1; done
if alive "$daemon_pid"; then
    kill -KILL "$daemon_pid" 2>/dev/null || true
    reap "$daemon_pid"; daemon_pid=''
    fail 1 "familyd did not exit within 60 s of SIGTERM"
fi
reap "$daemon_pid"; daemon_pid=''
(( rc == 0 )) || fail 1 "familyd exited with status $rc on SIGTERM (log: $run_log)"
finish ok

if (( run_only )); then
    result=0
    outcome="bash deploy/dev/run.sh served, familyctl status answered, familyd exited 0 on SIGTERM (--run-only: tests not run)"
    exit 0
fi

if [[ -n $only_tests ]]; then
    [[ $only_tests =~ ^[A-Za-z0-9_.:/\ -]+$ ]] || fail 2 "--tests takes meson test names"
    begin "test: the named tests ($only_tests), in run-all.sh's build"
    test_log=$logs/test.log
    start_in_root "$test_log" "bash deploy/dev/install-deps.sh --tests && { [[ -d build-ci ]] || meson setup build-ci -Db_sanitize=address,undefined -Db_lundef=false -Dwerror=true >/dev/null; } && ninja -C build-ci && BUF=\$(pwd)/node_modules/.bin/buf ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 meson test -C build-ci --no-rebuild --print-errorlogs $only_tests"
    while alive "$bg_pid"; do sleep 2; done
    reap "$bg_pid"
    (( rc == 0 )) || fail 1 "the named tests failed (exit status $rc; log: $test_log)"
    finish ok
    result=0
    outcome="bash deploy/dev/run.sh passed and the named tests passed on a fresh $release_name root: $only_tests"
    exit 0
fi

# --- command 2: bash tests/run-all.sh --------------------------------------------------------
begin "test: bash tests/run-all.sh"
test_log=$logs/test.log
start_in_root "$test_log" 'bash tests/run-all.sh'
deadline=$((SECONDS + test_timeout))
while alive "$bg_pid"; do
    (( SECONDS < deadline )) || fail 1 "'bash tests/run-all.sh' ran past --test-timeout ${test_timeout}s (log: $test_log)"
    sleep 2
done
reap "$bg_pid"
closing=$(grep -E '^familyd: [0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$' "$test_log" | tail -n 1 || true)
log "closing line: ${closing:-(none)}"
[[ -n $closing ]] || fail 1 "'bash tests/run-all.sh' exited with status $rc without its closing line (log: $test_log)"
failed=$(sed -E 's/.* ([0-9]+) failed.*/\1/' <<<"$closing")
(( rc == 0 && failed == 0 )) || fail 1 "'bash tests/run-all.sh' exited with status $rc: $closing (log: $test_log)"
finish ok

result=0
outcome="both commands passed on a fresh $release_name root; $closing"
exit 0
