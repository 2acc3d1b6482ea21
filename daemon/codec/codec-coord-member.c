/* codec-coord-member.c: the member record in etcd, decoded with every field bounded. */
#include <stdlib.h>
#include <string.h>

#include "codec-coord-member.h"
#include "codec-text.h"
#include "familyd-coord-v1-member.pb-c.h"
#include "core/resource-limits.h"

void coord_member_done(CoordMember *m) {
        if (!m)
                return;
        free(m->name);
        free(m->ucx_address);
        for (size_t i = 0; i < m->n_devices; i++)
                device_done(&m->devices[i]);
        free(m->devices);
        *m = (CoordMember) {};
}

/* Anyone with write access to the prefix can put anything there (codec-text.h). */
static bool member_name_ok(const char *s) {
        return codec_text_ok(s, FAMILYD_MAX_NAME_LENGTH, false) && !strchr(s, '/');
}

bool coord_cluster_name_valid(const char *name) {
        size_t n = name ? strlen(name) : 0;

        return n > 0 && n <= COORD_MAX_CLUSTER_NAME &&
               strspn(name, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") == n;
}

static bool device_ok(const Familyd__Coord__V1__CoordDevice *pb, size_t index) {
        return pb && pb->local_index == (int32_t) index && pb->numa_node >= -1 &&
               codec_text_ok(pb->kind, 16, false) && codec_text_ok(pb->name, 256, true) &&
               codec_text_ok(pb->uuid, 128, true) && codec_text_ok(pb->pci_bus_id, 64, true);
}

static bool member_ok(const Familyd__Coord__V1__CoordMember *pb, const char *expected_name) {
        if (!member_name_ok(pb->name) || (expected_name && strcmp(pb->name, expected_name) != 0) ||
            pb->node_rank < -1 || pb->ucx_address.len > COORD_MEMBER_MAX_UCX_ADDRESS ||
            pb->n_devices > FAMILYD_MAX_NODE_DEVICES ||
            !node_registry_digest_valid(strempty(pb->registry_digest)) ||
            (!isempty(pb->cluster) && !coord_cluster_name_valid(pb->cluster)))
                return false;
        for (size_t i = 0; i < pb->n_devices; i++)
                if (!device_ok(pb->devices[i], i))
                        return false;
        return true;
}

static int member_copy(const Familyd__Coord__V1__CoordMember *pb, CoordMember *ret) {
        _cleanup_(coord_member_done) CoordMember m = {
                .node_rank = pb->node_rank,
                .boot_id = pb->boot_id,
                .started_unix_ms = pb->started_unix_ms,
        };
        int r;

        m.name = strdup(pb->name);
        if (!m.name)
                return -ENOMEM;
        strcpy(m.registry_digest, strempty(pb->registry_digest)); /* length checked */
        strcpy(m.cluster, strempty(pb->cluster));                 /* the same */
        if (pb->ucx_address.len > 0) {
                m.ucx_address = malloc(pb->ucx_address.len);
                if (!m.ucx_address)
                        return -ENOMEM;
                memcpy(m.ucx_address, pb->ucx_address.data, pb->ucx_address.len);
                m.ucx_address_size = pb->ucx_address.len;
        }
        if (pb->n_devices > 0) {
                m.devices = calloc(pb->n_devices, sizeof(Device));
                if (!m.devices)
                        return -ENOMEM;
        }
        for (size_t i = 0; i < pb->n_devices; i++) {
                const Familyd__Coord__V1__CoordDevice *d = pb->devices[i];

                r = device_copy(&(Device) {
                                        .local_index = d->local_index,
                                        .kind = d->kind,
                                        .name = d->name,
                                        .uuid = d->uuid,
                                        .memory_bytes = d->memory_bytes,
                                        .numa_node = d->numa_node,
                                        .pci_bus_id = d->pci_bus_id,
                                },
                                &m.devices[i]);
                if (r < 0)
                        return r;
                m.n_devices++;
        }
        *ret = m;
        m = (CoordMember) {};
        return 0;
}

int codec_coord_member_decode(const uint8_t *data, size_t size, const char *expected_name,
                              CoordMember *ret) {
        Familyd__Coord__V1__CoordMember *pb;
        int r;

        /* The largest valid record is far below this: devices' strings are bounded too. */
        if (size > 1024u * 1024u)
                return -EBADMSG;
        pb = familyd__coord__v1__coord_member__unpack(NULL, size, data);
        if (!pb)
                return -EBADMSG;
        r = member_ok(pb, expected_name) ? member_copy(pb, ret) : -EBADMSG;
        familyd__coord__v1__coord_member__free_unpacked(pb, NULL);
        return r;
}

int codec_coord_member_encode(const CoordMember *m, uint8_t **ret, size_t *ret_size) {
        Familyd__Coord__V1__CoordMember pb = FAMILYD__COORD__V1__COORD_MEMBER__INIT;
        _cleanup_free_ Familyd__Coord__V1__CoordDevice *devs = NULL;
        _cleanup_free_ Familyd__Coord__V1__CoordDevice **dev_ptrs = NULL;
        uint8_t *buf;
        size_t n;

        if (!m || m->n_devices > FAMILYD_MAX_NODE_DEVICES)
                return -EINVAL;
        if (m->n_devices > 0) {
                devs = calloc(m->n_devices, sizeof(*devs));
                dev_ptrs = calloc(m->n_devices, sizeof(*dev_ptrs));
                if (!devs || !dev_ptrs)
                        return -ENOMEM;
        }
        for (size_t i = 0; i < m->n_devices; i++) {
                const Device *d = &m->devices[i];

                devs[i] = (Familyd__Coord__V1__CoordDevice) FAMILYD__COORD__V1__COORD_DEVICE__INIT;
                devs[i].local_index = d->local_index;
                devs[i].kind = d->kind ?: (char *) "";
                devs[i].name = d->name ?: (char *) "";
                devs[i].uuid = d->uuid ?: (char *) "";
                devs[i].memory_bytes = d->memory_bytes;
                devs[i].numa_node = d->numa_node;
                devs[i].pci_bus_id = d->pci_bus_id ?: (char *) "";
                dev_ptrs[i] = &devs[i];
        }
        pb.name = m->name;
        pb.node_rank = m->node_rank;
        pb.boot_id = m->boot_id;
        pb.started_unix_ms = m->started_unix_ms;
        pb.ucx_address = (ProtobufCBinaryData) { .data = m->ucx_address, .len = m->ucx_address_size };
        pb.n_devices = m->n_devices;
        pb.devices = dev_ptrs;
        pb.registry_digest = (char *) m->registry_digest;
        pb.cluster = (char *) m->cluster;
        if (!member_ok(&pb, NULL))
                return -EINVAL;
        n = familyd__coord__v1__coord_member__get_packed_size(&pb);
        buf = malloc(MAX(n, (size_t) 1));
        if (!buf)
                return -ENOMEM;
        (void) familyd__coord__v1__coord_member__pack(&pb, buf);
        *ret = buf;
        *ret_size = n;
        return 0;
}
