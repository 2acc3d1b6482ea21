/* codec-peer.h: the daemons' membership messages (familyd.v1.PeerMessage) to core structs and back. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "membership/peer-message.h"

/* Decodes and checks untrusted bytes against every limit of resource-limits.h; -EBADMSG when
 * they are not a valid message (nothing is kept), -ENOMEM. */
int codec_peer_decode(const uint8_t *data, size_t size, PeerMessage *ret);
/* Serialises into a malloc'd buffer. */
int codec_peer_encode(const PeerMessage *m, uint8_t **ret, size_t *ret_size);

/* What a node's record MAC covers (PeerMember.record_mac): the label "familyd record v1" and
 * its NUL, then the record as a PeerMember without registry_digest, partial and record_mac.
 * Deterministic: the same record gives the same bytes. malloc'd. */
int codec_peer_record_bytes(const MemberInfo *m, uint8_t **ret, size_t *ret_size);
