/* codec-record.c: state records: the container (header, CRC-32C, sections), build and mesh. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>

#include "codec-record.h"
#include "codec.h"
#include "common/crc32c.h"
#include "core/build-table.h"
#include "core/resource-limits.h"

#define MAGIC "FAMILYDS"

enum {
        SECTION_BUILD = 1,
        SECTION_MESH = 2,
        SECTION_GROUP = 3,
        SECTION_DTYPE = 4,
        SECTION_SEED = 5,
        SECTION_CREATED = 6,
        SECTION_REPLICAS = 7,
        _SECTION_MAX,
};

static void put32(uint8_t *p, uint32_t v) {
        for (unsigned i = 0; i < 4; i++)
                p[i] = (uint8_t) (v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v) {
        for (unsigned i = 0; i < 8; i++)
                p[i] = (uint8_t) (v >> (8 * i));
}

static uint32_t get32(const uint8_t *p) {
        uint32_t v = 0;
        for (unsigned i = 0; i < 4; i++)
                v |= (uint32_t) p[i] << (8 * i);
        return v;
}

static uint64_t get64(const uint8_t *p) {
        uint64_t v = 0;
        for (unsigned i = 0; i < 8; i++)
                v |= (uint64_t) p[i] << (8 * i);
        return v;
}

/* ---- writing --------------------------------------------------------------------------- */

typedef struct Section {
        uint32_t tag;
        const void *data;
        size_t size;
} Section;

static int record_write(StateRecordKind kind, const Section *s, size_t n, uint8_t **ret,
                        size_t *ret_size) {
        size_t body = 0;

        for (size_t i = 0; i < n; i++) {
                if (s[i].size > UINT32_MAX)
                        return -E2BIG;
                body += 8 + s[i].size;
        }
        if (body > STATE_RECORD_MAX_BYTES)
                return -E2BIG;

        uint8_t *buf = malloc(STATE_RECORD_HEADER_SIZE + body);
        if (!buf)
                return -ENOMEM;
        memcpy(buf, MAGIC, 8);
        put32(buf + 8, STATE_RECORD_VERSION);
        put32(buf + 12, (uint32_t) kind);
        put64(buf + 16, body);
        put32(buf + 28, 0);

        uint8_t *p = buf + STATE_RECORD_HEADER_SIZE;
        for (size_t i = 0; i < n; i++) {
                put32(p, s[i].tag);
                put32(p + 4, (uint32_t) s[i].size);
                if (s[i].size > 0)
                        memcpy(p + 8, s[i].data, s[i].size);
                p += 8 + s[i].size;
        }
        uint32_t crc = crc32c(0, buf, 24);
        put32(buf + 24, crc32c(crc, buf + STATE_RECORD_HEADER_SIZE, body));

        *ret = buf;
        *ret_size = STATE_RECORD_HEADER_SIZE + body;
        return 0;
}

/* A protobuf message packed into the arena. */
static int pack(Arena *a, const ProtobufCMessage *m, Section *ret) {
        size_t n = protobuf_c_message_get_packed_size(m);
        uint8_t *p = arena_alloc(a, n ? n : 1);
        if (!p)
                return -ENOMEM;
        ret->data = p;
        ret->size = protobuf_c_message_pack(m, p);
        return 0;
}

/* The REPLICAS section: (rank, primary) pairs, by increasing rank, each primary earlier. */
static int replicas_encode(Arena *a, const CodecBuild *b, const RecordReplica *replicas,
                           size_t n, Section *ret) {
        uint8_t *p = arena_alloc(a, n * 8 + 1);

        if (!p)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                const RecordReplica *x = &replicas[i];
                if (x->rank >= b->n_ranks || x->primary >= x->rank ||
                    (i > 0 && x->rank <= replicas[i - 1].rank))
                        return -EINVAL;
                put32(p + 8 * i, x->rank);
                put32(p + 8 * i + 4, x->primary);
        }
        *ret = (Section) { SECTION_REPLICAS, p, n * 8 };
        return 0;
}

