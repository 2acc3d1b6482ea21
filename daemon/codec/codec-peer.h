/* codec-peer.h: the daemons' membership messages (familyd.v1.PeerMessage) to core structs and back. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "core/membership.h"

typedef enum PeerBody {
        PEER_HEARTBEAT,
        PEER_HELLO,    /* first message on a new link: the sender's whole member table */
        PEER_ANNOUNCE, /* members that joined or restarted */
        PEER_FORGET,
        PEER_REFUSE,
        PEER_WHO,      /* the sender does not know the receiver's start: answer with a hello */
        _PEER_BODY_MAX,
        _PEER_BODY_INVALID = -EINVAL,
} PeerBody;

typedef struct PeerKnown {
        MemberInfo info;
        uint64_t age_ms;
} PeerKnown;

typedef struct PeerMessage {
        PeerBody body;
        MemberInfo sender;
        uint64_t version;
        PeerKnown *members; /* hello, announce */
        size_t n_members;
        char *forget_name; /* forget */
        uint64_t forget_boot_id;
        char *reason; /* refuse */
} PeerMessage;

void peer_message_done(PeerMessage *m);

/* Decodes and checks untrusted bytes against every limit of resource-limits.h; -EBADMSG when
 * they are not a valid message (nothing is kept), -ENOMEM. */
int codec_peer_decode(const uint8_t *data, size_t size, PeerMessage *ret);
/* Serialises into a malloc'd buffer. */
int codec_peer_encode(const PeerMessage *m, uint8_t **ret, size_t *ret_size);
