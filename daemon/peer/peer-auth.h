/* peer-auth.h: the bootstrap handshake's proofs of the cluster key, and the session keys they lead to. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "peer-frame.h"
#include "peer-key.h"

#define PEER_NONCE_BYTES 32u
#define PEER_PROOF_BYTES 32u

typedef enum PeerRole {
        PEER_ROLE_DIALER,
        PEER_ROLE_LISTENER,
} PeerRole;

/* One link's session, the same on both ends: its id and a key for each direction. */
typedef struct PeerSessionKeys {
        uint8_t id[PEER_SESSION_ID_BYTES];
        uint8_t dialer_to_listener[PEER_SESSION_KEY_BYTES];
        uint8_t listener_to_dialer[PEER_SESSION_KEY_BYTES];
} PeerSessionKeys;

/* Fills a nonce from libsodium's randombytes. */
void peer_auth_nonce(uint8_t nonce[PEER_NONCE_BYTES]);

/* What `role` sends to prove it holds key: a MAC (crypto_auth) over the role and both nonces
 * (the dialer's first). */
void peer_auth_proof(const uint8_t key[PEER_KEY_BYTES], PeerRole role,
                     const uint8_t dialer_nonce[PEER_NONCE_BYTES],
                     const uint8_t listener_nonce[PEER_NONCE_BYTES], uint8_t ret[PEER_PROOF_BYTES]);

/* Which of keys proof was made with by `role` (an index), or -EACCES: none. */
int peer_auth_verify(const PeerKeys *keys, PeerRole role,
                     const uint8_t dialer_nonce[PEER_NONCE_BYTES],
                     const uint8_t listener_nonce[PEER_NONCE_BYTES],
                     const uint8_t proof[PEER_PROOF_BYTES]);

/* A node's MAC over its own record (codec_peer_record_bytes(): labelled, so it can never pass
 * for a proof or a frame): crypto_auth under key. */
void peer_auth_record_mac(const uint8_t key[PEER_KEY_BYTES], const uint8_t *record, size_t size,
                          uint8_t ret[PEER_PROOF_BYTES]);
/* Which of keys made mac over record (an index), or -EACCES: none. */
int peer_auth_record_verify(const PeerKeys *keys, const uint8_t *record, size_t size,
                            const uint8_t mac[PEER_PROOF_BYTES]);

/* The session both ends derive from the key they proved and both nonces (crypto_generichash
 * keyed with the cluster key; the id unkeyed over the nonces). */
void peer_auth_session(const uint8_t key[PEER_KEY_BYTES],
                       const uint8_t dialer_nonce[PEER_NONCE_BYTES],
                       const uint8_t listener_nonce[PEER_NONCE_BYTES], PeerSessionKeys *ret);
