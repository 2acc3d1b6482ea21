/* error.c: filling and releasing FamilyError. */
#include <stdio.h>

#include "error.h"

int family_error_setv(FamilyError *e, FamilyStatus status, const char *reason, const char *field,
                      const char *format, va_list ap) {
        if (!e)
                return -EINVAL;

        family_error_done(e);

        char *message = NULL;
        if (vasprintf(&message, format, ap) < 0)
                return -ENOMEM;

        char *f = NULL;
        if (field) {
                f = strdup(field);
                if (!f) {
                        free(message);
                        return -ENOMEM;
                }
        }

        *e = (FamilyError) {
                .status = status,
                .reason = reason,
                .field = f,
                .message = message,
        };
        return -EINVAL;
}

int family_error_set(FamilyError *e, FamilyStatus status, const char *reason, const char *field,
                     const char *format, ...) {
        va_list ap;
        va_start(ap, format);
        int r = family_error_setv(e, status, reason, field, format, ap);
        va_end(ap);
        return r;
}

void family_error_done(FamilyError *e) {
        if (!e)
                return;
        free(e->field);
        free(e->message);
        *e = FAMILY_ERROR_NULL;
}

static const char *const status_table[_FAMILY_STATUS_MAX] = {
        [FAMILY_STATUS_OK] = "OK",
        [FAMILY_STATUS_CANCELLED] = "CANCELLED",
        [FAMILY_STATUS_UNKNOWN] = "UNKNOWN",
        [FAMILY_STATUS_INVALID_ARGUMENT] = "INVALID_ARGUMENT",
        [FAMILY_STATUS_DEADLINE_EXCEEDED] = "DEADLINE_EXCEEDED",
        [FAMILY_STATUS_NOT_FOUND] = "NOT_FOUND",
        [FAMILY_STATUS_ALREADY_EXISTS] = "ALREADY_EXISTS",
        [FAMILY_STATUS_PERMISSION_DENIED] = "PERMISSION_DENIED",
        [FAMILY_STATUS_RESOURCE_EXHAUSTED] = "RESOURCE_EXHAUSTED",
        [FAMILY_STATUS_FAILED_PRECONDITION] = "FAILED_PRECONDITION",
        [FAMILY_STATUS_ABORTED] = "ABORTED",
        [FAMILY_STATUS_OUT_OF_RANGE] = "OUT_OF_RANGE",
        [FAMILY_STATUS_UNIMPLEMENTED] = "UNIMPLEMENTED",
        [FAMILY_STATUS_INTERNAL] = "INTERNAL",
        [FAMILY_STATUS_UNAVAILABLE] = "UNAVAILABLE",
};

const char *family_status_to_string(FamilyStatus s) {
        if (s < 0 || s >= _FAMILY_STATUS_MAX)
                return NULL;
        return status_table[s];
}

FamilyStatus family_status_from_string(const char *s) {
        if (!s)
                return _FAMILY_STATUS_INVALID;
        for (FamilyStatus i = 0; i < _FAMILY_STATUS_MAX; i++)
                if (streq(status_table[i], s))
                        return i;
        return _FAMILY_STATUS_INVALID;
}

int family_error_truncate(FamilyError *e, size_t max) {
        char suffix[64];
        size_t len, cut, room;

        if (!e || !e->message || max < 64)
                return 0;
        len = strlen(e->message);
        if (len <= max)
                return 0;

        /* Leave room for the suffix, then prefer a whole line. */
        room = max - sizeof suffix;
        cut = room;
        while (cut > 0 && e->message[cut] != '\n')
                cut--;
        if (cut > 0) {
                size_t lines = 1;
                for (const char *p = e->message + cut + 1; *p; p++)
                        if (*p == '\n' && p[1])
                                lines++;
                (void) snprintf(suffix, sizeof suffix, "\n... (%zu more line%s)", lines,
                                lines == 1 ? "" : "s");
        } else {
                cut = room;
                /* Never split a UTF-8 sequence: back up over continuation bytes. */
                while (cut > 0 && ((unsigned char) e->message[cut] & 0xC0) == 0x80)
                        cut--;
                (void) snprintf(suffix, sizeof suffix, "...");
        }

        char *m = malloc(cut + strlen(suffix) + 1);
        if (!m)
                return -ENOMEM;
        memcpy(m, e->message, cut);
        strcpy(m + cut, suffix);
        free(e->message);
        e->message = m;
        return 0;
}
