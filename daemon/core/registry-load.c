/* registry-load.c: registry_load: a directory of YAML files to an immutable Registry. */

/*
 * DESIGN
 *
 * Two stages per file. registry-yaml.c turns the text into a small tree of YNodes, rejecting
 * aliases, bounding nesting and node count, and keeping explicit tags and scalar styles. A schema
 * walker then fills Family structs in place, diagnosing every violation it can see and carrying
 * on with the siblings, so one Reload reports everything at once; a child's -EINVAL means
 * "diagnosed", anything else aborts.
 *
 * Diagnostics name a file by its entry name in the registry directory (the directory itself is
 * the registry path the operator configured), "name.yaml:line:column: context: text", 1-based.
 * Family.source uses the same name: "name.yaml:line". Problems with a whole file or the
 * directory have no position: "name.yaml: text".
 *
 * Scalars resolve like the YAML 1.2 core schema (see registry-yaml.c). Mapping keys are taken as
 * text. A null value is the wrong type wherever it appears.
 */

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "resource-limits.h"
#include "registry.h"
#include "registry-load.h"
#include "registry-yaml.h"
#include "repr.h"

/* ---- files and the directory ---- */

typedef struct FamilyList {
        Family *families;
        size_t n;
        size_t allocated;
        /* Where each family's baseline stands, for the cross-file uniqueness check. */
        struct BaselinePos {
                const char *file;
                unsigned line, column;
        } *pos;
        size_t allocated_pos;
} FamilyList;

static void family_list_done(FamilyList *fl) {
        for (size_t i = 0; i < fl->n; i++)
                family_done(&fl->families[i]);
        free(fl->families);
        free(fl->pos);
        *fl = (FamilyList) {};
}

static int load_one_family(Loader *l, const YNode *n, FamilyList *fl) {
        unsigned line = 0, column = 0;
        int r;

        if (fl->n >= FAMILYD_MAX_FAMILIES)
                return loader_diag(l, n, NULL, "more than %u families in the registry",
                                   FAMILYD_MAX_FAMILIES);
        if (!GREEDY_REALLOC(fl->families, fl->allocated, fl->n + 1) ||
            !GREEDY_REALLOC(fl->pos, fl->allocated_pos, fl->n + 1))
                return -ENOMEM;

        Family *f = &fl->families[fl->n];
        *f = (Family) { .parallel_axis = _AXIS_INVALID };
        fl->n++; /* owned by the list from here on, even half-filled */

        r = loader_family(l, n, f, &line, &column);
        fl->pos[fl->n - 1] = (struct BaselinePos) { .file = l->file, .line = line, .column = column };
        return r;
}

static int load_tree(Loader *l, const YNode *root, FamilyList *fl) {
        static const char *const list_keys[] = { "families" };
        const YNode *list = NULL;
        bool is_list = false;
        int acc = 0, r;

        if (!root)
                return 0; /* no document: a file of comments holds no family */

        if (root->kind != YNODE_MAPPING)
                return loader_diag(l, root, NULL,
                                   "a registry file holds one family (a mapping) or 'families:' with a list");

        for (size_t i = 0; i < ynode_n_pairs(root); i++) {
                const YNode *k = ynode_key(root, i);
                if (k->kind == YNODE_SCALAR && streq(k->text, "families"))
                        is_list = true;
        }
        if (!is_list)
                return load_one_family(l, root, fl);

        r = loader_fold(&acc, loader_map_fixed(l, root, NULL, list_keys, &list, 1));
        if (r < 0)
                return r;
        r = loader_expect_kind(l, list, NULL, "'families'", YNODE_SEQUENCE);
        if (r < 0)
                return r;
        for (size_t i = 0; i < list->n_items; i++) {
                r = loader_fold(&acc, load_one_family(l, list->items[i], fl));
                if (r < 0)
                        return r;
                if (l->truncated || fl->n >= FAMILYD_MAX_FAMILIES)
                        break;
        }
        return acc;
}

/*
 * Opens a registry file of the directory dir_fd, following symbolic links only while they stay
 * inside it (openat2 RESOLVE_BENEATH; an absolute link counts as leaving): a registry file may be
 * a link to another file of the directory, not to /etc/shadow. Without openat2 (kernels before
 * 5.6) a file that is itself a link is refused (O_NOFOLLOW). -EXDEV or -ELOOP for a link that
 * leaves, else the fd or -errno.
 */
static int open_beneath(int dir_fd, const char *name) {
        struct open_how how = {
                .flags = O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK,
                .resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS,
        };
        long fd = syscall(SYS_openat2, dir_fd, name, &how, sizeof(how));

        if (fd >= 0)
                return (int) fd;
        if (errno != ENOSYS)
                return -errno;
        fd = openat(dir_fd, name, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK | O_NOFOLLOW);
        return fd >= 0 ? (int) fd : -errno;
}

