/* metrics-counters.c: the process-wide call and reload counters behind /metrics. */

#include <stdatomic.h>
#include <string.h>

#include "common/macro.h"
#include "metrics.h"

typedef struct MethodSlot {
        _Atomic(const char *) path; /* NULL: free */
        atomic_uint_fast64_t calls[METRICS_STATUS_CODES];
        atomic_uint_fast64_t buckets[METRICS_LATENCY_BUCKETS + 1];
        atomic_uint_fast64_t sum_ns;
} MethodSlot;

/* Two fixed slots first: calls of methods familyd does not serve, and calls past the table. */
#define SLOT_UNKNOWN 0u
#define SLOT_OTHER 1u
#define SLOT_FIRST 2u
static MethodSlot slots[SLOT_FIRST + METRICS_MAX_METHODS];

static const char *const slot_names[SLOT_FIRST] = { "unknown", "other" };

/* Upper bounds in nanoseconds and as label text (OpenMetrics wants canonical floats). */
static const uint64_t bound_ns[METRICS_LATENCY_BUCKETS] = {
        50000,     100000,    250000,    500000,     1000000,    2500000,
        5000000,   10000000,  25000000,  50000000,   100000000,  250000000,
        500000000, 1000000000, 2500000000, 10000000000,
};
static const char *const bound_text[METRICS_LATENCY_BUCKETS] = {
        "5e-05", "0.0001", "0.00025", "0.0005", "0.001", "0.0025", "0.005", "0.01",
        "0.025", "0.05",   "0.1",     "0.25",   "0.5",   "1.0",    "2.5",   "10.0",
};

static const char *const status_names[METRICS_STATUS_CODES] = {
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
};

static atomic_uint_fast64_t reloads_ok, reloads_failed;
static atomic_int_fast64_t reload_last_unix_ms;
static atomic_bool reload_last_ok = true;

const char *metrics_latency_bound(unsigned i) {
        return i < METRICS_LATENCY_BUCKETS ? bound_text[i] : "+Inf";
}

const char *metrics_status_name(unsigned status) {
        return status < METRICS_STATUS_CODES ? status_names[status] : "UNKNOWN";
}

/* The slot of path: found, or taken now; SLOT_OTHER once the table is full. */
static MethodSlot *slot_of(const char *path) {
        if (!path)
                return &slots[SLOT_UNKNOWN];
        for (size_t i = SLOT_FIRST; i < ELEMENTSOF(slots); i++) {
                const char *p = atomic_load_explicit(&slots[i].path, memory_order_acquire);
                if (p == path)
                        return &slots[i];
                if (p)
                        continue;
                const char *expected = NULL;
                if (atomic_compare_exchange_strong_explicit(&slots[i].path, &expected, path,
                                                            memory_order_acq_rel,
                                                            memory_order_acquire) ||
                    expected == path)
                        return &slots[i];
        }
        return &slots[SLOT_OTHER];
}

static unsigned bucket_of(uint64_t ns) {
        unsigned i = 0;

        while (i < METRICS_LATENCY_BUCKETS && ns > bound_ns[i])
                i++;
        return i;
}

void metrics_call_done(const char *path, unsigned status, uint64_t arrived_ns) {
        MethodSlot *s = slot_of(path);
        uint64_t now = metrics_now_ns();
        uint64_t ns = arrived_ns > 0 && now > arrived_ns ? now - arrived_ns : 0;

        if (status >= METRICS_STATUS_CODES)
                status = 2; /* UNKNOWN */
        atomic_fetch_add_explicit(&s->calls[status], 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&s->buckets[bucket_of(ns)], 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&s->sum_ns, ns, memory_order_relaxed);
}

static int64_t unix_ms_now(void) {
        struct timespec ts;

        (void) clock_gettime(CLOCK_REALTIME, &ts);
        return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void metrics_mark_start(void) {
        atomic_store_explicit(&reload_last_unix_ms, unix_ms_now(), memory_order_relaxed);
}

void metrics_reload_done(int result) {
        atomic_fetch_add_explicit(result < 0 ? &reloads_failed : &reloads_ok, 1,
                                  memory_order_relaxed);
        atomic_store_explicit(&reload_last_ok, result >= 0, memory_order_relaxed);
        atomic_store_explicit(&reload_last_unix_ms, unix_ms_now(), memory_order_relaxed);
}

void metrics_reloads_read(MetricsReloads *ret) {
        *ret = (MetricsReloads) {
                .ok = atomic_load_explicit(&reloads_ok, memory_order_relaxed),
                .failed = atomic_load_explicit(&reloads_failed, memory_order_relaxed),
                .last_unix_ms = atomic_load_explicit(&reload_last_unix_ms, memory_order_relaxed),
                .last_ok = atomic_load_explicit(&reload_last_ok, memory_order_relaxed),
        };
}

static bool slot_used(MethodSlot *s) {
        for (size_t i = 0; i < METRICS_STATUS_CODES; i++)
                if (atomic_load_explicit(&s->calls[i], memory_order_relaxed) > 0)
                        return true;
        return false;
}

unsigned metrics_methods_read(MetricsMethod *ret, unsigned max) {
        unsigned n = 0;

        for (size_t i = 0; i < ELEMENTSOF(slots) && n < max; i++) {
                MethodSlot *s = &slots[i];
                const char *path = i < SLOT_FIRST ? slot_names[i]
                                                  : atomic_load_explicit(&s->path,
                                                                         memory_order_acquire);
                if (!path || !slot_used(s))
                        continue;
                MetricsMethod *m = &ret[n++];
                m->name = path[0] == '/' ? path + 1 : path;
                for (size_t c = 0; c < METRICS_STATUS_CODES; c++)
                        m->calls[c] = atomic_load_explicit(&s->calls[c], memory_order_relaxed);
                for (size_t b = 0; b <= METRICS_LATENCY_BUCKETS; b++)
                        m->buckets[b] = atomic_load_explicit(&s->buckets[b],
                                                             memory_order_relaxed);
                m->sum_ns = atomic_load_explicit(&s->sum_ns, memory_order_relaxed);
        }
        return n;
}
