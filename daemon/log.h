/* log.h: the daemon's log: stderr with syslog-style level prefixes (the journal when under systemd). */
#pragma once

#include <errno.h>
#include <syslog.h>

#include "macro.h"

void log_set_max_level(int level);
int log_get_max_level(void);

/* Logs and returns -abs(error) (or 0 when error is 0), so `return log_error_errno(r, ...)` works.
 * errno is set to abs(error) for the format, so %m prints it. */
int log_internal(int level, int error, const char *file, int line, const char *func,
                 const char *format, ...) _printf_(6, 7);

#define log_full_errno(level, error, ...) \
        log_internal((level), (error), __FILE__, __LINE__, __func__, __VA_ARGS__)

#define log_debug(...) log_full_errno(LOG_DEBUG, 0, __VA_ARGS__)
#define log_info(...) log_full_errno(LOG_INFO, 0, __VA_ARGS__)
#define log_notice(...) log_full_errno(LOG_NOTICE, 0, __VA_ARGS__)
#define log_warning(...) log_full_errno(LOG_WARNING, 0, __VA_ARGS__)
#define log_error(...) log_full_errno(LOG_ERR, 0, __VA_ARGS__)

#define log_debug_errno(e, ...) log_full_errno(LOG_DEBUG, (e), __VA_ARGS__)
#define log_warning_errno(e, ...) log_full_errno(LOG_WARNING, (e), __VA_ARGS__)
#define log_error_errno(e, ...) log_full_errno(LOG_ERR, (e), __VA_ARGS__)
