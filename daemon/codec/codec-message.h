/* codec-message.h: the message types the gRPC adapter handles: protobuf-c's, and health's. */
#pragma once

/*
 * rpc/ keeps its methods in tables of request descriptors and builds replies as messages in a
 * call's arena; the types come from here, so that only codec/ includes protobuf-c and the
 * generated code. The API's own messages come with codec.h.
 */
#include <protobuf-c/protobuf-c.h>

#include "grpc-health-v1-health.pb-c.h"
