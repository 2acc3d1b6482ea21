/* calls.c: typed wrappers of familyd_client_call(), one per familyd.v1 method the API covers. */

#include <errno.h>

#include "familyd.h"

#define FAMILY_SERVICE "/familyd.v1.FamilyService/"
#define MESH_SERVICE "/familyd.v1.MeshService/"
#define ADMIN_SERVICE "/familyd.v1.AdminService/"

/* The generic call hands back ProtobufCMessage *; the typed result is its first member, so the
 * cast is the one protobuf-c itself documents. */
#define CALL(client, method, req, type_desc, ret, error)                                  \
        familyd_client_call((client), (method), &(req)->base, &(type_desc),               \
                            (ProtobufCMessage **) (ret), (error))

int familyd_list_families(FamilydClient *client, Familyd__V1__ListFamiliesResponse **ret_response, FamilydError *ret_error) {
        Familyd__V1__ListFamiliesRequest req = FAMILYD__V1__LIST_FAMILIES_REQUEST__INIT;

        return CALL(client, FAMILY_SERVICE "ListFamilies", &req, familyd__v1__list_families_response__descriptor, ret_response, ret_error);
}

int familyd_get_family(FamilydClient *client, const char *family, Familyd__V1__Family **ret_family, FamilydError *ret_error) {
        Familyd__V1__GetFamilyRequest req = FAMILYD__V1__GET_FAMILY_REQUEST__INIT;

        if (!family) {
                familyd_error_clear(ret_error);
                return -EINVAL;
        }
        req.family = (char *) family;
        return CALL(client, FAMILY_SERVICE "GetFamily", &req, familyd__v1__family__descriptor, ret_family, ret_error);
}

int familyd_resolve(FamilydClient *client, const Familyd__V1__ResolveRequest *request, Familyd__V1__ResolveResponse **ret_response, FamilydError *ret_error) {
        if (!request) {
                familyd_error_clear(ret_error);
                return -EINVAL;
        }
        return CALL(client, FAMILY_SERVICE "Resolve", request, familyd__v1__resolve_response__descriptor, ret_response, ret_error);
}

int familyd_create_mesh(FamilydClient *client, const Familyd__V1__Mesh *mesh, Familyd__V1__Mesh **ret_mesh, FamilydError *ret_error) {
        Familyd__V1__CreateMeshRequest req = FAMILYD__V1__CREATE_MESH_REQUEST__INIT;

        if (!mesh) {
                familyd_error_clear(ret_error);
                return -EINVAL;
        }
        req.mesh = (Familyd__V1__Mesh *) mesh;
        return CALL(client, MESH_SERVICE "CreateMesh", &req, familyd__v1__mesh__descriptor, ret_mesh, ret_error);
}

int familyd_get_mesh(FamilydClient *client, const char *mesh_id, Familyd__V1__Mesh **ret_mesh, FamilydError *ret_error) {
        Familyd__V1__GetMeshRequest req = FAMILYD__V1__GET_MESH_REQUEST__INIT;

        if (!mesh_id) {
                familyd_error_clear(ret_error);
                return -EINVAL;
        }
        req.mesh_id = (char *) mesh_id;
        return CALL(client, MESH_SERVICE "GetMesh", &req, familyd__v1__mesh__descriptor, ret_mesh, ret_error);
}

int familyd_list_meshes(FamilydClient *client, Familyd__V1__ListMeshesResponse **ret_response, FamilydError *ret_error) {
        Familyd__V1__ListMeshesRequest req = FAMILYD__V1__LIST_MESHES_REQUEST__INIT;

        return CALL(client, MESH_SERVICE "ListMeshes", &req, familyd__v1__list_meshes_response__descriptor, ret_response, ret_error);
}

int familyd_delete_mesh(FamilydClient *client, const char *mesh_id, FamilydError *ret_error) {
        Familyd__V1__DeleteMeshRequest req = FAMILYD__V1__DELETE_MESH_REQUEST__INIT;
        Familyd__V1__DeleteMeshResponse *resp = NULL;
        int r;

        if (!mesh_id) {
                familyd_error_clear(ret_error);
                return -EINVAL;
        }
        req.mesh_id = (char *) mesh_id;
        r = CALL(client, MESH_SERVICE "DeleteMesh", &req, familyd__v1__delete_mesh_response__descriptor, &resp, ret_error);
        if (r < 0)
                return r;
        familyd__v1__delete_mesh_response__free_unpacked(resp, NULL);
        return 0;
}

int familyd_get_topology(FamilydClient *client, Familyd__V1__Topology **ret_topology, FamilydError *ret_error) {
        Familyd__V1__GetTopologyRequest req = FAMILYD__V1__GET_TOPOLOGY_REQUEST__INIT;

        return CALL(client, MESH_SERVICE "GetTopology", &req, familyd__v1__topology__descriptor, ret_topology, ret_error);
}

int familyd_forget_node(FamilydClient *client, const char *node, Familyd__V1__ForgetNodeResponse **ret_response, FamilydError *ret_error) {
        Familyd__V1__ForgetNodeRequest req = FAMILYD__V1__FORGET_NODE_REQUEST__INIT;

        if (!node) {
                familyd_error_clear(ret_error);
                return -EINVAL;
        }
        req.node = (char *) node;
        return CALL(client, MESH_SERVICE "ForgetNode", &req, familyd__v1__forget_node_response__descriptor, ret_response, ret_error);
}

