/* test-state-replace.c: records replaced whole beside a kept one (daemon/state/state-replace.c)
 * in the state dir and the fd store, and the record of a build's holders
 * (daemon/codec/codec-holders-record.c). End to end: tests/integration/test_build_references.py
 * (TestRestart*) and test_durability_fdstore.py. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>
#include <linux/magic.h>
#include <cmocka.h>

#include "codec/codec-holders-record.h"
#include "state/state.h"

/* ---- the state dir ---------------------------------------------------------------------- */

static char *file_of(const char *dir, const char *name) {
        char path[512];
        static char buf[256];
        (void) snprintf(path, sizeof path, "%s/%s", dir, name);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return NULL;
        ssize_t n = read(fd, buf, sizeof buf - 1);
        close(fd);
        buf[n < 0 ? 0 : n] = 0;
        return buf;
}

static size_t files_in(const char *dir) {
        char cmd[512];
        (void) snprintf(cmd, sizeof cmd, "ls -A %s | wc -l", dir);
        FILE *p = popen(cmd, "r");
        size_t n = 0;
        assert_non_null(p);
        assert_int_equal(fscanf(p, "%zu", &n), 1);
        pclose(p);
        return n;
}

static void test_replace_in_the_state_dir(void **unused) {
        char dir[] = "/dev/shm/test-state-replace-XXXXXX";
        struct statfs sf;
        State *s = NULL;
        uint8_t *data = NULL;
        size_t size = 0;

        if (statfs("/dev/shm", &sf) < 0 || (unsigned long) sf.f_type != TMPFS_MAGIC ||
            !mkdtemp(dir))
                skip();
        assert_int_equal(state_new(&(StateParams) { .state_dir = dir }, &s), 0);
        assert_int_equal(state_mode(s), STATE_MODE_DIR);

        /* Only beside a kept record. */
        assert_int_equal(state_replace(s, "bld-1", (const uint8_t *) "x", 1), -ESTALE);
        assert_int_equal(state_keep(s, "bld-1", (const uint8_t *) "record", 6, NULL, 0), 0);
        assert_int_equal(state_keep(s, "bld-2", (const uint8_t *) "record", 6, NULL, 0), 0);
        assert_int_equal(state_replace(s, "bld-1", (const uint8_t *) "first", 5), 0);
        assert_string_equal(file_of(dir, "metarep-bld-1"), "first");
        assert_int_equal(state_replace(s, "bld-1", (const uint8_t *) "second", 6), 0);
        assert_string_equal(file_of(dir, "metarep-bld-1"), "second");
        assert_int_equal(state_replace(s, "bld-2", (const uint8_t *) "two", 3), 0);
        /* Two records, two replaced, no temporary file left. */
        assert_int_equal(files_in(dir), 4);
        /* Ids that cannot name one. */
        assert_int_equal(state_replace(s, "bld.1", (const uint8_t *) "x", 1), -ESTALE);

        /* Forgotten: its replaced record goes with it, and a late replace is refused. */
        state_forget(s, "bld-2", 0);
        assert_null(file_of(dir, "metarep-bld-2"));
        assert_int_equal(state_replace(s, "bld-2", (const uint8_t *) "late", 4), -ESTALE);
        assert_null(file_of(dir, "metarep-bld-2"));
        state_free(s);

        /* A restart: an orphan (its record lost) and a half-written one beside. */
        char path[512];
        (void) snprintf(path, sizeof path, "%s/metarep-bld-9", dir);
        int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
        assert_true(fd >= 0);
        close(fd);
        (void) snprintf(path, sizeof path, "%s/metarep-bld-1.tmp", dir);
        fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
        assert_true(fd >= 0);
        close(fd);

        StateFds records = {}, segments = {};
        assert_int_equal(state_new(&(StateParams) { .state_dir = dir }, &s), 0);
        assert_int_equal(state_take_kept(s, &records, &segments), 0);
        assert_int_equal(records.n, 1); /* meta-bld-1 only */
        assert_string_equal(records.items[0].name, "meta-bld-1");
        assert_int_equal(state_take_replaced(s, "bld-1", 1024, &data, &size), 0);
        assert_int_equal(size, 6);
        assert_memory_equal(data, "second", 6);
        free(data);
        /* A kept record with none beside it (an older daemon's). */
        assert_int_equal(state_take_replaced(s, "bld-3", 1024, &data, &size), -ENOENT);
        state_drop_untaken_replaced(s);
        assert_null(file_of(dir, "metarep-bld-9"));
        assert_null(file_of(dir, "metarep-bld-1.tmp"));
        /* Taken back: replaced again as before. */
        assert_int_equal(state_replace(s, "bld-1", (const uint8_t *) "third", 5), 0);
        assert_string_equal(file_of(dir, "metarep-bld-1"), "third");
        state_forget(s, "bld-1", 0);
        state_forget(s, "bld-3", 0);
        assert_int_equal(files_in(dir), 0);
        state_fds_done(&records);
        state_fds_done(&segments);
        state_free(s);
        (void) rmdir(dir);
}

