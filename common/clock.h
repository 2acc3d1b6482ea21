/* clock.h: the two clocks in milliseconds: CLOCK_MONOTONIC for timers, CLOCK_REALTIME for the wire. */
#pragma once

#include <stdint.h>
#include <time.h>

static inline int64_t clock_ms(clockid_t id) {
        struct timespec ts;

        (void) clock_gettime(id, &ts);
        return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline int64_t now_ms(void) {
        return clock_ms(CLOCK_MONOTONIC);
}

static inline int64_t now_unix_ms(void) {
        return clock_ms(CLOCK_REALTIME);
}
