/* test-checkpoint-deposit.c: handout/checkpoint-deposit.c: deposits under tokens for their uid only,
 * duplicates handed out, the per-uid and global limits, the file checks, and idle deposits
 * dropped with their descriptors closed. */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "handout/checkpoint-deposit.h"

static char path[] = "/tmp/test-deposit-XXXXXX";

/* n files of one deposit: descriptors of the test file, names f0, f1, ... */
static CheckpointFiles files_of(size_t n) {
        CheckpointFiles f = { .fds = calloc(n, sizeof(int)), .names = calloc(n, sizeof(char *)),
                              .n = n };
        assert_non_null(f.fds);
        assert_non_null(f.names);
        for (size_t i = 0; i < n; i++) {
                f.fds[i] = open(path, O_RDONLY | O_CLOEXEC);
                assert_true(f.fds[i] >= 0);
                assert_true(asprintf(&f.names[i], "f%zu", i) > 0);
        }
        return f;
}

static bool fd_open(int fd) {
        return fcntl(fd, F_GETFD) >= 0;
}

static void test_add_open(void **state) {
        CheckpointDeposits *t = NULL;
        CheckpointFiles f = files_of(2), got = {};
        int kept = f.fds[0];
        ShardToken tok;

        assert_int_equal(checkpoint_deposits_new(&t), 0);
        assert_int_equal(checkpoint_deposits_add(t, 1000, &f, &tok), 0);
        assert_int_equal(f.n, 0); /* taken over */
        assert_true(shard_token_is_valid(tok.hex));

        assert_int_equal(checkpoint_deposits_open(t, tok.hex, 1000, &got), 0);
        assert_int_equal(got.n, 2);
        assert_string_equal(got.names[1], "f1");
        assert_true(got.fds[0] != kept); /* a duplicate */
        struct stat a, b;
        assert_int_equal(fstat(got.fds[0], &a), 0);
        assert_int_equal(fstat(kept, &b), 0);
        assert_true(a.st_ino == b.st_ino);
        checkpoint_files_done(&got);

        /* Another uid, a wrong or malformed token: not found. */
        assert_int_equal(checkpoint_deposits_open(t, tok.hex, 1001, &got), -ENOENT);
        char other[SHARD_TOKEN_LENGTH + 1];
        memcpy(other, tok.hex, sizeof other);
        other[0] = other[0] == 'a' ? 'b' : 'a';
        assert_int_equal(checkpoint_deposits_open(t, other, 1000, &got), -ENOENT);
        assert_int_equal(checkpoint_deposits_open(t, "", 1000, &got), -ENOENT);

        CheckpointDepositCounters c;
        checkpoint_deposits_counters(t, &c);
        assert_int_equal(c.deposits, 1);
        assert_int_equal(c.fds, 2);
        checkpoint_deposits_free(t);
        assert_false(fd_open(kept)); /* closed with the table */
}

static void test_limits(void **state) {
        CheckpointDeposits *t = NULL;
        ShardToken tok;

        assert_int_equal(checkpoint_deposits_new(&t), 0);
        for (unsigned i = 0; i < CHECKPOINT_DEPOSITS_PER_UID; i++) {
                CheckpointFiles f = files_of(1);
                assert_int_equal(checkpoint_deposits_add(t, 7, &f, &tok), 0);
        }
        CheckpointFiles f = files_of(1);
        int fd = f.fds[0];
        assert_int_equal(checkpoint_deposits_add(t, 7, &f, &tok), -EUSERS);
        assert_false(fd_open(fd)); /* closed on refusal too */
        /* Another uid deposits on. */
        f = files_of(1);
        assert_int_equal(checkpoint_deposits_add(t, 8, &f, &tok), 0);
        /* Too many files for one deposit, none at all. */
        f = files_of(CHECKPOINT_DEPOSIT_MAX_FILES + 1);
        assert_int_equal(checkpoint_deposits_add(t, 9, &f, &tok), -EINVAL);
        f = (CheckpointFiles) {};
        assert_int_equal(checkpoint_deposits_add(t, 9, &f, &tok), -EINVAL);
        CheckpointDepositCounters c;
        checkpoint_deposits_counters(t, &c);
        assert_int_equal(c.refused_total, 1);
        checkpoint_deposits_free(t);
}

static void test_idle_sweep(void **state) {
        CheckpointDeposits *t = NULL;
        CheckpointFiles f = files_of(1), got = {};
        int fd = f.fds[0];
        ShardToken tok;

        assert_int_equal(checkpoint_deposits_new(&t), 0);
        checkpoint_deposits_set_idle_ms(t, 50);
        assert_int_equal(checkpoint_deposits_add(t, 1, &f, &tok), 0);
        usleep(30 * 1000);
        /* Naming it starts its idle time again. */
        assert_int_equal(checkpoint_deposits_open(t, tok.hex, 1, &got), 0);
        checkpoint_files_done(&got);
        usleep(30 * 1000);
        checkpoint_deposits_sweep(t);
        assert_true(fd_open(fd));
        usleep(60 * 1000);
        checkpoint_deposits_sweep(t);
        assert_false(fd_open(fd));
        assert_int_equal(checkpoint_deposits_open(t, tok.hex, 1, &got), -ENOENT);
        checkpoint_deposits_free(t);
}

static void test_check_file(void **state) {
        char why[320];
        int fd = open(path, O_RDONLY), wfd = open(path, O_WRONLY), pfd = open(path, O_PATH);
        int p[2];

        assert_int_equal(pipe(p), 0);
        assert_int_equal(checkpoint_deposit_check_file(fd, "model.safetensors", why, sizeof why),
                         0);
        assert_int_equal(checkpoint_deposit_check_file(fd, "a/b", why, sizeof why), -EINVAL);
        assert_int_equal(checkpoint_deposit_check_file(fd, "..", why, sizeof why), -EINVAL);
        assert_int_equal(checkpoint_deposit_check_file(fd, "", why, sizeof why), -EINVAL);
        assert_int_equal(checkpoint_deposit_check_file(wfd, "w", why, sizeof why), -EINVAL);
        assert_non_null(strstr(why, "not open for reading"));
        assert_int_equal(checkpoint_deposit_check_file(pfd, "p", why, sizeof why), -EINVAL);
        assert_int_equal(checkpoint_deposit_check_file(p[0], "pipe", why, sizeof why), -EINVAL);
        assert_non_null(strstr(why, "not a regular file"));
        close(fd);
        close(wfd);
        close(pfd);
        close(p[0]);
        close(p[1]);
}

int main(void) {
        int fd = mkstemp(path);
        if (fd < 0)
                return 1;
        (void) write(fd, "x", 1);
        close(fd);
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_add_open),
                cmocka_unit_test(test_limits),
                cmocka_unit_test(test_idle_sweep),
                cmocka_unit_test(test_check_file),
        };
        int r = cmocka_run_group_tests(tests, NULL, NULL);
        unlink(path);
        return r;
}