int codec_record_encode_build(const char *id, const CodecBuild *b, const RecordReplica *replicas,
                              size_t n_replicas, uint64_t created_ns, uint8_t **ret,
                              size_t *ret_size) {
        _cleanup_(arena_done) Arena a;
        Familyd__V1__Build *pb = NULL;
        Familyd__V1__Mesh *pm = NULL;
        uint8_t seed[8], created[8];
        const char *dtype = dtype_to_string(b->dtype);
        Section s[_SECTION_MAX];
        size_t n = 0;
        int r;

        arena_init(&a);
        if (!dtype || !b->group || strlen(b->group) != CODEC_TOKEN_LENGTH ||
            (n_replicas > 0 && (!replicas || n_replicas >= b->n_ranks)))
                return -EINVAL;
        r = codec_build_encode(&a, id, b, "", &pb);
        if (r < 0)
                return r;
        s[n].tag = SECTION_BUILD;
        r = pack(&a, &pb->base, &s[n++]);
        if (r < 0)
                return r;
        if (b->plan->mesh) {
                r = codec_mesh_encode(&a, b->plan->mesh, &pm);
                if (r < 0)
                        return r;
                s[n].tag = SECTION_MESH;
                r = pack(&a, &pm->base, &s[n++]);
                if (r < 0)
                        return r;
        }
        put64(seed, b->seed);
        put64(created, created_ns);
        s[n++] = (Section) { SECTION_GROUP, b->group, CODEC_TOKEN_LENGTH };
        s[n++] = (Section) { SECTION_DTYPE, dtype, strlen(dtype) };
        s[n++] = (Section) { SECTION_SEED, seed, sizeof seed };
        s[n++] = (Section) { SECTION_CREATED, created, sizeof created };
        /* None: the record is as records were before replicas. */
        if (n_replicas > 0) {
                r = replicas_encode(&a, b, replicas, n_replicas, &s[n++]);
                if (r < 0)
                        return r;
        }
        return record_write(STATE_RECORD_BUILD, s, n, ret, ret_size);
}

int codec_record_encode_mesh(const Mesh *m, uint64_t created_ns, uint8_t **ret,
                             size_t *ret_size) {
        _cleanup_(arena_done) Arena a;
        Familyd__V1__Mesh *pm = NULL;
        uint8_t created[8];
        Section s[2];
        int r;

        arena_init(&a);
        r = codec_mesh_encode(&a, m, &pm);
        if (r < 0)
                return r;
        s[0].tag = SECTION_MESH;
        r = pack(&a, &pm->base, &s[0]);
        if (r < 0)
                return r;
        put64(created, created_ns);
        s[1] = (Section) { SECTION_CREATED, created, sizeof created };
        return record_write(STATE_RECORD_MESH, s, 2, ret, ret_size);
}

/* ---- reading --------------------------------------------------------------------------- */

typedef struct Why {
        char *buf;
        size_t size;
} Why;

static int bad(Why *w, int error, const char *format, ...) _printf_(3, 4);
static int bad(Why *w, int error, const char *format, ...) {
        va_list ap;

        if (w->size > 0) {
                va_start(ap, format);
                (void) vsnprintf(w->buf, w->size, format, ap);
                va_end(ap);
                /* Names from a damaged record may hold any byte; logs get printable ASCII. */
                for (char *c = w->buf; *c; c++)
                        if ((unsigned char) *c < 0x20 || (unsigned char) *c >= 0x7f)
                                *c = '?';
        }
        return error;
}

#define CORRUPT(w, ...) bad((w), -EBADMSG, __VA_ARGS__)

void codec_record_build_free(RecordBuild *b) {
        if (!b)
                return;
        for (size_t i = 0; i < b->n_ranks; i++)
                free(b->ranks[i].node);
        free(b->ranks);
        layout_done(&b->layout);
        build_plan_done(&b->plan);
        free(b);
}

void codec_record_done(StateRecord *r) {
        if (!r)
                return;
        free(r->id);
        mesh_unref(r->mesh);
        codec_record_build_free(r->build);
        *r = (StateRecord) {};
}

