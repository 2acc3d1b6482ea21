/* log.c: one line per message on stderr, "<N>" level prefixes when stderr is the journal. */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

static atomic_int max_level = LOG_INFO;

void log_set_max_level(int level) {
        max_level = level;
}

int log_get_max_level(void) {
        return max_level;
}

/* systemd connects stderr to the journal and sets JOURNAL_STREAM; then the kernel-style "<N>"
 * prefix carries the priority. On a terminal, a word is easier to read. */
static bool stderr_is_journal(void) {
        static int cached = -1;
        if (cached < 0)
                cached = getenv("JOURNAL_STREAM") != NULL;
        return cached;
}

static const char *level_word(int level) {
        switch (level) {
        case LOG_DEBUG:
                return "debug";
        case LOG_INFO:
                return "info";
        case LOG_NOTICE:
                return "notice";
        case LOG_WARNING:
                return "warning";
        default:
                return "error";
        }
}

int log_internal(int level, int error, const char *file, int line, const char *func,
                 const char *format, ...) {
        int e = error < 0 ? -error : error;

        if (level <= max_level) {
                char text[2048];
                va_list ap;

                errno = e;
                va_start(ap, format);
                (void) vsnprintf(text, sizeof text, format, ap);
                va_end(ap);

                if (stderr_is_journal())
                        (void) fprintf(stderr, "<%d>%s\n", level, text);
                else if (max_level >= LOG_DEBUG)
                        (void) fprintf(stderr, "familyd: %s: %s (%s:%d %s)\n", level_word(level),
                                       text, file, line, func);
                else
                        (void) fprintf(stderr, "familyd: %s: %s\n", level_word(level), text);
        }

        return -e;
}
