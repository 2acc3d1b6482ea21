"""huge_pages.py: the benches' reservation of 2 MiB huge pages for the daemon (vm.nr_hugepages),
as on a node whose operator reserved them, put back as it was when the bench ends."""

import contextlib

NR_HUGEPAGES = "/proc/sys/vm/nr_hugepages"
HUGE_PAGE = 2 << 20


def _write(n):
    with open(NR_HUGEPAGES, "w") as f:
        f.write(str(n))


def _read():
    with open(NR_HUGEPAGES) as f:
        return int(f.read())


def thp_setting():
    """The kernel's transparent huge pages mode for anonymous memory (always, madvise, never;
    "not built in" on a kernel without them)."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return f.read().split("[")[1].split("]")[0]
    except (OSError, IndexError):
        return "not built in"


@contextlib.contextmanager
def reserved(n, who):
    """vm.nr_hugepages = n inside the block (root), the old value after; nothing when n is 0.
    SystemExit when fewer than n could be reserved (memory too fragmented or too small)."""
    if not n:
        yield
        return
    old = _read()
    _write(n)
    try:
        got = _read()
        if got < n:
            raise SystemExit("%s: only %d of %d huge pages could be reserved" % (who, got, n))
        yield
    finally:
        _write(old)