static int values_decode(void *const *entries, size_t n, ValueMap *ret, Why *w) {
        _cleanup_(value_map_done) ValueMap m = {};

        for (size_t i = 0; i < n; i++) {
                const CodecValueEntry *e = entries[i];
                FamilyError err = FAMILY_ERROR_NULL;
                Value v;
                int r;

                r = codec_value_decode(e->value, &v, &err);
                family_error_done(&err);
                if (r == -ENOMEM)
                        return r;
                if (r < 0)
                        return CORRUPT(w, "a value of '%s' cannot be read", e->key);
                r = value_map_put(&m, e->key, &v);
                if (r < 0) {
                        value_done(&v);
                        return r;
                }
        }
        *ret = m;
        m = (ValueMap) {};
        return 0;
}

static int int64_copy(const int64_t *src, size_t n, int64_t **ret) {
        *ret = NULL;
        if (n == 0)
                return 0;
        *ret = malloc(n * sizeof(int64_t));
        if (!*ret)
                return -ENOMEM;
        memcpy(*ret, src, n * sizeof(int64_t));
        return 0;
}

static int plan_decode(const Familyd__V1__Build *pb, BuildPlan *plan, Why *w) {
        const Familyd__V1__FamilyBuildInfo *info = pb->info;
        const Familyd__V1__ResolvedFamily *res;
        FamilyError err = FAMILY_ERROR_NULL;
        int r;

        if (!info || !info->request || !info->resolved || !info->layout)
                return CORRUPT(w, "the build has no provenance or layout");

        r = codec_resolve_request_decode(info->request, &plan->request, &err);
        family_error_done(&err);
        if (r == -ENOMEM)
                return r;
        if (r < 0)
                return CORRUPT(w, "the build's request cannot be read");

        res = info->resolved;
        plan->resolved.family = strdup(res->family);
        plan->resolved.variant = strdup(res->variant);
        plan->resolved.constructor = strdup(res->constructor);
        plan->module_fqn = strdup("");
        if (!plan->resolved.family || !plan->resolved.variant || !plan->resolved.constructor ||
            !plan->module_fqn)
                return -ENOMEM;
        r = values_decode((void *const *) res->arguments, res->n_arguments,
                          &plan->resolved.arguments, w);
        if (r < 0)
                return r;
        r = values_decode((void *const *) res->selectors, res->n_selectors,
                          &plan->resolved.selectors, w);
        if (r < 0)
                return r;
        for (Axis x = 0; x < _AXIS_MAX; x++)
                plan->resolved.axis_size[x] = 1;
        for (size_t i = 0; i < res->n_axis_sizes; i++) {
                Axis x = axis_from_string(res->axis_sizes[i]->key);
                if (x >= 0)
                        plan->resolved.axis_size[x] = res->axis_sizes[i]->value;
        }

        if (info->config_snapshot) {
                plan->has_config = true;
                r = values_decode((void *const *) info->config_snapshot->fields,
                                  info->config_snapshot->n_fields, &plan->config, w);
                if (r < 0)
                        return r;
        }

        if (streq(info->origin, build_origin_to_string(BUILD_ORIGIN_DIRECT)))
                plan->origin = BUILD_ORIGIN_DIRECT;
        else if (streq(info->origin, build_origin_to_string(BUILD_ORIGIN_REPLACEMENT)))
                plan->origin = BUILD_ORIGIN_REPLACEMENT;
        else
                return CORRUPT(w, "the build's origin '%.32s' is unknown", info->origin);
        plan->reset_after_materialization = info->reset_after_materialization;

        if (info->layout->activations) {
                _cleanup_(arena_done) Arena a;
                FamilyError e = FAMILY_ERROR_NULL;
                ActivationLayout borrowed;

                arena_init(&a);
                r = codec_activation_layout_decode(&a, info->layout->activations, &borrowed, &e);
                family_error_done(&e);
                if (r == -ENOMEM)
                        return r;
                if (r < 0)
                        return CORRUPT(w, "the build's activation layout cannot be read");
                r = activation_layout_copy(&borrowed, &plan->activations);
                if (r < 0)
                        return r;
                plan->has_activations = true;
        }
        return 0;
}

