/* crc32c.h: CRC-32C (Castagnoli, reflected polynomial 0x82f63b78). */
#pragma once

#include <stddef.h>
#include <stdint.h>

/* Continues crc over n bytes of data; start with 0. crc32c(0, "123456789", 9) == 0xe3069283. */
uint32_t crc32c(uint32_t crc, const void *data, size_t n);
