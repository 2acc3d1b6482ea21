/* journal.c: the log's journal sink: one native journal message with the caller's fields. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#define SD_JOURNAL_SUPPRESS_LOCATION
#include <systemd/sd-journal.h>

#include "journal.h"

/* 0 when sent; negative when the journal refused and the caller should write stderr. */
static int journal_send(int level, int error, const char *file, int line, const char *func,
                        const LogField *fields, const char *text) {
        struct iovec iov[8 + LOG_MAX_FIELDS];
        char *owned[8 + LOG_MAX_FIELDS] = {};
        size_t n = 0, n_owned = 0;
        int r = 0;

#define ADD_FIELD(...)                                                             \
        do {                                                                       \
                char *_s_ = NULL;                                                  \
                if (asprintf(&_s_, __VA_ARGS__) < 0) {                             \
                        r = -ENOMEM;                                               \
                        goto finish;                                               \
                }                                                                  \
                owned[n_owned++] = _s_;                                            \
                iov[n++] = (struct iovec) { .iov_base = _s_, .iov_len = strlen(_s_) }; \
        } while (0)

        ADD_FIELD("PRIORITY=%d", level);
        ADD_FIELD("MESSAGE=%s", text);
        ADD_FIELD("SYSLOG_IDENTIFIER=familyd");
        ADD_FIELD("CODE_FILE=%s", file);
        ADD_FIELD("CODE_LINE=%d", line);
        ADD_FIELD("CODE_FUNC=%s", func);
        if (error != 0)
                ADD_FIELD("ERRNO=%d", error);
        for (size_t i = 0; fields && fields[i].key && i < LOG_MAX_FIELDS; i++)
                if (fields[i].value)
                        ADD_FIELD("%s=%s", fields[i].key, fields[i].value);
#undef ADD_FIELD

        r = sd_journal_sendv(iov, (int) n);
finish:
        for (size_t i = 0; i < n_owned; i++)
                free(owned[i]);
        return r;
}

void journal_log_install(void) {
        log_set_journal_sink(journal_send);
}
