/* codec-status.c: encodes the rich error detail (google.rpc.Status with one ErrorInfo). */
#include <assert.h>
#include <errno.h>
#include <stdlib.h>

#include "codec-status.h"
#include "google-protobuf-any.pb-c.h"
#include "google-rpc-status.pb-c.h"
#include "common/macro.h"

#define CODEC_STATUS_ERROR_INFO_TYPE_URL "type.googleapis.com/google.rpc.ErrorInfo"

int codec_status_encode(int code, const char *message, const char *reason, const char *domain,
                        const char *metadata_key, const char *metadata_value,
                        uint8_t **ret, size_t *ret_size) {
        Google__Rpc__ErrorInfo info = GOOGLE__RPC__ERROR_INFO__INIT;
        Google__Rpc__ErrorInfo__MetadataEntry entry = GOOGLE__RPC__ERROR_INFO__METADATA_ENTRY__INIT;
        Google__Rpc__ErrorInfo__MetadataEntry *entries[1] = { &entry };
        Google__Protobuf__Any any = GOOGLE__PROTOBUF__ANY__INIT;
        Google__Protobuf__Any *details[1] = { &any };
        Google__Rpc__Status status = GOOGLE__RPC__STATUS__INIT;
        _cleanup_free_ uint8_t *info_bytes = NULL, *out = NULL;
        size_t size;

        assert(ret);
        assert(ret_size);

        if (!reason || !domain)
                return -EINVAL;

        /* protobuf-c's pack takes non-const strings but only reads them. */
        info.reason = (char *) reason;
        info.domain = (char *) domain;
        if (metadata_key && metadata_value) {
                entry.key = (char *) metadata_key;
                entry.value = (char *) metadata_value;
                info.n_metadata = 1;
                info.metadata = entries;
        }

        size = google__rpc__error_info__get_packed_size(&info);
        info_bytes = malloc(size > 0 ? size : 1);
        if (!info_bytes)
                return -ENOMEM;
        any.type_url = (char *) CODEC_STATUS_ERROR_INFO_TYPE_URL;
        any.value.data = info_bytes;
        any.value.len = google__rpc__error_info__pack(&info, info_bytes);

        status.code = code;
        status.message = (char *) strempty(message);
        status.n_details = 1;
        status.details = details;

        size = google__rpc__status__get_packed_size(&status);
        out = malloc(size > 0 ? size : 1);
        if (!out)
                return -ENOMEM;
        size = google__rpc__status__pack(&status, out);

        *ret = TAKE_PTR(out);
        *ret_size = size;
        return 0;
}
