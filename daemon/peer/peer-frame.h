/* peer-frame.h: the session id, sequence number and MAC around every message of an authenticated peer link. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * A frame: session id (16 bytes) | sequence number (8, little-endian) | message | MAC (32).
 * The MAC is libsodium's crypto_auth (HMAC-SHA-512-256) under the session key of the
 * direction, over everything before it.
 */
#define PEER_SESSION_ID_BYTES 16u
#define PEER_SESSION_KEY_BYTES 32u
#define PEER_FRAME_OVERHEAD (PEER_SESSION_ID_BYTES + 8u + 32u)
/* How far behind the newest sequence number a message may arrive (reordering). */
#define PEER_FRAME_WINDOW 64u

/* What a receiver remembers of one direction of a session: the newest sequence number and
 * which of the PEER_FRAME_WINDOW before it have arrived. */
typedef struct PeerReplayWindow {
        uint64_t newest; /* 0: nothing yet (sequence numbers start at 1) */
        uint64_t seen;   /* bit i: newest - i arrived */
} PeerReplayWindow;

/* Wraps message into a malloc'd frame. seq: the sender's next number, from 1. */
int peer_frame_seal(const uint8_t key[PEER_SESSION_KEY_BYTES],
                    const uint8_t id[PEER_SESSION_ID_BYTES], uint64_t seq, const uint8_t *message,
                    size_t size, uint8_t **ret, size_t *ret_size);

/* The session a frame names; false if it is too short to be one. */
bool peer_frame_session(const uint8_t *frame, size_t size, const uint8_t **ret_id);

/*
 * Checks a frame of the session whose receiving key and window these are: -EBADMSG when it is
 * too short or its MAC is wrong, -EALREADY when its sequence number arrived before or is
 * PEER_FRAME_WINDOW or more behind the newest (the window is unchanged either way); else 0,
 * the window takes the number, and ret/ret_size point at the message inside the frame.
 */
int peer_frame_open(const uint8_t key[PEER_SESSION_KEY_BYTES], PeerReplayWindow *window,
                    const uint8_t *frame, size_t size, const uint8_t **ret, size_t *ret_size);
