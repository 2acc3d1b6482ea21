/* resource-limits.h: every limit on what a client or a registry file controls, in one place. */
#pragma once

/* gRPC requests: larger messages are refused by the transport before decoding. */
#define FAMILYD_MAX_REQUEST_BYTES        (4u * 1024u * 1024u)
/* What a request may hold, checked on the wire bytes before protobuf-c (which recurses per
 * nesting level and allocates per field) decodes them: nesting depth, submessages, fields. */
#define FAMILYD_MAX_REQUEST_DEPTH        32u
#define FAMILYD_MAX_REQUEST_MESSAGES     131072u
#define FAMILYD_MAX_REQUEST_FIELDS       262144u
/* Concurrent client connections on the API socket; more are closed with a log line. */
#define FAMILYD_MAX_CONNECTIONS          256u
/* Connections from one peer process (SO_PEERCRED), so one client cannot take them all. */
#define FAMILYD_MAX_CONNECTIONS_PER_PEER 64u
/* A connection with no call in progress this long is closed (clients reconnect on their next
 * call); this also ends connections that never speak HTTP/2. */
#define FAMILYD_CONNECTION_IDLE_MS       120000u

/* Resolve/Build arguments and values. */
#define FAMILYD_MAX_ARGUMENTS            256u
#define FAMILYD_MAX_NAME_LENGTH          256u
#define FAMILYD_MAX_STRING_VALUE_LENGTH  65536u
#define FAMILYD_MAX_VALUE_DEPTH          8u
#define FAMILYD_MAX_LIST_VALUES          4096u

/* Build requests. */
#define FAMILYD_MAX_SOURCE_PARAMETERS    65536u

/* Meshes. */
#define FAMILYD_MAX_MESHES               1024u
#define FAMILYD_MAX_MESH_DIMS            16u
#define FAMILYD_MAX_RANKS                (1u << 20)

/* Registry files. */
#define FAMILYD_MAX_REGISTRY_FILES       4096u
#define FAMILYD_MAX_REGISTRY_FILE_BYTES  (4u * 1024u * 1024u)
#define FAMILYD_MAX_FAMILIES             65536u
#define FAMILYD_MAX_SHAPE_RANK           16u
#define FAMILYD_MAX_EXPR_LENGTH          1024u
#define FAMILYD_MAX_EXPR_DEPTH           64u

/* Replies. A status message longer than this is cut at a line boundary with a count of what
 * was left out: it travels twice in the trailers (grpc-message and the google.rpc.Status
 * detail), and clients refuse trailers over 8 KiB. */
#define FAMILYD_MAX_STATUS_MESSAGE       2048u
/* A reply larger than gRPC clients accept by default is refused with RESOURCE_EXHAUSTED instead
 * of failing in the client. */
#define FAMILYD_MAX_REPLY_BYTES          (4u * 1024u * 1024u)
/* Validate requests: parameters shared across builds, and the uses of each. */
#define FAMILYD_MAX_SHARED_PARAMETERS     4096u
#define FAMILYD_MAX_SHARED_PARAMETER_USES 64u
/* Open Watch streams (health, topology) across all connections. */
#define FAMILYD_MAX_WATCHES              1024u

/* Peers (UCX membership messages come from the network: every field is bounded). */
#define FAMILYD_MAX_PEERS                4096u
#define FAMILYD_MAX_NODE_DEVICES         256u
#define FAMILYD_MAX_PEER_MESSAGE_BYTES   (2u * 1024u * 1024u)
/* Members listed in one hello or announce. */
#define FAMILYD_MAX_PEER_MEMBERS         FAMILYD_MAX_PEERS
/* A topology version a peer may tell: 2^53 changes is centuries at a million a second, and
 * anything above is hostile (2^64-1 would wrap the version to 0 on the next change). */
#define FAMILYD_MAX_TOPOLOGY_VERSION     (UINT64_C(1) << 53)
/* Configured peer addresses (--peers). */
#define FAMILYD_MAX_SEEDS                64u
