/* peer-record.h: a node's MAC over its own member record: made for ours, checked on relayed ones. */
#pragma once

/*
 * DESIGN: with a cluster key, a daemon MACs its own record (name, node rank, address, boot id,
 * start, devices: codec_peer_record_bytes()) with the first key, and its hellos carry the MAC
 * (PeerMember.record_mac). Other members relay the record in their tables; a receiver that
 * verifies the MAC under any key it holds may take the record as the node's own word
 * (MemberInfo.proven: a restart believed though the node could not tell it itself). Without a
 * key nothing is made or proven.
 */

#include <stdbool.h>

#include "membership/membership.h"
#include "peer-key.h"

/* Sets record->record_mac with keys->keys[0] (no key: clears it). -ENOMEM only. */
int peer_record_sign(const PeerKeys *keys, MemberInfo *record);
/* Whether record carries a MAC one of keys made over it. */
bool peer_record_verify(const PeerKeys *keys, const MemberInfo *record);