static const MeshView *view_of(const Mesh *mesh, LayoutView v) {
        if (!mesh)
                return NULL;
        return v == LAYOUT_VIEW_EXPERT ? &mesh->spec.expert : &mesh->spec.device;
}

static int parameter_decode(const Familyd__V1__ParameterLayout *pb, const Mesh *mesh,
                            Dtype dtype, ParameterLayout *p, Why *w) {
        uint64_t n = 1;
        int r;

        if (pb->n_shape > FAMILYD_MAX_SHAPE_RANK || pb->n_placements > LAYOUT_MAX_PLACEMENTS)
                return CORRUPT(w, "parameter '%.64s' has too many dimensions or placements",
                               pb->name);
        p->name = strdup(pb->name);
        if (!p->name)
                return -ENOMEM;
        r = int64_copy(pb->shape, pb->n_shape, &p->shape);
        if (r < 0)
                return r;
        p->n_dims = pb->n_shape;
        for (size_t d = 0; d < p->n_dims; d++)
                if (p->shape[d] < 0 || __builtin_mul_overflow(n, (uint64_t) p->shape[d], &n))
                        return CORRUPT(w, "parameter '%.64s' has a bad shape", pb->name);
        p->n_elements = n;

        /* Each parameter's own dtype; the build's where a record names none. */
        p->dtype = isempty(pb->dtype) ? dtype : dtype_from_string(pb->dtype);
        if (p->dtype < 0)
                return CORRUPT(w, "parameter '%.64s' has the unknown dtype '%.32s'", pb->name,
                               pb->dtype);

        if (!isempty(pb->checkpoint) && !(p->checkpoint = strdup(pb->checkpoint)))
                return -ENOMEM;
        p->view = layout_view_from_string(pb->mesh_view);
        if (p->view < 0 || (p->view == LAYOUT_VIEW_EXPERT && (!mesh || mesh->spec.expert.n == 0)))
                return CORRUPT(w, "parameter '%.64s' names no view of its mesh", pb->name);

        p->placements = calloc(pb->n_placements + 1, sizeof(Placement));
        p->axis_size = calloc(pb->n_placements + 1, sizeof(int64_t));
        if (!p->placements || !p->axis_size)
                return -ENOMEM;
        const MeshView *view = view_of(mesh, p->view);
        for (size_t i = 0; i < pb->n_placements; i++) {
                const Familyd__V1__Placement *e = pb->placements[i];
                Placement *pl = &p->placements[i];

                pl->axis = strdup(e->axis);
                if (!pl->axis)
                        return -ENOMEM;
                p->n_placements++;
                if (streq(e->kind, placement_kind_to_string(PLACEMENT_SHARD)))
                        pl->kind = PLACEMENT_SHARD;
                else if (streq(e->kind, placement_kind_to_string(PLACEMENT_REPLICATE)))
                        pl->kind = PLACEMENT_REPLICATE;
                else
                        return CORRUPT(w, "parameter '%.64s' has a placement of kind '%.32s'",
                                       pb->name, e->kind);
                if (pl->kind == PLACEMENT_SHARD && (e->dim < 0 || (size_t) e->dim >= p->n_dims))
                        return CORRUPT(w, "parameter '%.64s' is sharded on a dimension it lacks",
                                       pb->name);
                pl->dim = pl->kind == PLACEMENT_SHARD ? e->dim : 0;
                int64_t size = view ? mesh_view_dim_size(view, pl->axis) : 0;
                p->axis_size[i] = size > 0 ? size : 1;
        }
        return 0;
}

/* A slice's byte_length is its element count times its parameter's element size. */
static bool slice_length_matches(const Familyd__V1__ShardSlice *e, const ParameterLayout *p) {
        uint64_t n = dtype_size(p->dtype);

        for (size_t d = 0; d < p->n_dims; d++)
                if (e->local_shape[d] < 0 ||
                    __builtin_mul_overflow(n, (uint64_t) e->local_shape[d], &n))
                        return false;
        return n == e->byte_length;
}