/* ---- the fd store ----------------------------------------------------------------------- */

static StateFds store;
static unsigned pushes, removes;

static int fake_add(const char *name, int fd) {
        pushes++;
        assert_int_equal(state_fds_add(&store, name, fcntl(fd, F_DUPFD_CLOEXEC, 3)), 0);
        return 1;
}

static int fake_remove(const char *name) {
        removes++;
        for (size_t i = 0; i < store.n; i++)
                if (store.items[i].fd >= 0 && strcmp(store.items[i].name, name) == 0)
                        store.items[i].fd = (close(store.items[i].fd), -1);
        return 1;
}

static bool stored(const char *name) {
        return state_fds_find(&store, name) != NULL;
}

static size_t n_stored(void) {
        size_t n = 0;
        for (size_t i = 0; i < store.n; i++)
                n += store.items[i].fd >= 0;
        return n;
}

/* What a restart hands back: every stored "meta*" descriptor (duplicates). */
static StateFds handed_back(void) {
        StateFds l = {};
        for (size_t i = 0; i < store.n; i++)
                if (store.items[i].fd >= 0 && strncmp(store.items[i].name, "meta", 4) == 0)
                        assert_int_equal(state_fds_add(&l, store.items[i].name,
                                                       fcntl(store.items[i].fd, F_DUPFD_CLOEXEC,
                                                             3)),
                                         0);
        return l;
}

static int memfd_of(const char *text) {
        int fd = memfd_create("t", MFD_CLOEXEC);
        assert_true(fd >= 0);
        assert_int_equal(write(fd, text, strlen(text)), (ssize_t) strlen(text));
        return fd;
}

static State *managed(unsigned max, StateFds records) {
        State *s = NULL;
        assert_int_equal(state_new(&(StateParams) { .under_manager = true, .fdstore_max = max,
                                                    .records = records,
                                                    .fdstore_add = fake_add,
                                                    .fdstore_remove = fake_remove },
                                   &s),
                         0);
        return s;
}

