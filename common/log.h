/* log.h: the daemon's log: the journal with structured fields under systemd, else stderr. */
#pragma once

#include <errno.h>
#include <syslog.h>

#include "macro.h"

void log_set_max_level(int level);

/* Where lines go, decided once from the environment (log.c says how). */
typedef enum LogTarget {
        LOG_TARGET_CONSOLE, /* stderr, "familyd: LEVEL: text" */
        LOG_TARGET_STREAM,  /* stderr is the journal's stream: "<N>text" */
        LOG_TARGET_JOURNAL, /* sd_journal_sendv() with fields; "<N>text" on stderr if it fails */
        _LOG_TARGET_MAX,
        _LOG_TARGET_INVALID = -1,
} LogTarget;

LogTarget log_get_target(void);

/* One extra journal field: key in upper case ([A-Z0-9_], no leading underscore). A NULL value
 * leaves the field out, so optional fields need no branches at the call site. */
typedef struct LogField {
        const char *key;
        const char *value;
} LogField;

#define LOG_FIELD(k, v) { .key = (k), .value = (v) }
/* A terminated list for log_struct(): LOG_FIELDS(LOG_FIELD("BUILD_ID", id), ...). */
#define LOG_FIELDS(...) ((const LogField[]) { __VA_ARGS__, { NULL, NULL } })

/* At most this many of a message's fields reach the journal. */
#define LOG_MAX_FIELDS 16

/* Sends one message to the journal: 0 when sent, negative when the caller should write stderr.
 * text is formatted; error is positive or 0. */
typedef int (*LogJournalSink)(int level, int error, const char *file, int line, const char *func,
                              const LogField *fields, const char *text);

/* Installed by the systemd adapter (sd/journal.c); NULL (the default) writes "<N>" lines to
 * stderr where the target is the journal. */
void log_set_journal_sink(LogJournalSink sink);

/* The fields familyd attaches (journalctl BUILD_ID=bld-... finds every line of one build). */
#define LOG_FIELD_FAMILY "FAMILY"
#define LOG_FIELD_BUILD_ID "BUILD_ID"
#define LOG_FIELD_MESH_ID "MESH_ID"
#define LOG_FIELD_PEER "PEER"

/* Logs and returns -abs(error) (or 0 when error is 0), so `return log_error_errno(r, ...)` works.
 * errno is set to abs(error) for the format, so %m prints it. fields may be NULL. */
int log_internal(int level, int error, const char *file, int line, const char *func,
                 const LogField *fields, const char *format, ...) _printf_(7, 8);

#define log_full_errno(level, error, ...) \
        log_internal((level), (error), __FILE__, __LINE__, __func__, NULL, __VA_ARGS__)

/* With journal fields: log_struct(LOG_INFO, 0, LOG_FIELDS(LOG_FIELD(LOG_FIELD_BUILD_ID, id)),
 * "Build %s created.", id). On stderr the fields show only at --log-level debug. */
#define log_struct(level, error, fields, ...) \
        log_internal((level), (error), __FILE__, __LINE__, __func__, (fields), __VA_ARGS__)

#define log_debug(...) log_full_errno(LOG_DEBUG, 0, __VA_ARGS__)
#define log_info(...) log_full_errno(LOG_INFO, 0, __VA_ARGS__)
#define log_notice(...) log_full_errno(LOG_NOTICE, 0, __VA_ARGS__)
#define log_warning(...) log_full_errno(LOG_WARNING, 0, __VA_ARGS__)
#define log_error(...) log_full_errno(LOG_ERR, 0, __VA_ARGS__)

#define log_debug_errno(e, ...) log_full_errno(LOG_DEBUG, (e), __VA_ARGS__)
#define log_warning_errno(e, ...) log_full_errno(LOG_WARNING, (e), __VA_ARGS__)
#define log_error_errno(e, ...) log_full_errno(LOG_ERR, (e), __VA_ARGS__)
