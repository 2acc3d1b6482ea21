/* crc32c.c: CRC-32C (Castagnoli), the checksum of state records. */
#include <pthread.h>
#include <stdint.h>

#include "crc32c.h"

/* CRC-32C (Castagnoli, reflected polynomial 0x82f63b78), table-driven. */
static uint32_t crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_table_init(void) {
        for (uint32_t i = 0; i < 256; i++) {
                uint32_t c = i;
                for (unsigned k = 0; k < 8; k++)
                        c = c & 1 ? (c >> 1) ^ UINT32_C(0x82f63b78) : c >> 1;
                crc_table[i] = c;
        }
}

uint32_t crc32c(uint32_t crc, const void *data, size_t n) {
        const uint8_t *p = data;

        (void) pthread_once(&crc_once, crc_table_init);
        crc = ~crc;
        while (n-- > 0)
                crc = crc_table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
        return ~crc;
}
