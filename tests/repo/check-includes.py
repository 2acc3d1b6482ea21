#!/usr/bin/python3
"""The include graph follows the layers: every #include goes to the same folder or downward.

usage: check-includes.py [ROOT]

ROOT (default: the source tree) holds common/, daemon/ and client/. Each C file belongs to a
layer, named by its folder; an include names its header by folder (`"core/mesh.h"`), or by bare
name for a header of the file's own folder. A layer may include only the layers LAYERS allows
it, and only the layers listed in SYSTEM may include a library's headers. Every violation is
printed as FILE:LINE: the include and why; the exit status is 1 when there is any.
"""

import os
import re
import sys

# Layer -> the layers it may include (besides itself), lowest first. docs/architecture.md
# draws the same picture.
LAYERS = {
    "common": [],
    "core": ["common"],
    "membership": ["common", "core"],
    "codec": ["common", "core", "membership"],
    "hw": ["common", "core"],
    "shm": ["common", "core", "codec", "hw"],
    "handout": ["common", "core", "codec", "hw", "shm"],
    "state": ["common", "core", "codec"],
    "build": ["common", "core", "codec", "hw", "shm", "handout", "state"],
    "metrics": ["common", "core", "codec", "hw", "shm", "handout", "state", "build"],
    "rpc": ["common", "core", "codec", "hw", "shm", "handout", "state", "build", "metrics"],
    "peer": ["common", "core", "membership", "codec"],
    "sd": ["common", "core"],
    "coord": ["common", "core", "codec"],
    "cluster": ["common", "core", "codec", "coord"],
    "shell": ["common", "core", "membership", "codec", "hw", "shm", "handout", "state", "build",
              "metrics", "rpc", "peer", "sd", "coord", "cluster"],
    "client": ["common"],
}

# Headers of libraries (and generated code) that only some layers may include.
SYSTEM = [
    (re.compile(r"\.pb-c\.h$|^protobuf-c/"), {"codec", "client"},
     "generated protobuf code and protobuf-c belong to codec/"),
    (re.compile(r"^grpc/"), {"rpc", "coord", "client"},
     "gRPC belongs to rpc/ (and coord/, the etcd client)"),
    (re.compile(r"^(ucp|uct|ucs)/"), {"peer"}, "UCX belongs to peer/"),
    (re.compile(r"^systemd/sd-event\.h$"),
     {"codec", "hw", "shm", "handout", "state", "build", "metrics", "rpc", "peer", "sd", "coord",
      "cluster", "shell"},
     "sd-event is every thread's event loop, in the daemon's layers above core/ and "
     "membership/ (which are pure)"),
    (re.compile(r"^systemd/(?!sd-event\.h$)"), {"sd", "shell"},
     "libsystemd belongs to sd/ and the shell"),
    (re.compile(r"^hwloc"), {"hw"}, "hwloc belongs to hw/"),
    (re.compile(r"^microhttpd\.h$"), {"metrics"}, "libmicrohttpd belongs to metrics/"),
    (re.compile(r"^sodium"), {"codec", "peer", "build"},
     "libsodium belongs to codec/ (the registry digest), peer/ (the cluster key) and build/ "
     "(a checkpoint's identity)"),
    (re.compile(r"^yaml\.h$"), {"core"}, "libyaml belongs to the registry loader in core/"),
    (re.compile(r"^jansson\.h$"), {"common", "client"},
     "jansson belongs to the safetensors format (common/safetensors.c) and familyctl"),
]

INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


def layer_of(rel):
    """The layer of a file (path relative to ROOT): "common", "client", "shell" (a file of
    daemon/ itself), a daemon folder's name (a layer of LAYERS, or a folder that is not one:
    check_file() says so), or None for files outside common/, daemon/ and client/."""
    parts = rel.split(os.sep)
    if parts[0] == "common":
        return "common"
    if parts[0] == "client":
        return "client"
    if parts[0] == "daemon":
        return "shell" if len(parts) == 2 else parts[1]
    return None


def folder_of_layer(layer):
    return {"common": "common", "client": "client", "shell": "daemon"}.get(layer,
                                                                          "daemon/" + layer)


def check_file(root, rel):
    layer = layer_of(rel)
    if layer is None:
        return []
    if layer not in LAYERS:
        # A folder the table lacks would be checked against nothing: name it instead.
        return ["%s:1: daemon/%s/ is not a layer; add it to LAYERS here and to the picture "
                "in docs/architecture.md" % (rel, layer)]
    allowed = set(LAYERS[layer]) | {layer}
    here = os.path.dirname(os.path.join(root, rel))
    problems = []
    with open(os.path.join(root, rel), errors="replace") as f:
        for n, line in enumerate(f, 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            quote, name = m.groups()
            for rx, layers, why in SYSTEM:
                if rx.search(name) and layer not in layers:
                    problems.append("%s:%d: #include %s%s%s: %s" % (
                        rel, n, quote, name, ">" if quote == "<" else '"', why))
            if quote == "<":
                continue
            if "/" not in name:
                home = os.path.join(root, folder_of_layer(layer))
                # libfamilyd's public header, named bare by familyctl as by any user of it.
                public = os.path.join(root, "client", "libfamilyd") if layer == "client" else home
                if os.path.exists(os.path.join(here, name)) or \
                        os.path.exists(os.path.join(home, name)) or \
                        os.path.exists(os.path.join(public, name)) or \
                        name.endswith(".pb-c.h") or name == "build-config.h":
                    continue
                problems.append('%s:%d: #include "%s": not in %s/; name another folder\'s '
                                'header by its folder ("FOLDER/%s")'
                                % (rel, n, name, folder_of_layer(layer), name))
                continue
            target = name.split("/")[0]
            if target == "daemon":
                # It compiles (the source root is on the include path), and it would hide the
                # layer it names from the checks below.
                problems.append('%s:%d: #include "%s": name a daemon header by its layer\'s '
                                'folder ("%s")' % (rel, n, name, name.split("/", 1)[1]))
                continue
            if target in ("..", "."):
                problems.append('%s:%d: #include "%s": a relative path; name the header by its '
                                'folder' % (rel, n, name))
                continue
            target_layer = "common" if target == "common" else target
            if target_layer not in LAYERS:
                continue   # a library's own folder, e.g. "protobuf-c/..." seen above
            if target_layer not in allowed:
                problems.append('%s:%d: #include "%s": %s may not include %s (allowed: %s)' % (
                    rel, n, name, folder_of_layer(layer), folder_of_layer(target_layer),
                    ", ".join(folder_of_layer(x) for x in LAYERS[layer]) or "nothing"))
    return problems


def main(argv):
    root = os.path.abspath(argv[1] if len(argv) > 1 else
                           os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    files = []
    for top in ("common", "daemon", "client"):
        for d, _, names in os.walk(os.path.join(root, top)):
            files += [os.path.relpath(os.path.join(d, n), root) for n in names
                      if n.endswith((".c", ".h"))]
    problems = []
    for rel in sorted(files):
        problems += check_file(root, rel)
    print("check-includes: %d files, %d forbidden includes" % (len(files), len(problems)))
    for p in problems:
        print("  " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
