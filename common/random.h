/* random.h: bytes from the kernel's cryptographic generator. */
#pragma once

#include <stddef.h>

/*
 * Fills buf with bytes from the kernel's cryptographic generator (getrandom(2)). Before the
 * pool is initialised (early boot) it waits for it rather than hand out guessable bytes; on a
 * kernel without getrandom it reads /dev/urandom. 0 or a negative errno.
 */
int random_bytes(void *buf, size_t n);