static void test_replace_in_the_fd_store(void **unused) {
        uint8_t *data = NULL;
        size_t size = 0, used, max;
        State *s = managed(8, (StateFds) {});

        assert_int_equal(state_reserve(s, 1, "build", NULL), 0);
        assert_int_equal(state_keep(s, "bld-1", (const uint8_t *) "record", 6, NULL, 0), 0);
        assert_int_equal(state_replace(s, "bld-1", (const uint8_t *) "first", 5), 0);
        assert_true(stored("metarep-bld-1.1"));
        /* The next generation is stored before the old one goes. */
        unsigned p = pushes, r = removes;
        assert_int_equal(state_replace(s, "bld-1", (const uint8_t *) "second", 6), 0);
        assert_int_equal(pushes - p, 1);
        assert_int_equal(removes - r, 1);
        assert_true(stored("metarep-bld-1.2"));
        assert_false(stored("metarep-bld-1.1"));
        /* Counted: its record and one replaced record. */
        state_fd_counts(s, &used, &max);
        assert_int_equal(used, 2);
        state_free(s);

        /* A crash between the push and the remove left two generations; one orphan. */
        assert_int_equal(state_fds_add(&store, "metarep-bld-1.1", memfd_of("stale")), 0);
        assert_int_equal(state_fds_add(&store, "metarep-bld-7.3", memfd_of("orphan")), 0);
        StateFds records = {}, segments = {};
        s = managed(8, handed_back());
        assert_int_equal(state_take_kept(s, &records, &segments), 0);
        assert_int_equal(records.n, 1);
        assert_string_equal(records.items[0].name, "meta-bld-1");
        state_adopt(s, 1);
        assert_int_equal(state_take_replaced(s, "bld-1", 1024, &data, &size), 0);
        assert_int_equal(size, 6);
        assert_memory_equal(data, "second", 6);
        free(data);
        assert_false(stored("metarep-bld-1.1")); /* the older generation dropped */
        state_drop_untaken_replaced(s);
        assert_false(stored("metarep-bld-7.3"));
        state_fd_counts(s, &used, &max);
        assert_int_equal(used, 2);
        /* Generations go on from the newest. */
        assert_int_equal(state_replace(s, "bld-1", (const uint8_t *) "third", 5), 0);
        assert_true(stored("metarep-bld-1.3"));
        assert_false(stored("metarep-bld-1.2"));
        assert_int_equal(n_stored(), 2);
        state_forget(s, "bld-1", 0);
        assert_int_equal(n_stored(), 0);
        state_fd_counts(s, &used, &max);
        assert_int_equal(used, 0);
        assert_int_equal(state_replace(s, "bld-1", (const uint8_t *) "late", 4), -ESTALE);
        assert_int_equal(n_stored(), 0);
        state_fds_done(&records);
        state_fds_done(&segments);
        state_free(s);
        state_fds_done(&store);
}

static void test_replace_needs_room_in_the_fd_store(void **unused) {
        size_t used, max;
        State *s = managed(2, (StateFds) {});

        assert_int_equal(state_reserve(s, 1, "build", NULL), 0);
        assert_int_equal(state_keep(s, "bld-1", (const uint8_t *) "record", 6, NULL, 0), 0);
        assert_int_equal(state_replace(s, "bld-1", (const uint8_t *) "first", 5), 0);
        /* Full: the swap would need a third descriptor for a moment; the old one stays. */
        assert_int_equal(state_replace(s, "bld-1", (const uint8_t *) "second", 6), -ENOSPC);
        assert_true(stored("metarep-bld-1.1"));
        state_fd_counts(s, &used, &max);
        assert_int_equal(used, 2);
        state_forget(s, "bld-1", 0);
        state_fd_counts(s, &used, &max);
        assert_int_equal(used, 0);
        state_free(s);
        state_fds_done(&store);
}

/* ---- the holders record ----------------------------------------------------------------- */

static void test_holders_record_round_trip(void **unused) {
        BuildHolder holders[] = {
                { .pid = 100, .uid = 1000, .start_time = 123456789, .since_ms = 1700000000000,
                  .count = 2 },
                { .pid = 4194304, .uid = 0, .start_time = 1, .since_ms = 1700000000001,
                  .count = 1 },
        };
        uint8_t key[] = { 0, 1, 2, 0xff, 'k' };
        HoldersRecord in = { .pinned = true, .private_build = false, .created_ms = 1699999999999,
                             .key = key, .key_size = sizeof key, .holders = holders,
                             .n_holders = 2 };
        HoldersRecord out = {};
        uint8_t *data = NULL;
        size_t size = 0;
        char why[128];

        assert_int_equal(codec_holders_record_encode(&in, &data, &size), 0);
        assert_int_equal(codec_holders_record_decode(data, size, &out, why, sizeof why), 0);
        assert_true(out.pinned);
        assert_false(out.private_build);
        assert_int_equal(out.created_ms, in.created_ms);
        assert_int_equal(out.key_size, sizeof key);
        assert_memory_equal(out.key, key, sizeof key);
        assert_int_equal(out.n_holders, 2);
        for (size_t i = 0; i < 2; i++) {
                assert_int_equal(out.holders[i].pid, holders[i].pid);
                assert_int_equal(out.holders[i].uid, holders[i].uid);
                assert_int_equal(out.holders[i].start_time, holders[i].start_time);
                assert_int_equal(out.holders[i].since_ms, holders[i].since_ms);
                assert_int_equal(out.holders[i].count, holders[i].count);
        }
        codec_holders_record_done(&out);
        free(data);

        /* No key, no holders (a private build once held, now in its grace period). */
        HoldersRecord empty = { .private_build = true, .created_ms = 5 };
        assert_int_equal(codec_holders_record_encode(&empty, &data, &size), 0);
        assert_int_equal(codec_holders_record_decode(data, size, &out, why, sizeof why), 0);
        assert_true(out.private_build);
        assert_null(out.key);
        assert_int_equal(out.n_holders, 0);
        codec_holders_record_done(&out);
        free(data);

        /* Past the limits: refused. */
        in.n_holders = BUILD_TABLE_MAX_HOLDERS + 1;
        assert_int_equal(codec_holders_record_encode(&in, &data, &size), -E2BIG);
}

