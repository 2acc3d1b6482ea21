/* random.c: bytes from the kernel's cryptographic generator. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <sys/random.h>
#include <unistd.h>

#include "macro.h"
#include "random.h"

static int urandom_read(uint8_t *p, size_t n) {
        _cleanup_close_ int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC | O_NOCTTY);
        if (fd < 0)
                return -errno;

        while (n > 0) {
                ssize_t k = read(fd, p, n);
                if (k < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                if (k == 0)
                        return -EIO;
                p += k;
                n -= (size_t) k;
        }
        return 0;
}

int random_bytes(void *buf, size_t n) {
        uint8_t *p = buf;
        int flags = GRND_NONBLOCK;

        while (n > 0) {
                ssize_t k = getrandom(p, n, flags);
                if (k < 0) {
                        if (errno == EINTR)
                                continue;
                        /* The pool is not initialised yet: a token must not be guessable, so
                         * wait for it (seconds at most, at early boot only). */
                        if (errno == EAGAIN && flags != 0) {
                                flags = 0;
                                continue;
                        }
                        if (errno == ENOSYS || errno == EPERM) /* old kernel, or a seccomp filter */
                                return urandom_read(p, n);
                        return -errno;
                }
                p += k;
                n -= (size_t) k;
        }
        return 0;
}
