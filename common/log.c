/* log.c: one message per call: to the journal's sink with fields under systemd, else one stderr line. */

/*
 * DESIGN: whether stderr is the journal is decided the way systemd.exec(5) documents for
 * JOURNAL_STREAM: the service manager sets it to the device and inode of the stream it
 * connected stdout/stderr to, and only when they match fstat(2) of our stderr is the journal
 * really listening there (a shell in a unit that redirects stderr keeps the variable but not
 * the stream). Then lines go as native journal messages with PRIORITY=, MESSAGE=, CODE_*= and
 * the caller's fields; sd_journal_sendv() silently drops messages when the journal socket does
 * not exist, so without it the stream itself carries "<N>"-prefixed lines, which journald
 * reads as the priority. A send that fails falls back to that line too. INVOCATION_ID alone
 * would say "started by systemd" but not where stderr goes.
 *
 * Any thread logs. sd_journal_sendv() is thread-safe; each stderr line is one fprintf on an
 * unbuffered stream, and the target is decided once (a race decides it twice, the same way).
 *
 * This file is libc only: the journal itself is reached through a sink that the systemd adapter
 * installs (sd/journal.c, journal_log_install()); until then a journal target writes the
 * "<N>" lines that journald reads from the stream.
 */

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"

#define LOG_JOURNAL_SOCKET "/run/systemd/journal/socket"
#define LOG_TEXT_MAX 2048

static atomic_int max_level = LOG_INFO;
static atomic_int target = _LOG_TARGET_INVALID;
static _Atomic(LogJournalSink) journal_sink;

void log_set_journal_sink(LogJournalSink sink) {
        atomic_store(&journal_sink, sink);
}

void log_set_max_level(int level) {
        max_level = level;
}

static LogTarget log_detect_target(void) {
        const char *e = getenv("JOURNAL_STREAM");
        unsigned long long dev, ino;
        struct stat st;

        if (!e || sscanf(e, "%llu:%llu", &dev, &ino) != 2)
                return LOG_TARGET_CONSOLE;
        if (fstat(STDERR_FILENO, &st) < 0 || (unsigned long long) st.st_dev != dev ||
            (unsigned long long) st.st_ino != ino)
                return LOG_TARGET_CONSOLE;
        if (access(LOG_JOURNAL_SOCKET, W_OK) < 0)
                return LOG_TARGET_STREAM;
        return LOG_TARGET_JOURNAL;
}

LogTarget log_get_target(void) {
        int t = atomic_load(&target);
        if (t == _LOG_TARGET_INVALID) {
                t = log_detect_target();
                atomic_store(&target, t);
        }
        return t;
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

/* " [KEY=value ...]" for stderr at debug level. */
static void format_fields(const LogField *fields, char *buf, size_t size) {
        size_t used = 0;

        buf[0] = 0;
        for (size_t i = 0; fields && fields[i].key && used < size; i++) {
                if (!fields[i].value)
                        continue;
                int k = snprintf(buf + used, size - used, "%s%s=%s", used == 0 ? " [" : " ",
                                 fields[i].key, fields[i].value);
                if (k < 0)
                        break;
                used += (size_t) k;
        }
        if (used > 0 && used + 2 <= size)
                strcat(buf, "]");
}

int log_internal(int level, int error, const char *file, int line, const char *func,
                 const LogField *fields, const char *format, ...) {
        int e = error < 0 ? -error : error;

        if (level <= max_level) {
                char text[LOG_TEXT_MAX];
                va_list ap;

                errno = e;
                va_start(ap, format);
                (void) vsnprintf(text, sizeof text, format, ap);
                va_end(ap);

                LogTarget t = log_get_target();
                LogJournalSink sink = atomic_load(&journal_sink);
                bool sent = t == LOG_TARGET_JOURNAL && sink &&
                            sink(level, e, file, line, func, fields, text) >= 0;
                if (sent)
                        return -e;
                if (t != LOG_TARGET_CONSOLE)
                        (void) fprintf(stderr, "<%d>%s\n", level, text);
                else if (max_level >= LOG_DEBUG) {
                        char extra[512];
                        format_fields(fields, extra, sizeof extra);
                        (void) fprintf(stderr, "familyd: %s: %s%s (%s:%d %s)\n",
                                       level_word(level), text, extra, file, line, func);
                } else
                        (void) fprintf(stderr, "familyd: %s: %s\n", level_word(level), text);
        }

        return -e;
}