/* The owner and share mode ride on flags 4 and 8 and a uid after the holders; a record without
 * them (written before owners) still reads, with no owner. */
static void test_holders_record_owner(void **unused) {
        BuildHolder h = { .pid = 7, .uid = 1000, .start_time = 2, .since_ms = 3, .count = 1 };
        HoldersRecord in = { .holders = &h, .n_holders = 1, .has_owner = true,
                             .owner_uid = 4242, .share_group = true };
        HoldersRecord out = {};
        uint8_t *data = NULL, *plain = NULL;
        size_t size = 0, plain_size = 0;
        char why[128];

        assert_int_equal(codec_holders_record_encode(&in, &data, &size), 0);
        assert_int_equal(codec_holders_record_decode(data, size, &out, why, sizeof why), 0);
        assert_true(out.has_owner);
        assert_int_equal(out.owner_uid, 4242);
        assert_true(out.share_group);
        assert_int_equal(out.holders[0].uid, 1000);
        codec_holders_record_done(&out);

        in.has_owner = in.share_group = false;
        assert_int_equal(codec_holders_record_encode(&in, &plain, &plain_size), 0);
        assert_int_equal(plain_size + 4, size);
        assert_int_equal(codec_holders_record_decode(plain, plain_size, &out, why, sizeof why),
                         0);
        assert_false(out.has_owner);
        assert_false(out.share_group);
        codec_holders_record_done(&out);

        /* The owner's flag without its uid (or the reverse) does not add up. */
        assert_int_equal(codec_holders_record_decode(data, size - 4, &out, why, sizeof why),
                         -EBADMSG);
        free(data);
        free(plain);
}

/* A training handout's process rides on flag 16 and 16 bytes after the owner; a record without
 * them reads as not bound. */
static void test_holders_record_binding(void **unused) {
        BuildHolder h = { .pid = 7, .uid = 1000, .start_time = 2, .since_ms = 3, .count = 1 };
        HoldersRecord in = { .holders = &h, .n_holders = 1, .has_owner = true,
                             .owner_uid = 1000, .private_build = true,
                             .binding = { .bound = true, .pid = 7, .start_time = 2 } };
        HoldersRecord out = {};
        uint8_t *data = NULL, *plain = NULL;
        size_t size = 0, plain_size = 0;
        char why[128];

        assert_int_equal(codec_holders_record_encode(&in, &data, &size), 0);
        assert_int_equal(codec_holders_record_decode(data, size, &out, why, sizeof why), 0);
        assert_true(out.binding.bound);
        assert_int_equal(out.binding.pid, 7);
        assert_int_equal(out.binding.start_time, 2);
        assert_true(out.has_owner);
        assert_int_equal(out.owner_uid, 1000);
        codec_holders_record_done(&out);

        in.binding = (BuildBinding) {};
        assert_int_equal(codec_holders_record_encode(&in, &plain, &plain_size), 0);
        assert_int_equal(plain_size + 16, size);
        assert_int_equal(codec_holders_record_decode(plain, plain_size, &out, why, sizeof why),
                         0);
        assert_false(out.binding.bound);
        codec_holders_record_done(&out);

        /* The flag without its process does not add up. */
        assert_int_equal(codec_holders_record_decode(data, size - 16, &out, why, sizeof why),
                         -EBADMSG);
        free(data);
        free(plain);
}

