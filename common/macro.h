/* macro.h: cleanup attributes, ownership moves and small helpers shared by all of familyd. */
#pragma once

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define _cleanup_(f) __attribute__((cleanup(f)))
#define _unused_ __attribute__((unused))
#define _printf_(a, b) __attribute__((format(printf, a, b)))
#define _warn_unused_result_ __attribute__((warn_unused_result))

#define ELEMENTSOF(x) (sizeof(x) / sizeof((x)[0]))

/* Moves ownership out of a cleanup-attributed local: the local becomes NULL. */
#define TAKE_PTR(p)                                  \
        ({                                           \
                __typeof__(p) *_pp_ = &(p);          \
                __typeof__(p) _p_ = *_pp_;           \
                *_pp_ = NULL;                        \
                _p_;                                 \
        })

#define TAKE_FD(fd)                                  \
        ({                                           \
                int *_fdp_ = &(fd);                  \
                int _fd_ = *_fdp_;                   \
                *_fdp_ = -1;                         \
                _fd_;                                \
        })

/* Defines name##p(type **) calling func(*p); func must accept NULL. */
#define DEFINE_TRIVIAL_CLEANUP_FUNC(type, func)      \
        static inline void func##p(type *p) {        \
                if (*p)                              \
                        func(*p);                    \
        }

static inline void freep(void *p) {
        free(*(void **) p);
}
#define _cleanup_free_ _cleanup_(freep)

static inline int safe_close(int fd) {
        if (fd >= 0) {
                int saved = errno;
                (void) close(fd);
                errno = saved;
        }
        return -1;
}

static inline void closep(int *fd) {
        (void) safe_close(*fd);
}
#define _cleanup_close_ _cleanup_(closep)

static inline bool streq(const char *a, const char *b) {
        return strcmp(a, b) == 0;
}

static inline bool streq_ptr(const char *a, const char *b) {
        if (!a || !b)
                return a == b;
        return strcmp(a, b) == 0;
}

static inline const char *strempty(const char *s) {
        return s ? s : "";
}

static inline bool isempty(const char *s) {
        return !s || !*s;
}

/* Frees *p and sets it to NULL; returns NULL so it can end a destructor. */
#define mfree(p)                                     \
        ({                                           \
                free(p);                             \
                (__typeof__(p)) NULL;                \
        })

/* Grows a heap array to hold at least need elements, doubling. Returns false on OOM. */
bool greedy_realloc(void **p, size_t *allocated, size_t need, size_t size);
#define GREEDY_REALLOC(array, allocated, need) \
        greedy_realloc((void **) &(array), &(allocated), (need), sizeof((array)[0]))

#define container_of(ptr, type, member) ((type *) ((char *) (ptr) - offsetof(type, member)))

#define MIN(a, b)                                    \
        ({                                           \
                __typeof__(a) _a_ = (a);             \
                __typeof__(b) _b_ = (b);             \
                _a_ < _b_ ? _a_ : _b_;               \
        })

#define MAX(a, b)                                    \
        ({                                           \
                __typeof__(a) _x_ = (a);             \
                __typeof__(b) _y_ = (b);             \
                _x_ > _y_ ? _x_ : _y_;               \
        })
