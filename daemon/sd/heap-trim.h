/* heap-trim.h: freed heap returned to the system from the main loop, once it is worth it. */
#pragma once

#include <stdint.h>
#include <systemd/sd-event.h>

/* How often the loop looks, and how much free heap makes a trim worth it. glibc keeps freed
 * memory in its arenas (a flood's connections, gone, held +40 MiB to +1.7 GiB measured). */
#define HEAP_TRIM_PERIOD_USEC (1000ull * 1000ull)
#define HEAP_TRIM_MIN_FREE_BYTES (8ull << 20)

typedef struct HeapTrim HeapTrim;

/* Adds the timer to the main loop; the returned object owns the source and must be freed
 * before event. */
int heap_trim_attach(sd_event *event, HeapTrim **ret);
HeapTrim *heap_trim_free(HeapTrim *h);