static int layout_decode(const Familyd__V1__Build *pb, const Mesh *mesh, Dtype dtype,
                         Layout *l, Why *w) {
        const Familyd__V1__Layout *pl = pb->info->layout;
        const MeshSpec *spec = mesh ? &mesh->spec : NULL;
        const char *mesh_id = mesh ? mesh->id : NULL;
        size_t n_ranks = spec ? spec->n_ranks : 1;
        int r;

        if (!streq(strempty(pl->mesh_id), strempty(mesh_id)))
                return CORRUPT(w, "the layout's mesh '%.64s' is not the build's mesh",
                               pl->mesh_id);
        if (pl->n_parameters > LAYOUT_MAX_PARAMETERS)
                return CORRUPT(w, "the layout has too many parameters");
        if (pb->n_shards != n_ranks)
                return CORRUPT(w, "the build has %zu ranks, its mesh %zu", pb->n_shards,
                               n_ranks);

        l->align = LAYOUT_MIN_ALIGN;
        if (mesh) {
                l->mesh_id = strdup(mesh_id);
                if (!l->mesh_id)
                        return -ENOMEM;
        }
        l->parameters = calloc(pl->n_parameters + 1, sizeof(ParameterLayout));
        if (!l->parameters)
                return -ENOMEM;
        for (size_t i = 0; i < pl->n_parameters; i++) {
                r = parameter_decode(pl->parameters[i], mesh, dtype, &l->parameters[i], w);
                l->n_parameters++;
                if (r < 0)
                        return r;
        }
        r = layout_ranks_new(l, spec);
        if (r == -E2BIG)
                return CORRUPT(w, "the layout is too large");
        if (r < 0)
                return r;

        for (size_t k = 0; k < n_ranks; k++) {
                const Familyd__V1__RankShard *s = pb->shards[k];
                RankLayout *rl = &l->ranks[k];
                uint64_t end = 0;

                if (s->rank != rl->rank)
                        return CORRUPT(w, "rank %" PRId64 " is not the mesh's rank at %zu",
                                       s->rank, k);
                if (s->n_slices != l->n_parameters || s->size_bytes > (uint64_t) INT64_MAX)
                        return CORRUPT(w, "rank %" PRId64 " does not match the layout", s->rank);
                rl->size_bytes = s->size_bytes;
                for (size_t i = 0; i < s->n_slices; i++) {
                        const Familyd__V1__ShardSlice *e = s->slices[i];
                        const ParameterLayout *p = &l->parameters[i];
                        ShardSlice *sl = &rl->slices[i];

                        if (!streq(e->parameter, p->name) || e->n_local_shape != p->n_dims ||
                            e->n_global_offset != p->n_dims ||
                            __builtin_add_overflow(e->byte_offset, e->byte_length, &end) ||
                            end > s->size_bytes)
                                return CORRUPT(w, "rank %" PRId64 " has a bad slice of '%.64s'",
                                               s->rank, p->name);
                        if (!slice_length_matches(e, p))
                                return CORRUPT(w, "rank %" PRId64 " has a slice of '%.64s' whose "
                                               "bytes do not match its shape and dtype",
                                               s->rank, p->name);
                        memcpy(sl->local_shape, e->local_shape, p->n_dims * sizeof(int64_t));
                        memcpy(sl->global_offset, e->global_offset, p->n_dims * sizeof(int64_t));
                        sl->byte_offset = e->byte_offset;
                        sl->byte_length = e->byte_length;
                }
                if (__builtin_add_overflow(l->total_bytes, rl->size_bytes, &l->total_bytes))
                        return CORRUPT(w, "the layout's sizes overflow");
        }
        return 0;
}

