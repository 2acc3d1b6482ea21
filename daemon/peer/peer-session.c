/* peer-session.c: the authenticated links' sessions, and the identity the caller binds to one. */

/*
 * DESIGN: a session begins when a handshake proves the cluster key (peer-handshake.c); it
 * holds the link's two direction keys, the next number to send and the replay window of what
 * came in. The dialer's lives with its endpoint; the listener's in a table bounded by
 * PEER_MAX_SESSIONS, least recently used out first. The identity bound to a session (the one
 * start of one node the protocol believed on it) is what peer_ucx_reply_bound() reports.
 */

#include <sodium.h>
#include <stdlib.h>
#include <string.h>

#include "peer-ucx-internal.h"

/* --- sessions --- */

/* A session begins when a handshake proves the key; the dialer's lives with its endpoint, the
 * listener's until max_listener_sessions newer or more recently used ones push it out. */
PeerSession *peer_session_new(PeerUcx *u, const PeerSessionKeys *keys, PeerRole role) {
        PeerSession *s = calloc(1, sizeof *s);

        if (!s)
                return NULL;
        s->keys = *keys;
        s->role = role;
        s->next_seq = 1;
        if (role == PEER_ROLE_LISTENER && u->n_listener_sessions >= u->max_listener_sessions) {
                PeerSession **oldest = NULL;
                for (PeerSession **p = &u->sessions; *p; p = &(*p)->next)
                        if ((*p)->role == PEER_ROLE_LISTENER)
                                oldest = p;
                if (oldest)
                        peer_session_free(u, *oldest);
        }
        if (role == PEER_ROLE_LISTENER)
                u->n_listener_sessions++;
        s->next = u->sessions;
        u->sessions = s;
        return s;
}

void peer_session_free(PeerUcx *u, PeerSession *s) {
        if (!s)
                return;
        for (PeerSession **p = &u->sessions; *p; p = &(*p)->next)
                if (*p == s) {
                        *p = s->next;
                        break;
                }
        if (s->role == PEER_ROLE_LISTENER)
                u->n_listener_sessions--;
        free(s->bound_name);
        sodium_memzero(s, sizeof *s);
        free(s);
}

/* The session a frame names, moved to the front (most recently used). */
PeerSession *peer_session_find(PeerUcx *u, const uint8_t *id) {
        for (PeerSession **p = &u->sessions; *p; p = &(*p)->next) {
                PeerSession *s = *p;
                /* The id names the session, it proves nothing: the MAC does. */
                if (memcmp(s->keys.id, id, PEER_SESSION_ID_BYTES) != 0)
                        continue;
                *p = s->next;
                s->next = u->sessions;
                u->sessions = s;
                return s;
        }
        return NULL;
}

const uint8_t *peer_session_send_key(const PeerSession *s) {
        return s->role == PEER_ROLE_DIALER ? s->keys.dialer_to_listener : s->keys.listener_to_dialer;
}

const uint8_t *peer_session_receive_key(const PeerSession *s) {
        return s->role == PEER_ROLE_DIALER ? s->keys.listener_to_dialer : s->keys.dialer_to_listener;
}

const char *peer_ucx_reply_bound(PeerUcx *u, void *reply, uint64_t *ret_boot_id) {
        PeerReplyTo *to = reply;
        PeerSession *s = to ? to->session : NULL;

        if (!s || !s->bound_name)
                return NULL;
        *ret_boot_id = s->bound_boot;
        return s->bound_name;
}

int peer_ucx_reply_bind(PeerUcx *u, void *reply, const char *name, uint64_t boot_id) {
        PeerReplyTo *to = reply;
        PeerSession *s = to ? to->session : NULL;

        if (!s || s->bound_name)
                return 0;
        s->bound_name = strdup(name);
        if (!s->bound_name)
                return -ENOMEM;
        s->bound_boot = boot_id;
        return 0;
}

