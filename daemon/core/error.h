/* error.h: FamilyError, the user-facing failure a core function fills in for its caller. */
#pragma once

#include <stdarg.h>

#include "common/macro.h"

/* Numerically equal to gRPC status codes, so adapters pass them through unchanged. */
typedef enum FamilyStatus {
        FAMILY_STATUS_OK = 0,
        FAMILY_STATUS_CANCELLED = 1,
        FAMILY_STATUS_UNKNOWN = 2,
        FAMILY_STATUS_INVALID_ARGUMENT = 3,
        FAMILY_STATUS_DEADLINE_EXCEEDED = 4,
        FAMILY_STATUS_NOT_FOUND = 5,
        FAMILY_STATUS_ALREADY_EXISTS = 6,
        FAMILY_STATUS_PERMISSION_DENIED = 7,
        FAMILY_STATUS_RESOURCE_EXHAUSTED = 8,
        FAMILY_STATUS_FAILED_PRECONDITION = 9,
        FAMILY_STATUS_ABORTED = 10,
        FAMILY_STATUS_OUT_OF_RANGE = 11,
        FAMILY_STATUS_UNIMPLEMENTED = 12,
        FAMILY_STATUS_INTERNAL = 13,
        FAMILY_STATUS_UNAVAILABLE = 14,
        _FAMILY_STATUS_MAX,
        _FAMILY_STATUS_INVALID = -EINVAL,
} FamilyStatus;

/*
 * A user-facing failure: status class, an upper-case reason code (docs/semantics.md, e.g.
 * "UNKNOWN_FAMILY"), optionally the field or axis it concerns, and the exact message text of
 * docs/semantics.md.
 * Caller-owned; zero-initialise it, release with family_error_done().
 */
typedef struct FamilyError {
        FamilyStatus status;
        const char *reason; /* static string */
        char *field;        /* may be NULL */
        char *message;      /* NULL while unset */
} FamilyError;

#define FAMILY_ERROR_NULL ((FamilyError) { .status = FAMILY_STATUS_OK })

/*
 * Fills *e (if e is not NULL, replacing anything it held) and returns -EINVAL, so a core function
 * can `return family_error_set(ret_error, ...);`. Returns -ENOMEM if the text cannot be allocated.
 */
int family_error_set(FamilyError *e, FamilyStatus status, const char *reason, const char *field,
                     const char *format, ...) _printf_(5, 6);
int family_error_setv(FamilyError *e, FamilyStatus status, const char *reason, const char *field,
                      const char *format, va_list ap) _printf_(5, 0);

void family_error_done(FamilyError *e);
static inline bool family_error_is_set(const FamilyError *e) {
        return e && e->message;
}

const char *family_status_to_string(FamilyStatus s);  /* "INVALID_ARGUMENT" */
FamilyStatus family_status_from_string(const char *s);

/* Cuts e->message to at most max bytes (max >= 64): at the last line break that fits, followed
 * by "\n... (N more lines)", else at a UTF-8 boundary followed by "...". 0 or -ENOMEM. */
int family_error_truncate(FamilyError *e, size_t max);
