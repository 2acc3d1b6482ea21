/* token.c: shard tokens from getrandom(2), and their constant-time comparison. */
#include <fcntl.h>
#include <sys/random.h>

#include "token.h"

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

int shard_token_new(ShardToken *ret) {
        static const char hex[] = "0123456789abcdef";
        uint8_t bytes[SHARD_TOKEN_BYTES];
        ShardToken t;
        int r;

        r = random_bytes(bytes, sizeof bytes);
        if (r < 0)
                return r;

        for (size_t i = 0; i < SHARD_TOKEN_BYTES; i++) {
                t.hex[2 * i] = hex[bytes[i] >> 4];
                t.hex[2 * i + 1] = hex[bytes[i] & 0xf];
        }
        t.hex[SHARD_TOKEN_LENGTH] = 0;
        *ret = t;
        return 0;
}

bool shard_token_is_valid(const char *s) {
        if (!s)
                return false;
        for (size_t i = 0; i < SHARD_TOKEN_LENGTH; i++)
                if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
                        return false; /* also stops at a NUL before the end */
        return s[SHARD_TOKEN_LENGTH] == 0;
}

bool shard_token_equal(const char *known, const char *candidate) {
        if (!known || !candidate)
                return false;

        /* Both are read up to SHARD_TOKEN_LENGTH + 1 bytes, stopping at their NUL: the
         * differences are accumulated, never branched on. */
        unsigned diff = 0;
        bool known_ended = false, candidate_ended = false;
        for (size_t i = 0; i <= SHARD_TOKEN_LENGTH; i++) {
                unsigned char a = known_ended ? 0 : (unsigned char) known[i];
                unsigned char b = candidate_ended ? 0 : (unsigned char) candidate[i];
                diff |= (unsigned) (a ^ b);
                known_ended = known_ended || a == 0;
                candidate_ended = candidate_ended || b == 0;
        }
        /* Equal in the first SHARD_TOKEN_LENGTH + 1 bytes means both ended there. */
        return diff == 0 && known_ended;
}