/* The uids that pinned a build ride on flag 32 after the binding; an older record's pin (flag 1
 * alone) reads with no pinners, and put back it is its owner's. */
static void test_holders_record_pinners(void **unused) {
        uint32_t pinners[] = { 1000, 0 };
        HoldersRecord in = { .pinned = true, .has_owner = true, .owner_uid = 1000,
                             .binding = { .bound = true, .pid = 7, .start_time = 2 },
                             .pinners = pinners, .n_pinners = 2 };
        HoldersRecord out = {};
        uint8_t *data = NULL, *plain = NULL;
        size_t size = 0, plain_size = 0;
        char why[128];

        assert_int_equal(codec_holders_record_encode(&in, &data, &size), 0);
        assert_int_equal(codec_holders_record_decode(data, size, &out, why, sizeof why), 0);
        assert_true(out.pinned);
        assert_int_equal(out.n_pinners, 2);
        assert_int_equal(out.pinners[0], 1000);
        assert_int_equal(out.pinners[1], 0);
        assert_true(out.binding.bound);
        assert_int_equal(out.binding.start_time, 2);
        codec_holders_record_done(&out);

        in.pinners = NULL;
        in.n_pinners = 0;
        assert_int_equal(codec_holders_record_encode(&in, &plain, &plain_size), 0);
        assert_int_equal(plain_size + 12, size);
        assert_int_equal(codec_holders_record_decode(plain, plain_size, &out, why, sizeof why),
                         0);
        assert_true(out.pinned);
        assert_int_equal(out.n_pinners, 0);

        /* Put back: the pin of unknown uid is the owner's, and the build counts for it. */
        BuildTable *t = NULL;
        BuildRecord *a = NULL;
        BuildHolding h = {};
        BuildUidUse *use = NULL;
        size_t n = 0;
        assert_int_equal(build_table_new(4, 1000, 1, &t), 0);
        assert_int_equal(build_table_restore(t, "bld-00000001-1", 10, NULL, NULL, &a), 0);
        build_table_holding_put_back(t, a, &out);
        assert_int_equal(build_table_holding(t, a, &h), 0);
        assert_true(h.pinned);
        assert_int_equal(h.n_pinners, 1);
        assert_int_equal(h.pinners[0], 1000);
        build_holding_done(&h);
        assert_int_equal(build_table_uid_use(t, &use, &n), 0);
        assert_int_equal(n, 1);
        assert_int_equal(use[0].uid, 1000);
        assert_int_equal(use[0].builds, 1);
        assert_int_equal(use[0].pins, 1);
        assert_int_equal(use[0].bytes, 10);
        free(use);
        build_record_unref(a);
        build_table_free(t);

        /* The flag with a count of 0, or with the uids cut short, does not add up. */
        assert_int_equal(codec_holders_record_decode(data, size - 4, &out, why, sizeof why),
                         -EBADMSG);
        free(data);
        free(plain);
}

static void test_holders_record_corrupt_is_refused(void **unused) {
        BuildHolder h = { .pid = 7, .uid = 1, .start_time = 2, .since_ms = 3, .count = 1 };
        uint8_t key[] = "key";
        HoldersRecord in = { .key = key, .key_size = 3, .holders = &h, .n_holders = 1 };
        HoldersRecord out = {};
        uint8_t *data = NULL;
        size_t size = 0;
        char why[128];

        assert_int_equal(codec_holders_record_encode(&in, &data, &size), 0);
        /* Every bit of every byte flipped, every length cut short: refused, never read. */
        for (size_t i = 0; i < size; i++)
                for (unsigned bit = 0; bit < 8; bit++) {
                        data[i] ^= (uint8_t) (1u << bit);
                        assert_int_equal(codec_holders_record_decode(data, size, &out, why,
                                                                     sizeof why),
                                         -EBADMSG);
                        data[i] ^= (uint8_t) (1u << bit);
                }
        for (size_t n = 0; n < size; n++)
                assert_int_equal(codec_holders_record_decode(data, n, &out, why, sizeof why),
                                 -EBADMSG);
        assert_int_equal(codec_holders_record_decode((const uint8_t *) "garbage", 7, &out, why,
                                                     sizeof why),
                         -EBADMSG);
        assert_string_equal(why, "not a holders record");
        free(data);

        /* Whole, but claiming what it cannot: a holder without a pid (checksum made good). */
        h.pid = 0;
        assert_int_equal(codec_holders_record_encode(&in, &data, &size), 0);
        assert_int_equal(codec_holders_record_decode(data, size, &out, why, sizeof why),
                         -EBADMSG);
        assert_string_equal(why, "a holder without a pid or a count");
        free(data);
}

