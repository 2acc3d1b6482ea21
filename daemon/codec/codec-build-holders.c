/* codec-build-holders.c: a build's sharing key, and its references, pin and grace in Build. */
#include <stdlib.h>
#include <string.h>

#include "codec-build-holders.h"
#include "codec.h"

static int entry_cmp(const void *a, const void *b) {
        const CodecValueEntry *x = *(CodecValueEntry *const *) a, *y = *(CodecValueEntry *const *) b;
        return strcmp(strempty(x->key), strempty(y->key));
}

/* Map fields keep the order the client sent them in; the key must not: every map (a repeated
 * message "...Entry" whose field 1 is the string key) is sorted by key, at every depth. */
static void canonicalize(ProtobufCMessage *m) {
        const ProtobufCMessageDescriptor *d = m->descriptor;

        for (unsigned i = 0; i < d->n_fields; i++) {
                const ProtobufCFieldDescriptor *f = &d->fields[i];
                char *at = (char *) m + f->offset;

                if (f->type != PROTOBUF_C_TYPE_MESSAGE)
                        continue;
                if (f->label != PROTOBUF_C_LABEL_REPEATED) {
                        ProtobufCMessage *sub = *(ProtobufCMessage **) at;
                        if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF &&
                            *(uint32_t *) ((char *) m + f->quantifier_offset) != f->id)
                                continue;
                        if (sub)
                                canonicalize(sub);
                        continue;
                }
                size_t n = *(size_t *) ((char *) m + f->quantifier_offset);
                ProtobufCMessage **items = *(ProtobufCMessage ***) at;
                const ProtobufCMessageDescriptor *sd = f->descriptor;
                size_t len = strlen(sd->name);
                for (size_t j = 0; j < n; j++)
                        canonicalize(items[j]);
                if (n > 1 && len > 5 && streq(sd->name + len - 5, "Entry") && sd->n_fields == 2 &&
                    sd->fields[0].id == 1 && sd->fields[0].type == PROTOBUF_C_TYPE_STRING)
                        qsort(items, n, sizeof *items, entry_cmp);
        }
}

int codec_build_key(const CodecBuild *b, const char *const *extra, size_t n_extra, uint8_t **ret,
                    size_t *ret_size) {
        _cleanup_(arena_done) Arena a;
        Familyd__V1__Build *pb = NULL;
        CodecBuild view = *b;
        CodecBuildRank *ranks;
        uint8_t *out;
        size_t packed, size;
        int r;

        arena_init(&a);
        ranks = arena_alloc_array(&a, b->n_ranks ? b->n_ranks : 1, sizeof *ranks);
        if (!ranks)
                return -ENOMEM;
        for (size_t i = 0; i < b->n_ranks; i++) {
                ranks[i] = b->ranks[i];
                ranks[i].token = NULL;
                ranks[i].allocation_bytes = 0;
        }
        view.ranks = ranks;
        view.group = NULL;
        r = codec_build_encode(&a, "", &view, "", &pb);
        if (r < 0)
                return r;
        canonicalize(&pb->base);
        packed = protobuf_c_message_get_packed_size(&pb->base);
        size = sizeof(uint64_t) + packed;
        for (size_t i = 0; i < n_extra; i++)
                size += strlen(extra[i]) + 1;
        out = malloc(size);
        if (!out)
                return -ENOMEM;
        uint64_t n = packed;
        memcpy(out, &n, sizeof n);
        (void) protobuf_c_message_pack(&pb->base, out + sizeof n);
        size_t at = sizeof n + packed;
        for (size_t i = 0; i < n_extra; i++) {
                size_t len = strlen(extra[i]) + 1;
                memcpy(out + at, extra[i], len);
                at += len;
        }
        *ret = out;
        *ret_size = size;
        return 0;
}

int codec_build_holding_encode(Arena *a, const BuildHolding *h, Familyd__V1__Build *pb) {
        if (h->n_holders > 0 && !ARRAY_NEW(a, pb->references, h->n_holders))
                return -ENOMEM;
        for (size_t i = 0; i < h->n_holders; i++) {
                Familyd__V1__BuildReference *ref = MSG_NEW(a, Familyd__V1__BuildReference,
                                                           familyd__v1__build_reference__init);
                if (!ref)
                        return -ENOMEM;
                ref->pid = h->holders[i].pid;
                ref->uid = h->holders[i].uid;
                ref->since_unix_ms = h->holders[i].since_ms;
                pb->references[i] = ref;
        }
        pb->n_references = h->n_holders;
        pb->pinned = h->pinned;
        pb->grace_deadline_unix_ms = h->grace_deadline_ms;
        pb->writable = h->writable;
        pb->private_build = h->private_build;
        pb->created_unix_ms = h->created_ms;
        return 0;
}
