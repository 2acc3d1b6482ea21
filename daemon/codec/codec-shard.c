/* codec-shard.c: the shard socket's frames to and from C types. */
#include <errno.h>

#include "codec-shard.h"
#include "familyd-v1-shard.pb-c.h"

int codec_shard_request_decode(const uint8_t *data, size_t size, ShardRequest *ret) {
        Familyd__V1__ShardFdRequest *m = familyd__v1__shard_fd_request__unpack(NULL, size, data);

        if (!m)
                return -EBADMSG;
        *ret = (ShardRequest) {
                .tokens = (const char *const *) m->tokens,
                .n_tokens = m->n_tokens,
                .writable = m->writable,
                .checkpoint_files = (const char *const *) m->checkpoint_files,
                .n_checkpoint_files = m->n_checkpoint_files,
                .message = m,
        };
        return 0;
}

void codec_shard_request_done(ShardRequest *r) {
        if (r && r->message)
                familyd__v1__shard_fd_request__free_unpacked(r->message, NULL);
        if (r)
                *r = (ShardRequest) {};
}

static Familyd__V1__ShardFdReply reply_message(const ShardReply *r) {
        Familyd__V1__ShardFdReply m = FAMILYD__V1__SHARD_FD_REPLY__INIT;

        m.code = r->code;
        m.message = (char *) (r->message ? r->message : "");
        m.n_sizes = m.n_device_kinds = m.n_devices = r->n;
        m.sizes = (uint64_t *) r->sizes;
        m.device_kinds = (char **) r->device_kinds;
        m.devices = (int32_t *) r->devices;
        m.checkpoint_token = (char *) (r->checkpoint_token ? r->checkpoint_token : "");
        return m;
}

size_t codec_shard_reply_size(const ShardReply *r) {
        Familyd__V1__ShardFdReply m = reply_message(r);
        return familyd__v1__shard_fd_reply__get_packed_size(&m);
}

void codec_shard_reply_pack(const ShardReply *r, uint8_t *out) {
        Familyd__V1__ShardFdReply m = reply_message(r);
        (void) familyd__v1__shard_fd_reply__pack(&m, out);
}
