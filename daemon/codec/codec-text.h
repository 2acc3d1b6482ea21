/* codec-text.h: which strings from outside (peers, etcd records) familyd accepts: printable ASCII, bounded. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

/* Strings a peer or an etcd record names go into logs and topology replies: true when s is at
 * most max bytes of printable ASCII (0x20-0x7e), non-empty unless allow_empty; NULL counts as
 * empty. */
bool codec_text_ok(const char *s, size_t max, bool allow_empty);
