/* peer-key.c: reads and checks the cluster key file (--cluster-key). */

#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "peer-key.h"

/* Larger files are not key files: two keys and comments fit well within this. */
#define PEER_KEY_FILE_MAX 4096u

void peer_keys_wipe(PeerKeys *k) {
        sodium_memzero(k, sizeof *k);
}

static int key_file_check_owner(const char *path, const struct stat *st) {
        if (!S_ISREG(st->st_mode))
                return log_error_errno(-EINVAL, "Cluster key file %s is not a regular file.", path);
        if (st->st_uid != geteuid())
                return log_error_errno(-EPERM, "Cluster key file %s belongs to uid %u, not to "
                                               "familyd's user (uid %u).",
                                       path, (unsigned) st->st_uid, (unsigned) geteuid());
        if (st->st_mode & 077)
                return log_error_errno(-EPERM, "Cluster key file %s has mode %04o: it must not be "
                                               "readable or writable by group or others "
                                               "(chmod 600 %s).",
                                       path, (unsigned) (st->st_mode & 07777), path);
        return 0;
}

/* One line of the file: a key, or nothing (blank, comment). 1: a key into ret. */
static int key_line_parse(const char *path, unsigned lineno, char *line, uint8_t *ret) {
        size_t len = strlen(line), bin_len = 0;

        while (len > 0 && strchr(" \t\r", line[len - 1]))
                line[--len] = 0;
        while (*line == ' ' || *line == '\t')
                line++, len--;
        if (len == 0 || line[0] == '#')
                return 0;
        if (len != 2 * PEER_KEY_BYTES ||
            sodium_hex2bin(ret, PEER_KEY_BYTES, line, len, NULL, &bin_len, NULL) < 0 ||
            bin_len != PEER_KEY_BYTES)
                return log_error_errno(-EINVAL, "Cluster key file %s, line %u: not a key of %u "
                                                "hexadecimal characters (make one with "
                                                "`familyctl keygen FILE`).",
                                       path, lineno, 2 * PEER_KEY_BYTES);
        return 1;
}

static int key_file_parse(const char *path, char *text, PeerKeys *ret) {
        unsigned lineno = 0;
        char *save = NULL;

        for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
                uint8_t key[PEER_KEY_BYTES];
                int r = key_line_parse(path, ++lineno, line, key);
                if (r < 0)
                        return r;
                if (r == 0)
                        continue;
                if (ret->n == PEER_KEYS_MAX) {
                        sodium_memzero(key, sizeof key);
                        return log_error_errno(-EINVAL, "Cluster key file %s holds more than %u "
                                                        "keys.",
                                               path, PEER_KEYS_MAX);
                }
                memcpy(ret->keys[ret->n++], key, sizeof key);
                sodium_memzero(key, sizeof key);
        }
        if (ret->n == 0)
                return log_error_errno(-EINVAL, "Cluster key file %s holds no key.", path);
        return 0;
}

int peer_keys_load(const char *path, PeerKeys *ret) {
        char text[PEER_KEY_FILE_MAX + 1];
        PeerKeys k = {};
        struct stat st;
        size_t have = 0;
        int fd, r;

        if (sodium_init() < 0)
                return log_error_errno(-EIO, "Failed to initialise libsodium.");
        fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NOFOLLOW | O_NONBLOCK);
        if (fd < 0)
                return log_error_errno(-errno, "Cannot open the cluster key file %s: %m", path);
        r = fstat(fd, &st) < 0 ? log_error_errno(-errno, "Cannot read the cluster key file %s: %m", path)
                               : key_file_check_owner(path, &st);
        while (r >= 0 && have <= PEER_KEY_FILE_MAX) {
                ssize_t n = read(fd, text + have, PEER_KEY_FILE_MAX + 1 - have);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0)
                        r = log_error_errno(-errno, "Cannot read the cluster key file %s: %m", path);
                if (n <= 0)
                        break;
                have += (size_t) n;
        }
        safe_close(fd);
        if (r >= 0 && have > PEER_KEY_FILE_MAX)
                r = log_error_errno(-EINVAL, "Cluster key file %s is larger than %u bytes: not a "
                                             "key file.",
                                    path, PEER_KEY_FILE_MAX);
        if (r >= 0) {
                text[have] = 0;
                r = key_file_parse(path, text, &k);
        }
        sodium_memzero(text, sizeof text);
        if (r < 0) {
                peer_keys_wipe(&k);
                return r;
        }
        *ret = k;
        peer_keys_wipe(&k);
        return 0;
}
