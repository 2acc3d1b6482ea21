/* state-kept.c: what a previous run kept, taken over at start: records and descriptors by name. */

/*
 * DESIGN: both modes come down to two lists of named descriptors, records ("meta-*") and
 * descriptors ("shard-*"), and the records replaced beside them ("metarep-*", kept here until
 * their record's owner takes them, state-replace.c): the fd store hands them over as LISTEN_FDS (the shell passes them
 * in), the state dir is read into the same shape (opened read-only: nothing here ever writes,
 * truncates or rewrites a kept file). What they mean, and which of them are put back, is
 * their owner's to say (daemon/build/build-restore.c); what it does not take, it drops with
 * state_drop().
 */

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>

#include "common/log.h"
#include "state-private.h"

static bool startswith(const char *s, const char *prefix) {
        return strncmp(s, prefix, strlen(prefix)) == 0;
}

static bool endswith(const char *s, const char *suffix) {
        size_t n = strlen(s), k = strlen(suffix);
        return n >= k && streq(s + n - k, suffix);
}

/* Takes every descriptor of from, replaced records (may be NULL: none) apart; inherited ones
 * come without close-on-exec. */
static int take_fdstore(StateFds *from, StateFds *into, StateFds *replaced) {
        int r = 0;

        for (size_t i = 0; i < from->n; i++) {
                int fd = TAKE_FD(from->items[i].fd);
                bool rep = replaced && startswith(from->items[i].name, STATE_PREFIX_REPLACED);

                (void) fcntl(fd, F_SETFD, FD_CLOEXEC);
                if (r < 0)
                        safe_close(fd);
                else
                        r = state_fds_add(rep ? replaced : into, from->items[i].name, fd);
        }
        state_fds_done(from);
        return r;
}

static int take_dir(State *s, StateFds *records, StateFds *segments) {
        _cleanup_close_ int fd = -1;
        DIR *d;
        int r = 0;

        fd = openat(s->dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0)
                return log_error_errno(-errno, "Failed to read the state dir %s: %m", s->dir);
        d = fdopendir(fd);
        if (!d)
                return log_error_errno(-errno, "Failed to read the state dir %s: %m", s->dir);
        TAKE_FD(fd);

        for (struct dirent *de; r >= 0 && (errno = 0, de = readdir(d));) {
                bool meta = startswith(de->d_name, STATE_PREFIX_RECORD),
                     shard = startswith(de->d_name, STATE_PREFIX_SEGMENT),
                     rep = startswith(de->d_name, STATE_PREFIX_REPLACED);

                if (!meta && !shard && !rep)
                        continue; /* not ours: left alone */
                if (endswith(de->d_name, STATE_TMP_SUFFIX)) {
                        /* A record being written when the daemon stopped. */
                        log_info("Removing %s/%s, a record never completed.", s->dir, de->d_name);
                        (void) unlinkat(s->dir_fd, de->d_name, 0);
                        continue;
                }
                int f = openat(s->dir_fd, de->d_name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW |
                                                              O_NOCTTY | O_NONBLOCK);
                if (f < 0) {
                        log_warning_errno(-errno, "Failed to open %s/%s, ignoring: %m", s->dir,
                                          de->d_name);
                        continue;
                }
                r = state_fds_add(meta ? records : rep ? &s->replaced_kept : segments, de->d_name,
                                  f);
        }
        if (r >= 0 && errno != 0)
                r = log_error_errno(-errno, "Failed to read the state dir %s: %m", s->dir);
        (void) closedir(d);
        return r;
}

int state_take_kept(State *s, StateFds *ret_records, StateFds *ret_segments) {
        StateFds records = {}, segments = {};
        int r = 0;

        if (s && s->mode == STATE_MODE_DIR)
                r = take_dir(s, &records, &segments);
        else if (s && s->mode == STATE_MODE_FDSTORE) {
                r = take_fdstore(&s->records, &records, &s->replaced_kept);
                if (r >= 0)
                        r = take_fdstore(&s->segments, &segments, NULL);
        }
        if (r < 0) {
                state_fds_done(&records);
                state_fds_done(&segments);
                state_fds_done(&s->replaced_kept);
                return r;
        }
        *ret_records = records;
        *ret_segments = segments;
        return 0;
}

int state_read_record(int fd, size_t max, uint8_t **ret, size_t *ret_size) {
        struct stat st;

        if (fstat(fd, &st) < 0)
                return -errno;
        if (!S_ISREG(st.st_mode))
                return -EBADFD;
        if (st.st_size > (off_t) max)
                return -EFBIG;

        size_t size = (size_t) st.st_size;
        _cleanup_free_ uint8_t *buf = malloc(size ? size : 1);
        if (!buf)
                return -ENOMEM;
        for (size_t done = 0; done < size;) {
                ssize_t k = pread(fd, buf + done, size - done, (off_t) done);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k < 0)
                        return -errno;
                if (k == 0)
                        return -EIO;
                done += (size_t) k;
        }
        *ret = TAKE_PTR(buf);
        *ret_size = size;
        return 0;
}