int familyd_get_status(FamilydClient *client, Familyd__V1__GetStatusResponse **ret_status, FamilydError *ret_error) {
        Familyd__V1__GetStatusRequest req = FAMILYD__V1__GET_STATUS_REQUEST__INIT;

        return CALL(client, ADMIN_SERVICE "GetStatus", &req, familyd__v1__get_status_response__descriptor, ret_status, ret_error);
}

int familyd_reload(FamilydClient *client, Familyd__V1__ReloadResponse **ret_response, FamilydError *ret_error) {
        Familyd__V1__ReloadRequest req = FAMILYD__V1__RELOAD_REQUEST__INIT;

        return CALL(client, ADMIN_SERVICE "Reload", &req, familyd__v1__reload_response__descriptor, ret_response, ret_error);
}

int familyd_build(FamilydClient *client, const Familyd__V1__BuildRequest *request, Familyd__V1__BuildResponse **ret_response, FamilydError *ret_error) {
        if (!request) {
                familyd_error_clear(ret_error);
                return -EINVAL;
        }
        return CALL(client, FAMILY_SERVICE "Build", request, familyd__v1__build_response__descriptor, ret_response, ret_error);
}

int familyd_get_build(FamilydClient *client, const char *build_id, Familyd__V1__Build **ret_build, FamilydError *ret_error) {
        Familyd__V1__GetBuildRequest req = FAMILYD__V1__GET_BUILD_REQUEST__INIT;

        if (!build_id) {
                familyd_error_clear(ret_error);
                return -EINVAL;
        }
        req.build_id = (char *) build_id;
        return CALL(client, FAMILY_SERVICE "GetBuild", &req, familyd__v1__build__descriptor, ret_build, ret_error);
}

int familyd_list_builds(FamilydClient *client, Familyd__V1__ListBuildsResponse **ret_response, FamilydError *ret_error) {
        Familyd__V1__ListBuildsRequest req = FAMILYD__V1__LIST_BUILDS_REQUEST__INIT;

        return CALL(client, FAMILY_SERVICE "ListBuilds", &req, familyd__v1__list_builds_response__descriptor, ret_response, ret_error);
}

int familyd_release_build(FamilydClient *client, const char *build_id, FamilydError *ret_error) {
        return familyd_release_build_full(client, build_id, false, NULL, ret_error);
}

int familyd_release_build_full(FamilydClient *client, const char *build_id, bool force, bool *ret_freed, FamilydError *ret_error) {
        Familyd__V1__ReleaseBuildRequest req = FAMILYD__V1__RELEASE_BUILD_REQUEST__INIT;
        Familyd__V1__ReleaseBuildResponse *resp = NULL;
        int r;

        if (!build_id) {
                familyd_error_clear(ret_error);
                return -EINVAL;
        }
        req.build_id = (char *) build_id;
        req.force = force;
        r = CALL(client, FAMILY_SERVICE "ReleaseBuild", &req, familyd__v1__release_build_response__descriptor, &resp, ret_error);
        if (r < 0)
                return r;
        if (ret_freed)
                *ret_freed = resp->freed;
        familyd__v1__release_build_response__free_unpacked(resp, NULL);
        return 0;
}

/* PinBuild, UnpinBuild and PublishBuild: a build id in, the build out. */
static int pin_call(FamilydClient *client, const char *method, ProtobufCMessage *req, Familyd__V1__Build **ret_build, FamilydError *ret_error) {
        Familyd__V1__Build *build = NULL;
        int r;

        r = familyd_client_call(client, method, req, &familyd__v1__build__descriptor, (ProtobufCMessage **) &build, ret_error);
        if (r < 0)
                return r;
        if (ret_build)
                *ret_build = build;
        else
                familyd__v1__build__free_unpacked(build, NULL);
        return 0;
}

int familyd_pin_build(FamilydClient *client, const char *build_id, Familyd__V1__Build **ret_build, FamilydError *ret_error) {
        Familyd__V1__PinBuildRequest req = FAMILYD__V1__PIN_BUILD_REQUEST__INIT;

        if (!build_id) {
                familyd_error_clear(ret_error);
                return -EINVAL;
        }
        req.build_id = (char *) build_id;
        return pin_call(client, FAMILY_SERVICE "PinBuild", &req.base, ret_build, ret_error);
}

int familyd_unpin_build(FamilydClient *client, const char *build_id, Familyd__V1__Build **ret_build, FamilydError *ret_error) {
        Familyd__V1__UnpinBuildRequest req = FAMILYD__V1__UNPIN_BUILD_REQUEST__INIT;

        if (!build_id) {
                familyd_error_clear(ret_error);
                return -EINVAL;
        }
        req.build_id = (char *) build_id;
        return pin_call(client, FAMILY_SERVICE "UnpinBuild", &req.base, ret_build, ret_error);
}

int familyd_publish_build(FamilydClient *client, const char *build_id, Familyd__V1__Build **ret_build, FamilydError *ret_error) {
        Familyd__V1__PublishBuildRequest req = FAMILYD__V1__PUBLISH_BUILD_REQUEST__INIT;

        if (!build_id) {
                familyd_error_clear(ret_error);
                return -EINVAL;
        }
        req.build_id = (char *) build_id;
        return pin_call(client, FAMILY_SERVICE "PublishBuild", &req.base, ret_build, ret_error);
}

int familyd_validate(FamilydClient *client, const Familyd__V1__ValidateRequest *request, Familyd__V1__ValidateResponse **ret_response, FamilydError *ret_error) {
        if (!request) {
                familyd_error_clear(ret_error);
                return -EINVAL;
        }
        return CALL(client, FAMILY_SERVICE "Validate", request, familyd__v1__validate_response__descriptor, ret_response, ret_error);
}
