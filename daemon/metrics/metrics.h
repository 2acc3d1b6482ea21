/* metrics.h: the daemon's counters for /metrics: calls per method and code, latency, reloads. */
#pragma once

/*
 * DESIGN: the counters are process-wide, like a Prometheus client library's default registry:
 * the hot paths (every gRPC call's end, in rpc/call.c) reach them without plumbing, and each
 * update is a relaxed atomic add on a fixed table, with no lock and no allocation. A method
 * takes its slot the first time one of its calls ends (a compare-and-swap on the slot's path
 * pointer; method paths are static strings, so the pointer names the method). The scrape
 * thread reads the same atomics relaxed: a scrape may see a call's count before its latency,
 * never a torn number.
 */

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

/* Methods with counters of their own; calls of any further method count under "other". */
#define METRICS_MAX_METHODS 64u
/* gRPC status codes, OK (0) to UNAUTHENTICATED (16). */
#define METRICS_STATUS_CODES 17u
/* The latency histogram's upper bounds, in seconds, +Inf implied. */
#define METRICS_LATENCY_BUCKETS 16u

static inline uint64_t metrics_now_ns(void) {
        struct timespec ts;

        (void) clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * UINT64_C(1000000000) + (uint64_t) ts.tv_nsec;
}

/*
 * A call ended with status (a gRPC code): counts it under its method (path as the method
 * table names it, "/familyd.v1.FamilyService/Resolve"; NULL: a method familyd does not serve)
 * and observes now - arrived_ns (metrics_now_ns() when it arrived) in the method's histogram.
 * Any thread; never blocks, never allocates.
 */
void metrics_call_done(const char *path, unsigned status, uint64_t arrived_ns);

/* A registry reload ended (result < 0: failed; the previous registry stays). Any thread. */
void metrics_reload_done(int result);

/* ---- reading them (the scrape thread) ------------------------------------------------------- */

typedef struct MetricsMethod {
        const char *name; /* "familyd.v1.FamilyService/Resolve", "unknown", "other" */
        uint64_t calls[METRICS_STATUS_CODES];
        uint64_t buckets[METRICS_LATENCY_BUCKETS + 1]; /* not cumulative; the last is +Inf */
        uint64_t sum_ns;
} MetricsMethod;

typedef struct MetricsReloads {
        uint64_t ok, failed;
        int64_t last_unix_ms; /* the last reload's end, or the daemon's start */
        bool last_ok;
} MetricsReloads;

/* The upper bound of histogram bucket i (< METRICS_LATENCY_BUCKETS), as the le label. */
const char *metrics_latency_bound(unsigned i);
/* "OK", "INVALID_ARGUMENT", ... for 0 .. METRICS_STATUS_CODES - 1. */
const char *metrics_status_name(unsigned status);

/* Copies the counters of up to max methods that have ended a call; returns how many. */
unsigned metrics_methods_read(MetricsMethod *ret, unsigned max);
void metrics_reloads_read(MetricsReloads *ret);
/* When the daemon started (the first load counts as the last reload until one happens). */
void metrics_mark_start(void);
