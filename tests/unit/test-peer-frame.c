/* test-peer-frame.c: the MAC'd, numbered frames of peer links, the handshake's proofs and the key file. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "peer/peer-auth.h"
#include "peer/peer-frame.h"
#include "peer/peer-key.h"

static const uint8_t KEY[PEER_SESSION_KEY_BYTES] = { 1, 2, 3, 4, 5, 6, 7, 8, 9 };
static const uint8_t OTHER_KEY[PEER_SESSION_KEY_BYTES] = { 9, 8, 7 };
static const uint8_t ID[PEER_SESSION_ID_BYTES] = { 0xaa, 0xbb, 0xcc };
static const uint8_t MESSAGE[] = "a heartbeat's bytes";

static uint8_t *seal(uint64_t seq, size_t *ret_size) {
        uint8_t *f = NULL;

        assert_int_equal(peer_frame_seal(KEY, ID, seq, MESSAGE, sizeof MESSAGE, &f, ret_size), 0);
        assert_int_equal(*ret_size, sizeof MESSAGE + PEER_FRAME_OVERHEAD);
        return f;
}

/* 0, -EBADMSG or -EALREADY for frame seq opened against window. */
static int open_seq(PeerReplayWindow *w, uint64_t seq) {
        const uint8_t *m;
        size_t size, msize;
        uint8_t *f = seal(seq, &size);
        int r = peer_frame_open(KEY, w, f, size, &m, &msize);

        if (r == 0) {
                assert_int_equal(msize, sizeof MESSAGE);
                assert_memory_equal(m, MESSAGE, sizeof MESSAGE);
        }
        free(f);
        return r;
}

static void test_mac_ok(void **state) {
        PeerReplayWindow w = {};
        const uint8_t *id, *m;
        size_t size, msize;
        uint8_t *f = seal(1, &size);

        assert_true(peer_frame_session(f, size, &id));
        assert_memory_equal(id, ID, sizeof ID);
        assert_int_equal(peer_frame_open(KEY, &w, f, size, &m, &msize), 0);
        assert_int_equal(msize, sizeof MESSAGE);
        assert_memory_equal(m, MESSAGE, sizeof MESSAGE);
        assert_int_equal(w.newest, 1);
        free(f);

        /* An empty message is a frame too. */
        assert_int_equal(peer_frame_seal(KEY, ID, 2, NULL, 0, &f, &size), 0);
        assert_int_equal(peer_frame_open(KEY, &w, f, size, &m, &msize), 0);
        assert_int_equal(msize, 0);
        free(f);
}

/* Every byte matters: the id, the number, the message and the MAC itself. */
static void test_tampered(void **state) {
        size_t size;
        uint8_t *f = seal(1, &size);

        for (size_t i = 0; i < size; i++) {
                PeerReplayWindow w = {};
                const uint8_t *m;
                size_t msize;

                f[i] ^= 0x01;
                assert_int_equal(peer_frame_open(KEY, &w, f, size, &m, &msize), -EBADMSG);
                assert_int_equal(w.newest, 0); /* a refused frame leaves the window alone */
                f[i] ^= 0x01;
        }
        PeerReplayWindow w = {};
        const uint8_t *m;
        size_t msize;
        assert_int_equal(peer_frame_open(OTHER_KEY, &w, f, size, &m, &msize), -EBADMSG);
        assert_int_equal(peer_frame_open(KEY, &w, f, size - 1, &m, &msize), -EBADMSG);
        assert_int_equal(peer_frame_open(KEY, &w, f, PEER_FRAME_OVERHEAD - 1, &m, &msize),
                         -EBADMSG);
        assert_false(peer_frame_session(f, PEER_FRAME_OVERHEAD - 1, &m));
        assert_int_equal(peer_frame_open(KEY, &w, f, size, &m, &msize), 0);
        free(f);
}

static void test_replayed(void **state) {
        PeerReplayWindow w = {};

        assert_int_equal(open_seq(&w, 1), 0);
        assert_int_equal(open_seq(&w, 1), -EALREADY);
        assert_int_equal(open_seq(&w, 2), 0);
        assert_int_equal(open_seq(&w, 2), -EALREADY);
        assert_int_equal(open_seq(&w, 1), -EALREADY);
        /* Sequence numbers start at 1: 0 is never valid. */
        assert_int_equal(open_seq(&w, 0), -EALREADY);
}

static void test_reordered(void **state) {
        PeerReplayWindow w = {};

        assert_int_equal(open_seq(&w, 10), 0);
        /* Late but within the window: taken once each. */
        assert_int_equal(open_seq(&w, 7), 0);
        assert_int_equal(open_seq(&w, 9), 0);
        assert_int_equal(open_seq(&w, 7), -EALREADY);
        assert_int_equal(open_seq(&w, 8), 0);
        /* A jump ahead moves the window: what was seen stays seen. */
        assert_int_equal(open_seq(&w, 10 + PEER_FRAME_WINDOW - 1), 0);
        assert_int_equal(open_seq(&w, 10), -EALREADY);
        assert_int_equal(open_seq(&w, 11), 0);
        /* Beyond the window: refused, seen or not. */
        assert_int_equal(open_seq(&w, 9), -EALREADY);
        assert_int_equal(open_seq(&w, 2), -EALREADY);
        uint64_t newest = w.newest;
        assert_int_equal(open_seq(&w, newest + 1000), 0);
        assert_int_equal(open_seq(&w, newest + 1000 - PEER_FRAME_WINDOW), -EALREADY);
        assert_int_equal(open_seq(&w, newest + 1000 - PEER_FRAME_WINDOW + 1), 0);
        assert_int_equal(open_seq(&w, newest), -EALREADY);
}

