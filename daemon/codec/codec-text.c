/* codec-text.c: which strings from outside (peers, etcd records) familyd accepts. */
#include "codec-text.h"

bool codec_text_ok(const char *s, size_t max, bool allow_empty) {
        size_t n = 0;

        if (!s)
                return allow_empty;
        for (; s[n]; n++)
                if (n >= max || (unsigned char) s[n] < 0x20 || (unsigned char) s[n] > 0x7e)
                        return false;
        return allow_empty || n > 0;
}
