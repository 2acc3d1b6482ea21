/* codec-shard.h: the shard socket's frames (familyd.v1.ShardFdRequest / ShardFdReply) in C types. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A decoded request; tokens point into the decoded message, released by the _done call. */
typedef struct ShardRequest {
        const char *const *tokens;
        size_t n_tokens;
        bool writable;
        const char *const *checkpoint_files; /* a checkpoint deposit: the files' names */
        size_t n_checkpoint_files;
        void *message; /* the protobuf-c message the fields point into */
} ShardRequest;

/* -EBADMSG when data is not a ShardFdRequest, -ENOMEM. */
int codec_shard_request_decode(const uint8_t *data, size_t size, ShardRequest *ret);
void codec_shard_request_done(ShardRequest *r);

/* A reply: code and message, and per handed-out shard its size, device kind and device. */
typedef struct ShardReply {
        int32_t code;
        const char *message;
        size_t n;
        const uint64_t *sizes;
        const char *const *device_kinds;
        const int32_t *devices;
        const char *checkpoint_token; /* a deposit's answer, or NULL */
} ShardReply;

/* The packed size of the reply, and the reply packed into out (that many bytes). */
size_t codec_shard_reply_size(const ShardReply *r);
void codec_shard_reply_pack(const ShardReply *r, uint8_t *out);
