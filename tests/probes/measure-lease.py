#!/usr/bin/python3
"""measure-lease.py [RUNS] [TTL_MS...]: how long an alive key outlives a SIGKILLed holder.

For each TTL (default 2000 and 5000 ms) and run (default 10), starts a one-member etcd with
its default timing (tests/integration/etcd_harness.py), holds a key with coord-probe hold,
waits two TTLs, SIGKILLs the probe and polls the key every 20 ms until it is gone. Prints the
granted TTL and the min, median and max of the times. COORD_PROBE names the probe (default
build/tests/probes/coord-probe). Numbers for docs/coordinator.md.
"""

import os
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import etcd_harness  # noqa: E402

PROBE = os.environ.get("COORD_PROBE") or os.path.join(HERE, "..", "..", "build", "tests", "coord",
                                                      "coord-probe")


def one(etcd, ttl_ms, i):
    key = "/m/alive/%d-%d" % (ttl_ms, i)
    p = subprocess.Popen([PROBE, "hold", etcd.endpoint, key, str(ttl_ms)], stdout=subprocess.PIPE,
                         text=True)
    granted = int(p.stdout.readline().split()[2])
    time.sleep(2 * granted)
    p.send_signal(signal.SIGKILL)
    t0 = time.monotonic()
    p.wait()
    while etcd.get(key) is not None:
        time.sleep(0.02)
    return granted, time.monotonic() - t0


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    ttls = [int(a) for a in sys.argv[2:]] or [2000, 5000]
    with etcd_harness.EtcdCluster(1) as etcd:
        for ttl in ttls:
            results = [one(etcd, ttl, i) for i in range(runs)]
            times = [t for _, t in results]
            print("asked %d ms, granted %d s: gone after min %.2f s, median %.2f s, max %.2f s "
                  "(%d runs)" % (ttl, results[0][0], min(times), statistics.median(times),
                                 max(times), runs))


if __name__ == "__main__":
    main()