static int ranks_decode(const Familyd__V1__Build *pb, RecordBuild *b, Why *w) {
        uint64_t bytes = 0;

        b->ranks = calloc(pb->n_shards + 1, sizeof(RecordBuildRank));
        if (!b->ranks)
                return -ENOMEM;
        for (size_t i = 0; i < pb->n_shards; i++) {
                const Familyd__V1__RankShard *s = pb->shards[i];
                RecordBuildRank *rs = &b->ranks[i];

                rs->node = strdup(s->node);
                if (!rs->node)
                        return -ENOMEM;
                b->n_ranks++;
                rs->local_device = s->local_device;
                rs->device_kind = streq_ptr(s->device_kind, CODEC_DEVICE_KIND_CUDA)
                                          ? CODEC_DEVICE_KIND_CUDA
                                          : CODEC_DEVICE_KIND_HOST;
                if (isempty(s->token))
                        continue;
                if (!codec_token_is_valid(s->token) || s->size_bytes == 0)
                        return CORRUPT(w, "rank %" PRId64 " has a bad token", s->rank);
                /* GPU shards are never kept (daemon/build/build-keep.c): whatever descriptor
                 * comes with this name, it is not a memfd to re-adopt. */
                if (!streq(rs->device_kind, CODEC_DEVICE_KIND_HOST))
                        return CORRUPT(w,
                                       "rank %" PRId64 " is in GPU memory (%s), which is never "
                                       "kept across restarts",
                                       s->rank, rs->device_kind);
                rs->size_bytes = s->size_bytes;
                memcpy(rs->token, s->token, CODEC_TOKEN_LENGTH + 1);
                if (__builtin_add_overflow(bytes, s->size_bytes, &bytes))
                        return CORRUPT(w, "the build's sizes overflow");
        }
        b->bytes = bytes;
        return 0;
}

/* Ids name files and fd store entries: "bld-", then letters, digits and '-' only. */
static bool id_is_valid(const char *id) {
        size_t n = strlen(id);

        if (n <= 4 || n >= BUILD_TABLE_ID_MAX || strncmp(id, "bld-", 4) != 0)
                return false;
        for (size_t i = 4; i < n; i++)
                if (!((id[i] >= '0' && id[i] <= '9') || (id[i] >= 'a' && id[i] <= 'z') ||
                      id[i] == '-'))
                        return false;
        return true;
}

typedef struct Sections {
        const uint8_t *data[_SECTION_MAX];
        size_t size[_SECTION_MAX];
        bool present[_SECTION_MAX];
} Sections;

static int sections_read(const uint8_t *data, size_t size, StateRecordKind *ret_kind,
                         Sections *ret, Why *w) {
        Sections s = {};

        if (size < STATE_RECORD_HEADER_SIZE || memcmp(data, MAGIC, 8) != 0)
                return CORRUPT(w, "not a familyd state record (%zu bytes, no header)", size);
        uint32_t version = get32(data + 8), kind = get32(data + 12);
        uint64_t body = get64(data + 16);
        if (body > STATE_RECORD_MAX_BYTES || body != size - STATE_RECORD_HEADER_SIZE)
                return CORRUPT(w, "the record is %zu bytes, its header says %" PRIu64, size,
                               body + STATE_RECORD_HEADER_SIZE);
        uint32_t crc = crc32c(crc32c(0, data, 24), data + STATE_RECORD_HEADER_SIZE, body);
        if (crc != get32(data + 24))
                return CORRUPT(w, "checksum mismatch (CRC-32C %08" PRIx32 ", expected %08" PRIx32
                                  ")",
                               crc, get32(data + 24));
        if (version != STATE_RECORD_VERSION)
                return bad(w, -EPROTONOSUPPORT,
                           "record version %" PRIu32 ", this familyd reads version %u", version,
                           STATE_RECORD_VERSION);
        if (kind != STATE_RECORD_BUILD && kind != STATE_RECORD_MESH)
                return bad(w, -EPROTONOSUPPORT, "record kind %" PRIu32 " is unknown", kind);

        const uint8_t *p = data + STATE_RECORD_HEADER_SIZE, *end = data + size;
        while (p < end) {
                if ((size_t) (end - p) < 8)
                        return CORRUPT(w, "a section header is cut off");
                uint32_t tag = get32(p), len = get32(p + 4);
                p += 8;
                if ((size_t) (end - p) < len)
                        return CORRUPT(w, "section %" PRIu32 " is cut off", tag);
                if (tag > 0 && tag < _SECTION_MAX) {
                        if (s.present[tag])
                                return CORRUPT(w, "section %" PRIu32 " appears twice", tag);
                        s.present[tag] = true;
                        s.data[tag] = p;
                        s.size[tag] = len;
                }
                p += len;
        }
        if (!s.present[SECTION_CREATED] || s.size[SECTION_CREATED] != 8)
                return CORRUPT(w, "the record has no creation time");

        *ret_kind = (StateRecordKind) kind;
        *ret = s;
        return 0;
}

