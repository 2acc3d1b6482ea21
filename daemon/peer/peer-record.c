/* peer-record.c: a node's MAC over its own member record: made for ours, checked on relayed ones. */

#include <stdlib.h>

#include "codec/codec-peer.h"
#include "peer-auth.h"
#include "peer-record.h"

_Static_assert(MEMBER_RECORD_MAC_BYTES == PEER_PROOF_BYTES, "a record MAC is one crypto_auth MAC");

int peer_record_sign(const PeerKeys *keys, MemberInfo *record) {
        _cleanup_free_ uint8_t *bytes = NULL;
        size_t size;
        int r;

        record->has_record_mac = false;
        if (!keys || keys->n == 0)
                return 0;
        r = codec_peer_record_bytes(record, &bytes, &size);
        if (r < 0)
                return r;
        peer_auth_record_mac(keys->keys[0], bytes, size, record->record_mac);
        record->has_record_mac = true;
        return 0;
}

bool peer_record_verify(const PeerKeys *keys, const MemberInfo *record) {
        _cleanup_free_ uint8_t *bytes = NULL;
        size_t size;

        if (!keys || keys->n == 0 || !record->has_record_mac ||
            codec_peer_record_bytes(record, &bytes, &size) < 0)
                return false;
        return peer_auth_record_verify(keys, bytes, size, record->record_mac) >= 0;
}