static int read_file(Loader *l, int dir_fd, const char *name, char **ret, size_t *ret_size) {
        _cleanup_close_ int fd = -1;
        _cleanup_free_ char *buf = NULL;
        size_t size = 0, allocated = 0;
        struct stat st;

        /* O_NONBLOCK: a FIFO named *.yaml must not hang the load; regular files ignore it. */
        fd = open_beneath(dir_fd, name);
        if (fd == -EXDEV || fd == -ELOOP)
                /* Never read, so nothing of the target reaches a message. */
                return loader_diag_at(l, 0, 0, NULL, "a symbolic link that leads outside the "
                                      "registry directory");
        if (fd < 0)
                return fd;
        if (fstat(fd, &st) < 0)
                return -errno;
        if (!S_ISREG(st.st_mode))
                return loader_diag_at(l, 0, 0, NULL, "not a regular file");
        if (st.st_size > (off_t) FAMILYD_MAX_REGISTRY_FILE_BYTES)
                return loader_diag_at(l, 0, 0, NULL, "file is larger than %u bytes",
                                      FAMILYD_MAX_REGISTRY_FILE_BYTES);

        /* Sized by fstat(), but read to the end and up to one byte past the limit: the file may
         * change between fstat() and read(). One byte is always kept for the NUL. */
        if (!GREEDY_REALLOC(buf, allocated, (size_t) st.st_size + 2))
                return -ENOMEM;
        while (size <= FAMILYD_MAX_REGISTRY_FILE_BYTES) {
                size_t room;
                ssize_t k;

                if (size + 1 >= allocated && !GREEDY_REALLOC(buf, allocated, size + 4096))
                        return -ENOMEM;
                room = allocated - size - 1;
                if (room > FAMILYD_MAX_REGISTRY_FILE_BYTES + 1 - size)
                        room = FAMILYD_MAX_REGISTRY_FILE_BYTES + 1 - size;
                k = read(fd, buf + size, room);
                if (k < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                if (k == 0)
                        break;
                size += (size_t) k;
        }
        if (size > FAMILYD_MAX_REGISTRY_FILE_BYTES)
                return loader_diag_at(l, 0, 0, NULL, "file is larger than %u bytes",
                                      FAMILYD_MAX_REGISTRY_FILE_BYTES);
        buf[size] = 0;

        *ret = TAKE_PTR(buf);
        *ret_size = size;
        return 0;
}

static bool is_registry_file(const char *name) {
        size_t n = strlen(name);

        if (name[0] == '.')
                return false;
        return (n > 5 && streq(name + n - 5, ".yaml")) || (n > 4 && streq(name + n - 4, ".yml"));
}

static int name_cmp(const void *a, const void *b) {
        return strcmp(*(char *const *) a, *(char *const *) b);
}

typedef struct NameList {
        char **names;
        size_t n;
        size_t allocated;
} NameList;

static void name_list_done(NameList *nl) {
        for (size_t i = 0; i < nl->n; i++)
                free(nl->names[i]);
        free(nl->names);
        *nl = (NameList) {};
}

static void closedirp(DIR **d) {
        if (*d)
                (void) closedir(*d);
}

static int list_directory(DIR *d, NameList *ret) {
        _cleanup_(name_list_done) NameList nl = {};

        for (;;) {
                struct dirent *de;

                errno = 0;
                de = readdir(d);
                if (!de) {
                        if (errno != 0)
                                return -errno;
                        break;
                }
                if (!is_registry_file(de->d_name))
                        continue;
                if (nl.n >= FAMILYD_MAX_REGISTRY_FILES)
                        return -E2BIG;
                if (!GREEDY_REALLOC(nl.names, nl.allocated, nl.n + 1))
                        return -ENOMEM;
                nl.names[nl.n] = strdup(de->d_name);
                if (!nl.names[nl.n])
                        return -ENOMEM;
                nl.n++;
        }

        /* Byte order of names, independent of the locale (not alphasort/strcoll). */
        if (nl.n > 1)
                qsort(nl.names, nl.n, sizeof(char *), name_cmp);
        *ret = nl;
        nl = (NameList) {};
        return 0;
}

static int baseline_index_cmp(const void *a, const void *b, void *userdata) {
        const Family *families = userdata;
        size_t x = *(const size_t *) a, y = *(const size_t *) b;
        int c = strcmp(families[x].baseline, families[y].baseline);
        if (c != 0)
                return c;
        return x < y ? -1 : x > y;
}

/* Every baseline once across the registry; the later registration is the one reported. */
static int check_baselines(LoadDiagnostics *diag, const FamilyList *fl, bool *truncated) {
        _cleanup_free_ size_t *idx = NULL;
        size_t n = 0;
        int acc = 0;

        idx = calloc(fl->n ? fl->n : 1, sizeof(size_t));
        if (!idx)
                return -ENOMEM;
        for (size_t i = 0; i < fl->n; i++)
                if (fl->families[i].baseline)
                        idx[n++] = i;
        qsort_r(idx, n, sizeof(size_t), baseline_index_cmp, fl->families);

        size_t first = 0;
        for (size_t i = 1; i < n; i++) {
                const Family *a = &fl->families[idx[first]], *b = &fl->families[idx[i]];
                const struct BaselinePos *pos = &fl->pos[idx[i]];
                Loader l = { .file = pos->file, .diag = diag };
                _cleanup_free_ char *ctx = NULL, *q = NULL;
                int r;

                if (!streq(a->baseline, b->baseline)) {
                        first = i;
                        continue;
                }
                ctx = b->name ? loader_ctx_push(NULL, "family", b->name) : strdup("family");
                q = repr_string(b->baseline);
                if (!ctx || !q)
                        return -ENOMEM;
                r = loader_diag_at(&l, pos->line, pos->column, ctx,
                                   "baseline %s is already registered (family at %s)", q, a->source);
                if (l.truncated)
                        *truncated = true;
                r = loader_fold(&acc, r);
                if (r < 0)
                        return r;
        }
        return acc;
}

int registry_load(const char *dir, uint64_t generation, Registry **ret, LoadDiagnostics *ret_diag) {
        _cleanup_(load_diagnostics_done) LoadDiagnostics diag = {};
        _cleanup_(family_list_done) FamilyList fl = {};
        _cleanup_(name_list_done) NameList names = {};
        _cleanup_(closedirp) DIR *d = NULL;
        bool truncated = false;
        int r = 0, failure = 0;

        if (!dir || !ret)
                return -EINVAL;

        d = opendir(dir);
        if (!d) {
                r = -errno;
                if (load_diagnostics_add(&diag, dir, 0, 0, "cannot open the registry directory: %m") < 0)
                        return -ENOMEM;
                goto finish;
        }
        r = list_directory(d, &names);
        if (r == -ENOMEM)
                return r;
        if (r == -E2BIG) {
                if (load_diagnostics_add(&diag, dir, 0, 0, "more than %u registry files",
                                         FAMILYD_MAX_REGISTRY_FILES) < 0)
                        return -ENOMEM;
                goto finish;
        }
        if (r < 0) {
                errno = -r;
                if (load_diagnostics_add(&diag, dir, 0, 0, "cannot read the registry directory: %m") < 0)
                        return -ENOMEM;
                goto finish;
        }

        for (size_t i = 0; i < names.n && !truncated; i++) {
                _cleanup_(ynode_freep) YNode *root = NULL;
                _cleanup_free_ char *buf = NULL;
                Loader l = { .file = names.names[i], .diag = &diag };
                size_t size = 0;

                r = read_file(&l, dirfd(d), names.names[i], &buf, &size);
                if (r >= 0)
                        r = ynode_parse(buf, size, loader_yaml_diag, &l, &root);
                if (r >= 0)
                        r = load_tree(&l, root, &fl);
                truncated = l.truncated;

                if (r == -ENOMEM)
                        return r;
                if (r < 0 && r != -EINVAL) {
                        /* A file that cannot be read is a diagnostic, and its errno the result. */
                        errno = -r;
                        if (load_diagnostics_add(&diag, names.names[i], 0, 0, "cannot read the file: %m") < 0)
                                return -ENOMEM;
                        if (failure == 0)
                                failure = r;
                }
        }

        if (!truncated) {
                r = check_baselines(&diag, &fl, &truncated);
                if (r == -ENOMEM)
                        return r;
        }
        if (truncated &&
            load_diagnostics_add(&diag, dir, 0, 0, "more than %u problems, stopped",
                                 LOAD_MAX_DIAGNOSTICS) < 0)
                return -ENOMEM;

finish:
        if (diag.n > 0) {
                if (ret_diag) {
                        load_diagnostics_done(ret_diag);
                        *ret_diag = diag;
                        diag = (LoadDiagnostics) {};
                }
                if (failure < 0)
                        return failure;
                return r < 0 && r != -EINVAL ? r : -EINVAL;
        }

        Registry *reg;
        r = registry_new(dir, generation, fl.families, fl.n, &reg);
        if (r < 0)
                return r;
        free(fl.pos);
        fl = (FamilyList) {};
        *ret = reg;
        return 0;
}