static int mesh_section_decode(const Sections *s, StateRecord *rec, Why *w) {
        _cleanup_(mesh_spec_done) MeshSpec spec = {};
        Familyd__V1__Mesh *pm;
        FamilyError err = FAMILY_ERROR_NULL;
        int64_t world = 0;
        int r;

        pm = familyd__v1__mesh__unpack(NULL, s->size[SECTION_MESH], s->data[SECTION_MESH]);
        if (!pm)
                return CORRUPT(w, "the mesh section cannot be decoded");
        r = codec_mesh_spec_decode(pm, &spec, &err);
        /* Its ranks are filled in: the world it needs is its largest rank + 1 (the topology of
         * this start may not know every node yet, so it is not asked). */
        for (size_t i = 0; r >= 0 && i < spec.n_ranks; i++)
                if (spec.ranks[i] >= world && spec.ranks[i] < INT64_MAX)
                        world = spec.ranks[i] + 1;
        if (r >= 0 && spec.n_ranks == 0)
                r = -EINVAL;
        if (r >= 0)
                r = mesh_new(&spec, world, &rec->mesh, &err);
        if (r >= 0 && !streq(rec->mesh->id, pm->mesh_id))
                r = CORRUPT(w, "the mesh's content gives the id %s, the record says %.64s",
                            rec->mesh->id, pm->mesh_id);
        else if (r < 0 && r != -ENOMEM)
                r = CORRUPT(w, "the mesh section is not a valid mesh%s%s",
                            family_error_is_set(&err) ? ": " : "", strempty(err.message));
        family_error_done(&err);
        familyd__v1__mesh__free_unpacked(pm, NULL);
        return r;
}

/* The registry digest ("" in records older than digests) and writability. */
static int digest_decode(const Familyd__V1__Build *pb, RecordBuild *b, Why *w) {
        size_t n = strlen(strempty(pb->registry_digest));

        if (n != 0 && n != REGISTRY_DIGEST_LENGTH)
                return CORRUPT(w, "the build's registry digest has %zu characters", n);
        for (size_t i = 0; i < n; i++)
                if (!strchr("0123456789abcdef", pb->registry_digest[i]))
                        return CORRUPT(w, "the build's registry digest is not lower-case hex");
        memcpy(b->registry_digest, strempty(pb->registry_digest), n + 1);
        b->writable = pb->writable;
        return 0;
}

/* Which ranks share another's segment; the build's bytes count each segment once. */
static int replicas_decode(const Sections *s, RecordBuild *b, Why *w) {
        const uint8_t *p = s->data[SECTION_REPLICAS];
        size_t n = s->size[SECTION_REPLICAS] / 8;

        if (!s->present[SECTION_REPLICAS])
                return 0;
        if (s->size[SECTION_REPLICAS] % 8 != 0 || n == 0 || n >= b->n_ranks)
                return CORRUPT(w, "the build's replicas section has %zu bytes",
                               s->size[SECTION_REPLICAS]);
        if (b->writable)
                return CORRUPT(w, "a writable build has replicas");
        for (size_t i = 0; i < n; i++) {
                uint32_t rank = get32(p + 8 * i), primary = get32(p + 8 * i + 4);
                RecordBuildRank *rs;

                if (rank >= b->n_ranks || primary >= rank ||
                    (i > 0 && rank <= get32(p + 8 * (i - 1))))
                        return CORRUPT(w, "the build's replica %" PRIu32 " of %" PRIu32
                                          " is out of order",
                                       rank, primary);
                rs = &b->ranks[rank];
                if (isempty(rs->token) || isempty(b->ranks[primary].token) ||
                    b->ranks[primary].replica || rs->size_bytes != b->ranks[primary].size_bytes)
                        return CORRUPT(w, "the build's rank at %" PRIu32 " cannot share the "
                                          "segment of the rank at %" PRIu32,
                                       rank, primary);
                rs->replica = true;
                rs->primary = primary;
                b->bytes -= rs->size_bytes;
        }
        return 0;
}

