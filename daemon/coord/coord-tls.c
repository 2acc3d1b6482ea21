/* coord-tls.c: the channel credentials: plaintext, or TLS with a CA and an optional client pair. */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <grpc/grpc_security.h>

#include "coord-private.h"
#include "common/log.h"

/* A PEM file, NUL-terminated, at most COORD_MAX_PEM_BYTES. */
static int pem_read(const char *path, char **ret) {
        _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
        _cleanup_free_ char *buf = NULL;
        struct stat st;
        size_t n = 0;

        if (fd < 0)
                return log_error_errno(-errno, "Failed to open %s: %m", path);
        if (fstat(fd, &st) < 0)
                return log_error_errno(-errno, "Failed to stat %s: %m", path);
        if (!S_ISREG(st.st_mode) || st.st_size > (off_t) COORD_MAX_PEM_BYTES)
                return log_error_errno(-EINVAL, "%s is not a regular file of at most %u bytes",
                                       path, COORD_MAX_PEM_BYTES);
        buf = malloc((size_t) st.st_size + 1);
        if (!buf)
                return -ENOMEM;
        while (n < (size_t) st.st_size) {
                ssize_t k = read(fd, buf + n, (size_t) st.st_size - n);

                if (k < 0)
                        return log_error_errno(-errno, "Failed to read %s: %m", path);
                if (k == 0)
                        break;
                n += (size_t) k;
        }
        buf[n] = '\0';
        if (!strstr(buf, "-----BEGIN "))
                return log_error_errno(-EINVAL, "%s holds no PEM block", path);
        *ret = TAKE_PTR(buf);
        return 0;
}

int coord_credentials_new(const CoordOptions *o, grpc_channel_credentials **ret) {
        _cleanup_free_ char *ca = NULL, *cert = NULL, *key = NULL;
        grpc_ssl_pem_key_cert_pair pair;
        int r;

        if (!o->tls_ca_path) {
                if (o->tls_cert_path || o->tls_key_path)
                        return -EINVAL;
                *ret = grpc_insecure_credentials_create();
                return *ret ? 0 : -ENOMEM;
        }
        if (!o->tls_cert_path != !o->tls_key_path)
                return -EINVAL; /* a certificate needs its key, and the other way round */
        r = pem_read(o->tls_ca_path, &ca);
        if (r < 0)
                return r;
        if (o->tls_cert_path) {
                r = pem_read(o->tls_cert_path, &cert);
                if (r < 0)
                        return r;
                r = pem_read(o->tls_key_path, &key);
                if (r < 0)
                        return r;
        }
        pair = (grpc_ssl_pem_key_cert_pair) { .private_key = key, .cert_chain = cert };
        *ret = grpc_ssl_credentials_create(ca, cert ? &pair : NULL, NULL, NULL);
        if (key)
                explicit_bzero(key, strlen(key));
        return *ret ? 0 : -ENOMEM;
}
