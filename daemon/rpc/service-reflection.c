/* service-reflection.c: grpc.reflection v1 and v1alpha over the embedded descriptor set. */
#include <pthread.h>

#include "common/log.h"
#include "codec/reflection.h"
#include "rpc.h"

extern unsigned char familyd_descriptors[];
extern unsigned int familyd_descriptors_len;

static Reflection *reflection;
static int reflection_error;
static pthread_once_t reflection_once = PTHREAD_ONCE_INIT;

/* The index is built on the first reflection call, not at start: most daemons never see one. */
static void reflection_setup(void) {
        reflection_error = reflection_new(familyd_descriptors, familyd_descriptors_len,
                                          &reflection);
        if (reflection_error < 0)
                log_error_errno(reflection_error, "Failed to index the descriptor set: %m");
}

static int answer(RpcContext *ctx, const uint8_t *request, size_t size, uint8_t **ret_reply,
                  size_t *ret_size) {
        (void) pthread_once(&reflection_once, reflection_setup);
        if (reflection_error < 0)
                return reflection_error;
        return reflection_answer(reflection, request, size, ret_reply, ret_size);
}

static const RpcMethod methods_v1[] = {
        { "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", RPC_BIDI_BYTES, NULL,
          NULL, answer },
};

static const RpcMethod methods_v1alpha[] = {
        { "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", RPC_BIDI_BYTES, NULL,
          NULL, answer },
};

const RpcService service_reflection_v1 = {
        .name = "grpc.reflection.v1.ServerReflection",
        .methods = methods_v1,
        .n_methods = ELEMENTSOF(methods_v1),
};

const RpcService service_reflection_v1alpha = {
        .name = "grpc.reflection.v1alpha.ServerReflection",
        .methods = methods_v1alpha,
        .n_methods = ELEMENTSOF(methods_v1alpha),
};
