/* peer-auth.c: the bootstrap handshake's proofs of the cluster key and the session keys they lead to. */

/*
 * DESIGN: libsodium primitives only. Proofs are crypto_auth (HMAC-SHA-512-256) under the
 * cluster key over a label naming the role and both nonces, so a proof made as the listener
 * can never be replayed as the dialer's, nor one link's on another (fresh nonces on both
 * sides). The session keys come from crypto_generichash (BLAKE2b) keyed with the cluster key
 * over a label and both nonces; the session id is BLAKE2b over the nonces without a key (it
 * only names the session, it proves nothing).
 */

#include <errno.h>
#include <stddef.h>
#include <sodium.h>
#include <string.h>

#include "peer-auth.h"

#define LABEL_PROOF_DIALER "familyd peer proof v1: dialer"
#define LABEL_PROOF_LISTENER "familyd peer proof v1: listener"
#define LABEL_SESSION "familyd peer session v1"
#define LABEL_MAX 64u

_Static_assert(crypto_auth_BYTES == PEER_PROOF_BYTES, "a proof is one crypto_auth MAC");
_Static_assert(crypto_auth_KEYBYTES == PEER_KEY_BYTES, "cluster keys are crypto_auth keys");
_Static_assert(2 * PEER_SESSION_KEY_BYTES <= crypto_generichash_BYTES_MAX, "one hash, two keys");

void peer_auth_nonce(uint8_t nonce[PEER_NONCE_BYTES]) {
        randombytes_buf(nonce, PEER_NONCE_BYTES);
}

/* label | dialer nonce | listener nonce */
static size_t transcript(const char *label, const uint8_t *dialer_nonce,
                         const uint8_t *listener_nonce, uint8_t *ret) {
        size_t n = strlen(label);

        memcpy(ret, label, n);
        memcpy(ret + n, dialer_nonce, PEER_NONCE_BYTES);
        memcpy(ret + n + PEER_NONCE_BYTES, listener_nonce, PEER_NONCE_BYTES);
        return n + 2 * PEER_NONCE_BYTES;
}

void peer_auth_proof(const uint8_t key[PEER_KEY_BYTES], PeerRole role,
                     const uint8_t dialer_nonce[PEER_NONCE_BYTES],
                     const uint8_t listener_nonce[PEER_NONCE_BYTES], uint8_t ret[PEER_PROOF_BYTES]) {
        uint8_t t[LABEL_MAX + 2 * PEER_NONCE_BYTES];
        size_t n = transcript(role == PEER_ROLE_DIALER ? LABEL_PROOF_DIALER : LABEL_PROOF_LISTENER,
                              dialer_nonce, listener_nonce, t);

        (void) crypto_auth(ret, t, n, key);
}

int peer_auth_verify(const PeerKeys *keys, PeerRole role,
                     const uint8_t dialer_nonce[PEER_NONCE_BYTES],
                     const uint8_t listener_nonce[PEER_NONCE_BYTES],
                     const uint8_t proof[PEER_PROOF_BYTES]) {
        uint8_t t[LABEL_MAX + 2 * PEER_NONCE_BYTES];
        size_t n = transcript(role == PEER_ROLE_DIALER ? LABEL_PROOF_DIALER : LABEL_PROOF_LISTENER,
                              dialer_nonce, listener_nonce, t);

        for (unsigned i = 0; i < keys->n; i++)
                if (crypto_auth_verify(proof, t, n, keys->keys[i]) == 0)
                        return (int) i;
        return -EACCES;
}

void peer_auth_record_mac(const uint8_t key[PEER_KEY_BYTES], const uint8_t *record, size_t size,
                          uint8_t ret[PEER_PROOF_BYTES]) {
        (void) crypto_auth(ret, record, size, key);
}

int peer_auth_record_verify(const PeerKeys *keys, const uint8_t *record, size_t size,
                            const uint8_t mac[PEER_PROOF_BYTES]) {
        for (unsigned i = 0; i < keys->n; i++)
                if (crypto_auth_verify(mac, record, size, keys->keys[i]) == 0)
                        return (int) i;
        return -EACCES;
}

void peer_auth_session(const uint8_t key[PEER_KEY_BYTES],
                       const uint8_t dialer_nonce[PEER_NONCE_BYTES],
                       const uint8_t listener_nonce[PEER_NONCE_BYTES], PeerSessionKeys *ret) {
        uint8_t t[LABEL_MAX + 2 * PEER_NONCE_BYTES], out[2 * PEER_SESSION_KEY_BYTES];
        size_t n = transcript(LABEL_SESSION, dialer_nonce, listener_nonce, t);

        (void) crypto_generichash(out, sizeof out, t, n, key, PEER_KEY_BYTES);
        memcpy(ret->dialer_to_listener, out, PEER_SESSION_KEY_BYTES);
        memcpy(ret->listener_to_dialer, out + PEER_SESSION_KEY_BYTES, PEER_SESSION_KEY_BYTES);
        sodium_memzero(out, sizeof out);
        (void) crypto_generichash(ret->id, sizeof ret->id, t + strlen(LABEL_SESSION),
                                  2 * PEER_NONCE_BYTES, NULL, 0);
}