static int build_sections_decode(const Sections *s, StateRecord *rec, Why *w) {
        _cleanup_free_ char *dtype_name = NULL;
        Familyd__V1__Build *pb;
        RecordBuild *b;
        int r;

        if (!s->present[SECTION_BUILD] || !s->present[SECTION_GROUP] ||
            !s->present[SECTION_DTYPE] || !s->present[SECTION_SEED])
                return CORRUPT(w, "a build record without its build, group, dtype or seed");
        if (s->size[SECTION_GROUP] != CODEC_TOKEN_LENGTH || s->size[SECTION_SEED] != 8 ||
            s->size[SECTION_DTYPE] > 32)
                return CORRUPT(w, "a build record with a bad group, dtype or seed");

        b = calloc(1, sizeof *b);
        if (!b)
                return -ENOMEM;
        rec->build = b;
        memcpy(b->group, s->data[SECTION_GROUP], CODEC_TOKEN_LENGTH);
        b->group[CODEC_TOKEN_LENGTH] = 0;
        if (!codec_token_is_valid(b->group))
                return CORRUPT(w, "the build's group is not a token");
        dtype_name = strndup((const char *) s->data[SECTION_DTYPE], s->size[SECTION_DTYPE]);
        if (!dtype_name)
                return -ENOMEM;
        b->dtype = dtype_from_string(dtype_name);
        if (b->dtype < 0)
                return CORRUPT(w, "the build's dtype '%s' is unknown", dtype_name);
        b->seed = get64(s->data[SECTION_SEED]);

        if (s->present[SECTION_MESH]) {
                r = mesh_section_decode(s, rec, w);
                if (r < 0)
                        return r;
        }

        pb = familyd__v1__build__unpack(NULL, s->size[SECTION_BUILD], s->data[SECTION_BUILD]);
        if (!pb)
                return CORRUPT(w, "the build section cannot be decoded");
        r = 0;
        if (!id_is_valid(pb->build_id))
                r = CORRUPT(w, "the build's id is not one familyd gives");
        if (r >= 0 && !(rec->id = strdup(pb->build_id)))
                r = -ENOMEM;
        if (r >= 0)
                r = plan_decode(pb, &b->plan, w);
        if (r >= 0)
                r = digest_decode(pb, b, w);
        if (r >= 0)
                r = layout_decode(pb, rec->mesh, b->dtype, &b->layout, w);
        if (r >= 0)
                r = ranks_decode(pb, b, w);
        if (r >= 0)
                r = replicas_decode(s, b, w);
        familyd__v1__build__free_unpacked(pb, NULL);
        return r;
}

int codec_record_decode(const uint8_t *data, size_t size, StateRecord *ret, char *why,
                        size_t why_size) {
        _cleanup_(codec_record_done) StateRecord rec = {};
        Why w = { why, why_size };
        Sections s = {};
        int r;

        if (why_size > 0)
                why[0] = 0;
        r = sections_read(data, size, &rec.kind, &s, &w);
        if (r < 0)
                return r;
        rec.created_ns = get64(s.data[SECTION_CREATED]);

        if (rec.kind == STATE_RECORD_MESH) {
                if (!s.present[SECTION_MESH])
                        return CORRUPT(&w, "a mesh record without its mesh");
                r = mesh_section_decode(&s, &rec, &w);
                if (r < 0)
                        return r;
                rec.id = strdup(rec.mesh->id);
                if (!rec.id)
                        return -ENOMEM;
        } else {
                r = build_sections_decode(&s, &rec, &w);
                if (r < 0)
                        return r;
        }

        *ret = rec;
        rec = (StateRecord) {};
        return 0;
}
