/* checkpoint-deposit.c: checkpoint files clients opened and handed over on the shard socket, kept under random tokens until Builds read them. */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "checkpoint-deposit.h"

typedef struct Deposit {
        struct Deposit *next;
        ShardToken token;
        uid_t uid;
        uint64_t used_ms; /* CLOCK_MONOTONIC: made, or last opened */
        CheckpointFiles files;
} Deposit;

struct CheckpointDeposits {
        pthread_mutex_t lock;
        Deposit *deposits;
        size_t n, n_fds;
        uint64_t idle_ms;
        uint64_t deposits_total, refused_total;
};

static uint64_t now_ms(void) {
        struct timespec ts;
        (void) clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * 1000u + (uint64_t) ts.tv_nsec / 1000000u;
}

void checkpoint_files_done(CheckpointFiles *f) {
        if (!f)
                return;
        for (size_t i = 0; i < f->n; i++) {
                if (f->fds)
                        safe_close(f->fds[i]);
                if (f->names)
                        free(f->names[i]);
        }
        free(f->fds);
        free(f->names);
        *f = (CheckpointFiles) {};
}

int checkpoint_deposits_new(CheckpointDeposits **ret) {
        CheckpointDeposits *t = calloc(1, sizeof *t);

        if (!t)
                return -ENOMEM;
        (void) pthread_mutex_init(&t->lock, NULL);
        t->idle_ms = CHECKPOINT_DEPOSIT_IDLE_MS;
        *ret = t;
        return 0;
}

static void deposit_free(Deposit *d) {
        checkpoint_files_done(&d->files);
        free(d);
}

CheckpointDeposits *checkpoint_deposits_free(CheckpointDeposits *t) {
        if (!t)
                return NULL;
        while (t->deposits) {
                Deposit *d = t->deposits;
                t->deposits = d->next;
                deposit_free(d);
        }
        (void) pthread_mutex_destroy(&t->lock);
        free(t);
        return NULL;
}

int checkpoint_deposit_check_file(int fd, const char *name, char *why, size_t why_size) {
        struct stat st;
        int flags;

        if (!name || !*name || strlen(name) > CHECKPOINT_FILE_NAME_MAX || strchr(name, '/') ||
            streq(name, ".") || streq(name, "..")) {
                (void) snprintf(why, why_size, "checkpoint file names are base names of 1 to %u "
                                "bytes without '/'", CHECKPOINT_FILE_NAME_MAX);
                return -EINVAL;
        }
        flags = fcntl(fd, F_GETFL);
        if (flags < 0 || fstat(fd, &st) < 0) {
                (void) snprintf(why, why_size, "the descriptor of '%s' cannot be used", name);
                return -EINVAL;
        }
        if (!S_ISREG(st.st_mode)) {
                (void) snprintf(why, why_size, "'%s' is not a regular file", name);
                return -EINVAL;
        }
        if ((flags & O_PATH) || (flags & O_ACCMODE) == O_WRONLY) {
                (void) snprintf(why, why_size, "'%s' is not open for reading", name);
                return -EINVAL;
        }
        return 0;
}

/* Under t->lock. */
static void sweep_locked(CheckpointDeposits *t, uint64_t now) {
        for (Deposit **p = &t->deposits; *p;) {
                Deposit *d = *p;
                if (now - d->used_ms < t->idle_ms) {
                        p = &d->next;
                        continue;
                }
                *p = d->next;
                t->n--;
                t->n_fds -= d->files.n;
                deposit_free(d);
        }
}

void checkpoint_deposits_sweep(CheckpointDeposits *t) {
        (void) pthread_mutex_lock(&t->lock);
        sweep_locked(t, now_ms());
        (void) pthread_mutex_unlock(&t->lock);
}

void checkpoint_deposits_set_idle_ms(CheckpointDeposits *t, uint64_t ms) {
        (void) pthread_mutex_lock(&t->lock);
        t->idle_ms = ms ? ms : CHECKPOINT_DEPOSIT_IDLE_MS;
        (void) pthread_mutex_unlock(&t->lock);
}