/* ---- the build table's side: what is kept of a holding, and put back --------------------- */

static void test_build_table_holding_kept_and_put_back(void **unused) {
        BuildTable *t = NULL;
        BuildRecord *a = NULL, *b = NULL, **list = NULL;
        BuildHoldingKept k = {};
        BuildHolding h = {};
        size_t n = 0;
        uint8_t *key = malloc(3);

        assert_int_equal(build_table_new(4, 1000, 1, &t), 0);
        assert_int_equal(build_table_restore(t, "bld-00000001-1", 10, NULL, NULL, &a), 0);
        assert_int_equal(build_table_restore(t, "bld-00000001-2", 10, NULL, NULL, &b), 0);
        memcpy(key, "key", 3);
        build_table_init_holding(t, a, &(BuildRecordInit) { .referenced = true, .created_ms = 7,
                                                             .key = key, .key_size = 3 });
        build_table_init_holding(t, b, &(BuildRecordInit) { .referenced = true });
        assert_int_equal(build_table_hold(t, a, &(BuildHolder) { .pid = 10, .start_time = 1 }),
                         0);
        assert_int_equal(build_table_hold(t, a, &(BuildHolder) { .pid = 11, .start_time = 2 }),
                         0);
        assert_int_equal(build_table_pin(t, a, true, 0, 0), 0);

        assert_int_equal(build_table_holding_kept(t, a, &k), 0);
        assert_true(k.pinned);
        assert_int_equal(k.created_ms, 7);
        assert_int_equal(k.key_size, 3);
        assert_memory_equal(k.key, "key", 3);
        assert_int_equal(k.n_holders, 2);
        assert_int_equal(k.holders[1].pid, 11);

        /* b gets a's: found by its key, held, not in grace. */
        build_table_holding_put_back(t, b, &k);
        assert_null(k.key);
        assert_int_equal(build_table_start_grace(t, 100, 1000), 0);
        assert_int_equal(build_table_holding(t, b, &h), 0);
        assert_int_equal(h.n_holders, 2);
        assert_true(h.pinned);
        assert_int_equal(h.created_ms, 7);
        build_holding_done(&h);

        /* A process gone: every build it held is listed (its holders record saved again). */
        assert_int_equal(build_table_drop_process_list(t, 10, 1, 0, 0, &list, &n), 0);
        assert_int_equal(n, 2);
        build_list_free(list, n);

        /* Gone from the table: nothing to keep. */
        FamilyError e = FAMILY_ERROR_NULL;
        assert_int_equal(build_table_remove(t, "bld-00000001-1", &e), 0);
        assert_int_equal(build_table_holding_kept(t, a, &k), -ESTALE);
        build_record_unref(a);
        build_record_unref(b);
        build_table_free(t);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_replace_in_the_state_dir),
                cmocka_unit_test(test_replace_in_the_fd_store),
                cmocka_unit_test(test_replace_needs_room_in_the_fd_store),
                cmocka_unit_test(test_holders_record_round_trip),
                cmocka_unit_test(test_holders_record_owner),
                cmocka_unit_test(test_holders_record_binding),
                cmocka_unit_test(test_holders_record_pinners),
                cmocka_unit_test(test_holders_record_corrupt_is_refused),
                cmocka_unit_test(test_build_table_holding_kept_and_put_back),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