static void fill_keys(PeerKeys *k, unsigned n, uint8_t first) {
        *k = (PeerKeys) { .n = n };
        for (unsigned i = 0; i < n; i++)
                memset(k->keys[i], first + i, PEER_KEY_BYTES);
}

static void test_proofs(void **state) {
        uint8_t nd[PEER_NONCE_BYTES], nl[PEER_NONCE_BYTES], proof[PEER_PROOF_BYTES];
        PeerKeys a, ab, b;

        peer_auth_nonce(nd);
        peer_auth_nonce(nl);
        assert_memory_not_equal(nd, nl, sizeof nd);
        fill_keys(&a, 1, 0x10);
        fill_keys(&ab, 2, 0x0f); /* 0x0f, then 0x10 (= a) */
        fill_keys(&b, 1, 0x0f);

        peer_auth_proof(a.keys[0], PEER_ROLE_DIALER, nd, nl, proof);
        assert_int_equal(peer_auth_verify(&a, PEER_ROLE_DIALER, nd, nl, proof), 0);
        assert_int_equal(peer_auth_verify(&ab, PEER_ROLE_DIALER, nd, nl, proof), 1);
        assert_int_equal(peer_auth_verify(&b, PEER_ROLE_DIALER, nd, nl, proof), -EACCES);
        /* Bound to the role and to both nonces. */
        assert_int_equal(peer_auth_verify(&a, PEER_ROLE_LISTENER, nd, nl, proof), -EACCES);
        assert_int_equal(peer_auth_verify(&a, PEER_ROLE_DIALER, nl, nd, proof), -EACCES);
        nd[0] ^= 1;
        assert_int_equal(peer_auth_verify(&a, PEER_ROLE_DIALER, nd, nl, proof), -EACCES);
}

static void test_sessions(void **state) {
        uint8_t nd[PEER_NONCE_BYTES] = { 1 }, nl[PEER_NONCE_BYTES] = { 2 };
        PeerSessionKeys s1, s2, s3, s4;
        PeerKeys a, b;

        fill_keys(&a, 1, 0x10);
        fill_keys(&b, 1, 0x20);
        peer_auth_session(a.keys[0], nd, nl, &s1);
        peer_auth_session(a.keys[0], nd, nl, &s2);
        assert_memory_equal(&s1, &s2, sizeof s1); /* both ends derive the same */
        assert_memory_not_equal(s1.dialer_to_listener, s1.listener_to_dialer,
                                PEER_SESSION_KEY_BYTES);
        peer_auth_session(b.keys[0], nd, nl, &s3);
        assert_memory_equal(s1.id, s3.id, sizeof s1.id); /* the id proves nothing */
        assert_memory_not_equal(s1.dialer_to_listener, s3.dialer_to_listener,
                                PEER_SESSION_KEY_BYTES);
        nl[1] = 1;
        peer_auth_session(a.keys[0], nd, nl, &s4);
        assert_memory_not_equal(s1.id, s4.id, sizeof s1.id);
        assert_memory_not_equal(s1.dialer_to_listener, s4.dialer_to_listener,
                                PEER_SESSION_KEY_BYTES);
}

static const char *const KEY_LINE = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

/* Writes text to a fresh file of mode `mode`; returns its path (static). */
static const char *key_file(const char *text, mode_t mode) {
        static char path[] = "/tmp/test-peer-key-XXXXXX";

        strcpy(path, "/tmp/test-peer-key-XXXXXX");
        int fd = mkstemp(path);
        assert_true(fd >= 0);
        assert_int_equal(write(fd, text, strlen(text)), (ssize_t) strlen(text));
        assert_int_equal(fchmod(fd, mode), 0);
        close(fd);
        return path;
}

static int load(const char *text, mode_t mode, PeerKeys *k) {
        const char *path = key_file(text, mode);
        int r = peer_keys_load(path, k);
        unlink(path);
        return r;
}

static void test_key_file(void **state) {
        char two[512], three[512];
        PeerKeys k = {};

        assert_int_equal(load(KEY_LINE, 0600, &k), 0);
        assert_int_equal(k.n, 1);
        assert_int_equal(k.keys[0][0], 0x00);
        assert_int_equal(k.keys[0][31], 0xff);
        (void) snprintf(two, sizeof two, "# comment\n\n  %s \n%s\n", KEY_LINE, KEY_LINE);
        two[strlen(two) - 2] = 'e'; /* the second key differs */
        assert_int_equal(load(two, 0400, &k), 0);
        assert_int_equal(k.n, 2);
        assert_int_equal(k.keys[1][31], 0xfe);
        (void) snprintf(three, sizeof three, "%s\n%s\n%s\n", KEY_LINE, KEY_LINE, KEY_LINE);
        assert_int_equal(load(three, 0600, &k), -EINVAL);
        assert_int_equal(load("# nothing\n", 0600, &k), -EINVAL);
        assert_int_equal(load("00112233", 0600, &k), -EINVAL);
        assert_int_equal(load("zz112233445566778899aabbccddeeff00112233445566778899aabbccddeeff",
                              0600, &k), -EINVAL);
        assert_int_equal(load(KEY_LINE, 0644, &k), -EPERM);
        assert_int_equal(load(KEY_LINE, 0640, &k), -EPERM);
        assert_int_equal(load(KEY_LINE, 0602, &k), -EPERM);
        assert_int_equal(peer_keys_load("/nonexistent/key", &k), -ENOENT);
        peer_keys_wipe(&k);
        assert_int_equal(k.n, 0);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_mac_ok),
                cmocka_unit_test(test_tampered),
                cmocka_unit_test(test_replayed),
                cmocka_unit_test(test_reordered),
                cmocka_unit_test(test_proofs),
                cmocka_unit_test(test_sessions),
                cmocka_unit_test(test_key_file),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
