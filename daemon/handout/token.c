/* token.c: shard tokens from getrandom(2), and their constant-time comparison. */
#include "common/random.h"
#include "token.h"

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
