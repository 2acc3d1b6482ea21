/* codec-coord-member.h: the member record under `members/<name>` in etcd, strictly bounded. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/topology.h"

#define COORD_MEMBER_MAX_UCX_ADDRESS 4096u
/* A cluster's name (--cluster): 1 to this many of [A-Za-z0-9._-]. */
#define COORD_MAX_CLUSTER_NAME 64u

typedef struct CoordMember {
        char *name;
        int64_t node_rank; /* -1: not configured */
        uint64_t boot_id;
        int64_t started_unix_ms;
        uint8_t *ucx_address;
        size_t ucx_address_size;
        Device *devices; /* numbered 0..n-1 in order */
        size_t n_devices;
        char registry_digest[REGISTRY_DIGEST_LENGTH + 1]; /* "": not known */
        char cluster[COORD_MAX_CLUSTER_NAME + 1]; /* the writer's --cluster; "": not said */
} CoordMember;

/* Whether name is 1 to COORD_MAX_CLUSTER_NAME characters of [A-Za-z0-9._-]. */
bool coord_cluster_name_valid(const char *name);

void coord_member_done(CoordMember *m);

/*
 * Decodes a record. -EBADMSG for bytes that do not parse, a cluster that is neither empty nor a
 * valid cluster name, a name that is empty, too long
 * (FAMILYD_MAX_NAME_LENGTH) or not printable ASCII without '/', a node rank below -1, a UCX
 * address over COORD_MEMBER_MAX_UCX_ADDRESS bytes, more than FAMILYD_MAX_NODE_DEVICES devices or
 * devices not numbered 0..n-1, a malformed registry digest. expected_name (NULL: any) is the
 * name the key gives: a record naming another node is refused too (-EBADMSG).
 */
int codec_coord_member_decode(const uint8_t *data, size_t size, const char *expected_name,
                              CoordMember *ret);
/* malloc'ed bytes; -EINVAL for a member that would not decode. */
int codec_coord_member_encode(const CoordMember *m, uint8_t **ret, size_t *ret_size);
