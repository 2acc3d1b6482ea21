/* heap-trim.c: freed heap returned to the system from the main loop, once it is worth it. */

/*
 * DESIGN: gRPC frees what a connection held (its calls, queued frames, read buffers) when the
 * connection closes, but glibc keeps the freed pages in its arenas, one per thread that
 * allocated, and most of them are never reused by the same arena: a flood of HTTP/2 frames on
 * connections since closed left the RSS gigabytes above where it started. gRPC never says when
 * it closes a connection, so the main loop looks once a period at how much of the heap is free
 * (mallinfo2, over every arena) and trims when that passes HEAP_TRIM_MIN_FREE_BYTES. A trim
 * of a heap with little free costs nothing it needs to: the check keeps idle daemons idle.
 * Under AddressSanitizer mallinfo2 reports nothing and the sanitizer's allocator returns
 * memory by its own options.
 */

#include <malloc.h>
#include <stdlib.h>

#include "common/log.h"
#include "common/macro.h"
#include "heap-trim.h"

struct HeapTrim {
        sd_event_source *timer;
};

static int heap_trim_on_timer(sd_event_source *source, uint64_t usec, void *userdata) {
        struct mallinfo2 mi = mallinfo2();
        int r;

        if (mi.fordblks >= HEAP_TRIM_MIN_FREE_BYTES) {
                int released = malloc_trim(0);
                log_debug("Heap trimmed: %zu bytes were free (%s).", mi.fordblks,
                          released ? "memory returned" : "nothing to return");
        }
        r = sd_event_source_set_time_relative(source, HEAP_TRIM_PERIOD_USEC);
        if (r < 0)
                log_warning_errno(r, "Failed to re-arm the heap trim timer, ignoring: %m");
        return 0;
}

int heap_trim_attach(sd_event *event, HeapTrim **ret) {
        HeapTrim *h;
        int r;

        h = calloc(1, sizeof *h);
        if (!h)
                return -ENOMEM;
        r = sd_event_add_time_relative(event, &h->timer, CLOCK_MONOTONIC, HEAP_TRIM_PERIOD_USEC,
                                       HEAP_TRIM_PERIOD_USEC / 10, heap_trim_on_timer, NULL);
        if (r >= 0)
                /* On, not one-shot: each expiry sets the next. */
                r = sd_event_source_set_enabled(h->timer, SD_EVENT_ON);
        if (r < 0) {
                heap_trim_free(h);
                return r;
        }
        *ret = h;
        return 0;
}

HeapTrim *heap_trim_free(HeapTrim *h) {
        if (!h)
                return NULL;
        sd_event_source_disable_unref(h->timer);
        return mfree(h);
}
