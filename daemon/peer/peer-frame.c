/* peer-frame.c: seals and opens the MAC'd, numbered frames of an authenticated peer link. */

#include <errno.h>
#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "peer-frame.h"

#define SEQ_AT PEER_SESSION_ID_BYTES
#define MESSAGE_AT (PEER_SESSION_ID_BYTES + 8u)

_Static_assert(crypto_auth_BYTES == 32, "the frame's MAC is 32 bytes");
_Static_assert(crypto_auth_KEYBYTES == PEER_SESSION_KEY_BYTES, "session keys are auth keys");

int peer_frame_seal(const uint8_t key[PEER_SESSION_KEY_BYTES],
                    const uint8_t id[PEER_SESSION_ID_BYTES], uint64_t seq, const uint8_t *message,
                    size_t size, uint8_t **ret, size_t *ret_size) {
        size_t total = size + PEER_FRAME_OVERHEAD;
        uint8_t *f = malloc(total);

        if (!f)
                return -ENOMEM;
        memcpy(f, id, PEER_SESSION_ID_BYTES);
        for (unsigned i = 0; i < 8; i++)
                f[SEQ_AT + i] = (uint8_t) (seq >> (8 * i));
        if (size > 0)
                memcpy(f + MESSAGE_AT, message, size);
        (void) crypto_auth(f + MESSAGE_AT + size, f, MESSAGE_AT + size, key);
        *ret = f;
        *ret_size = total;
        return 0;
}

bool peer_frame_session(const uint8_t *frame, size_t size, const uint8_t **ret_id) {
        if (size < PEER_FRAME_OVERHEAD)
                return false;
        *ret_id = frame;
        return true;
}

/* Whether seq is new to the window; takes it when take is set. */
static bool window_check(PeerReplayWindow *w, uint64_t seq, bool take) {
        if (seq == 0)
                return false;
        if (seq > w->newest) {
                if (take) {
                        uint64_t shift = seq - w->newest;
                        w->seen = shift >= 64 ? 0 : w->seen << shift;
                        w->seen |= 1;
                        w->newest = seq;
                }
                return true;
        }
        uint64_t behind = w->newest - seq;
        if (behind >= PEER_FRAME_WINDOW || (w->seen >> behind) & 1)
                return false;
        if (take)
                w->seen |= (uint64_t) 1 << behind;
        return true;
}

int peer_frame_open(const uint8_t key[PEER_SESSION_KEY_BYTES], PeerReplayWindow *window,
                    const uint8_t *frame, size_t size, const uint8_t **ret, size_t *ret_size) {
        uint64_t seq = 0;

        if (size < PEER_FRAME_OVERHEAD)
                return -EBADMSG;
        size_t message_size = size - PEER_FRAME_OVERHEAD;
        if (crypto_auth_verify(frame + MESSAGE_AT + message_size, frame, MESSAGE_AT + message_size,
                               key) != 0)
                return -EBADMSG;
        for (unsigned i = 0; i < 8; i++)
                seq |= (uint64_t) frame[SEQ_AT + i] << (8 * i);
        if (!window_check(window, seq, false))
                return -EALREADY;
        (void) window_check(window, seq, true);
        *ret = frame + MESSAGE_AT;
        *ret_size = message_size;
        return 0;
}