int checkpoint_deposits_add(CheckpointDeposits *t, uid_t uid, CheckpointFiles *files,
                            ShardToken *ret_token) {
        _cleanup_free_ Deposit *d = NULL;
        size_t of_uid = 0, fds_of_uid = 0;
        int r = 0;

        if (files->n == 0 || files->n > CHECKPOINT_DEPOSIT_MAX_FILES) {
                checkpoint_files_done(files);
                return -EINVAL;
        }
        d = calloc(1, sizeof *d);
        if (!d) {
                checkpoint_files_done(files);
                return -ENOMEM;
        }
        r = shard_token_new(&d->token);
        if (r < 0) {
                checkpoint_files_done(files);
                return r;
        }

        (void) pthread_mutex_lock(&t->lock);
        sweep_locked(t, now_ms());
        for (Deposit *e = t->deposits; e; e = e->next)
                if (e->uid == uid) {
                        of_uid++;
                        fds_of_uid += e->files.n;
                }
        if (of_uid >= CHECKPOINT_DEPOSITS_PER_UID ||
            fds_of_uid + files->n > CHECKPOINT_DEPOSIT_MAX_FDS_PER_UID)
                r = -EUSERS;
        else if (t->n >= CHECKPOINT_DEPOSITS_MAX ||
                 t->n_fds + files->n > CHECKPOINT_DEPOSIT_MAX_FDS)
                r = -ENOSPC;
        if (r < 0) {
                t->refused_total++;
                (void) pthread_mutex_unlock(&t->lock);
                checkpoint_files_done(files);
                return r;
        }
        d->uid = uid;
        d->used_ms = now_ms();
        d->files = *files;
        *files = (CheckpointFiles) {};
        *ret_token = d->token;
        d->next = t->deposits;
        t->deposits = d;
        t->n++;
        t->n_fds += d->files.n;
        t->deposits_total++;
        TAKE_PTR(d);
        (void) pthread_mutex_unlock(&t->lock);
        return 0;
}

/* Duplicates of src's descriptors and names into *ret. */
static int files_copy(const CheckpointFiles *src, CheckpointFiles *ret) {
        _cleanup_(checkpoint_files_done) CheckpointFiles c = {};

        c.fds = calloc(src->n, sizeof(int));
        c.names = calloc(src->n, sizeof(char *));
        if (!c.fds || !c.names)
                return -ENOMEM;
        for (size_t i = 0; i < src->n; i++)
                c.fds[i] = -EBADF;
        c.n = src->n;
        for (size_t i = 0; i < src->n; i++) {
                c.fds[i] = fcntl(src->fds[i], F_DUPFD_CLOEXEC, 3);
                if (c.fds[i] < 0)
                        return -errno;
                c.names[i] = strdup(src->names[i]);
                if (!c.names[i])
                        return -ENOMEM;
        }
        *ret = c;
        c = (CheckpointFiles) {};
        return 0;
}

int checkpoint_deposits_open(CheckpointDeposits *t, const char *token, uid_t uid,
                             CheckpointFiles *ret) {
        int r = -ENOENT;

        (void) pthread_mutex_lock(&t->lock);
        sweep_locked(t, now_ms());
        for (Deposit *d = t->deposits; d; d = d->next) {
                /* Every deposit is compared, in constant time each: a token's value is never
                 * told by when the search stops. */
                bool match = shard_token_equal(d->token.hex, token) && d->uid == uid;
                if (match && r == -ENOENT) {
                        r = files_copy(&d->files, ret);
                        if (r >= 0)
                                d->used_ms = now_ms();
                }
        }
        (void) pthread_mutex_unlock(&t->lock);
        return r;
}

void checkpoint_deposits_counters(CheckpointDeposits *t, CheckpointDepositCounters *ret) {
        (void) pthread_mutex_lock(&t->lock);
        *ret = (CheckpointDepositCounters) {
                .deposits = t->n,
                .fds = t->n_fds,
                .deposits_total = t->deposits_total,
                .refused_total = t->refused_total,
        };
        (void) pthread_mutex_unlock(&t->lock);
}
