#!/usr/bin/python3
"""check-includes.py on a fixture tree: allowed includes pass, each forbidden edge is named."""

import importlib.util
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("check_includes",
                                              os.path.join(HERE, "check-includes.py"))
checker = importlib.util.module_from_spec(spec)
spec.loader.exec_module(checker)

# A tree that follows the layers.
CLEAN = {
    "common/macro.h": "#pragma once\n#include <stddef.h>\n",
    "daemon/core/mesh.h": '#pragma once\n#include "common/macro.h"\n',
    "daemon/core/mesh.c": '#include "mesh.h"\n#include "core/mesh.h"\n#include <yaml.h>\n',
    "daemon/membership/membership.c": '#include "membership.h"\n#include "core/mesh.h"\n',
    "daemon/codec/codec-mesh.c": '#include "core/mesh.h"\n#include "familyd-v1-mesh.pb-c.h"\n'
                                 '#include <protobuf-c/protobuf-c.h>\n'
                                 '#include "membership/peer-message.h"\n',
    "daemon/state/store.c": '#include "common/macro.h"\n#include <systemd/sd-event.h>\n',
    "daemon/shm/server.c": '#include "codec/codec.h"\n#include <systemd/sd-event.h>\n',
    "daemon/build/build.c": '#include "state/store.h"\n#include "codec/codec.h"\n',
    "daemon/rpc/service.c": '#include "build/build.h"\n#include <grpc/grpc.h>\n',
    "daemon/peer/peer.c": '#include "codec/codec.h"\n#include "membership/membership.h"\n'
                          '#include <ucp/api/ucp.h>\n'
                          '#include <systemd/sd-event.h>\n',
    "daemon/daemon.c": '#include "rpc/service.h"\n#include "peer/peer.h"\n'
                       '#include <systemd/sd-daemon.h>\n#include "build-config.h"\n',
    "client/libfamilyd/familyd.h": '#include "familyd-v1-family.pb-c.h"\n#include "common/macro.h"\n',
    "client/familyctl/verbs.c": '#include "familyd.h"\n#include <grpc/grpc.h>\n',
}

# One forbidden include per file, with the words the report must carry.
BAD = {
    "daemon/state/record.c": ('#include "rpc/build-state.h"\n', "daemon/state may not include daemon/rpc"),
    "daemon/core/manager.h": ('#include "shm/accel.h"\n', "daemon/core may not include daemon/shm"),
    "daemon/handout/shard-socket.c": ('#include "familyd-v1-shard.pb-c.h"\n', "belong to codec/"),
    "daemon/peer/peer2.c": ('#include "handout/token.h"\n', "daemon/peer may not include daemon/handout"),
    "daemon/rpc/peer-use.c": ('#include "peer/peer.h"\n', "daemon/rpc may not include daemon/peer"),
    "daemon/state/flat.c": ('#include "mesh.h"\n', "not in daemon/state/"),
    "client/libfamilyd/shard.c": ('#include "../daemon/hw/cuda-driver.h"\n', "a relative path"),
    "client/libfamilyd/calls.c": ('#include "core/macro.h"\n', "client may not include daemon/core"),
    "common/crc.c": ('#include "core/mesh.h"\n', "common may not include daemon/core"),
    # The membership protocol is pure, over core/ alone: core/ may not use it, nor it an adapter.
    "daemon/core/members.c": ('#include "membership/membership.h"\n',
                              "daemon/core may not include daemon/membership"),
    "daemon/membership/encode.c": ('#include "codec/codec.h"\n',
                                   "daemon/membership may not include daemon/codec"),
    "daemon/membership/loop.c": ('#include <systemd/sd-event.h>\n', "sd-event is every thread's"),
    "daemon/core/reg.c": ('#include <grpc/grpc.h>\n', "gRPC belongs to rpc/"),
    "daemon/build/uses-ucx.c": ('#include <ucp/api/ucp.h>\n', "UCX belongs to peer/"),
    "daemon/rpc/uses-sd.c": ('#include <systemd/sd-journal.h>\n', "libsystemd belongs to sd/"),
    "daemon/shm/uses-sd.c": ('#include <systemd/sd-daemon.h>\n', "libsystemd belongs to sd/"),
    "daemon/core/loop.c": ('#include <systemd/sd-event.h>\n', "sd-event is every thread's"),
    "client/loop.c": ('#include <systemd/sd-event.h>\n', "layers above core/"),
    # Spelled from the source root: it compiles, and would hide the layer it names.
    "daemon/core/rooted.c": ('#include "daemon/rpc/service.h"\n',
                             'name a daemon header by its layer\'s folder ("rpc/service.h")'),
    # A daemon folder the table lacks: every file of it is named, not skipped.
    "daemon/newlayer/thing.c": ('#include "common/macro.h"\n',
                                "daemon/newlayer/ is not a layer"),
}


def make_tree(files):
    root = tempfile.mkdtemp(prefix="check-includes-")
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    # Headers the clean tree names, so that bare and qualified names resolve.
    for rel in ("daemon/state/store.h", "daemon/codec/codec.h", "daemon/build/build.h",
                "daemon/rpc/service.h", "daemon/peer/peer.h", "daemon/shm/accel.h",
                "daemon/handout/token.h", "daemon/rpc/build-state.h",
                "daemon/membership/membership.h", "daemon/membership/peer-message.h"):
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, "a").close()
    return root


class TestCheckIncludes(unittest.TestCase):
    def run_checker(self, root):
        p = subprocess.run([sys.executable, os.path.join(HERE, "check-includes.py"), root],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           universal_newlines=True)
        return p.returncode, p.stdout

    def test_clean_tree_passes(self):
        rc, out = self.run_checker(make_tree(CLEAN))
        self.assertEqual(rc, 0, out)
        self.assertIn("0 forbidden includes", out)

    def test_each_forbidden_include_is_named_with_file_and_line(self):
        files = dict(CLEAN)
        for rel, (text, _) in BAD.items():
            files[rel] = "/* fixture */\n" + text
        rc, out = self.run_checker(make_tree(files))
        self.assertEqual(rc, 1, out)
        self.assertIn("%d forbidden includes" % len(BAD), out)
        for rel, (text, why) in BAD.items():
            # A folder that is not a layer is named once, at its file's first line.
            at = ":1:" if "is not a layer" in why else ":2:"
            lines = [l for l in out.splitlines() if l.strip().startswith(rel + at)]
            self.assertEqual(len(lines), 1, "%s not reported once:\n%s" % (rel, out))
            self.assertIn(why, lines[0])
            if at == ":2:":
                self.assertIn(text.strip().split(" ", 1)[1], lines[0])

    def test_sd_event_in_every_daemon_layer_above_core(self):
        # Every layer includes sd-event and sd-daemon: sd-event is refused to common/, core/,
        # membership/ and the client only; the rest of libsystemd stays in sd/ and the shell.
        rels = {layer: {"common": "common/loop.c", "client": "client/loop.c",
                        "shell": "daemon/loop.c"}.get(layer, "daemon/%s/loop.c" % layer)
                for layer in checker.LAYERS}
        rc, out = self.run_checker(make_tree({
            rel: "#include <systemd/sd-event.h>\n#include <systemd/sd-daemon.h>\n"
            for rel in rels.values()}))
        self.assertEqual(rc, 1, out)
        for layer, rel in rels.items():
            event = [l for l in out.splitlines() if l.strip().startswith(rel + ":1:")]
            daemon = [l for l in out.splitlines() if l.strip().startswith(rel + ":2:")]
            self.assertEqual(len(event), int(layer in ("common", "core", "membership", "client")),
                             "%s: sd-event\n%s" % (layer, out))
            self.assertEqual(len(daemon), int(layer not in ("sd", "shell")),
                             "%s: sd-daemon\n%s" % (layer, out))
            for l in event:
                self.assertIn("sd-event is every thread's event loop", l)
            for l in daemon:
                self.assertIn("libsystemd belongs to sd/ and the shell", l)

    def test_layers_only_point_down(self):
        order = list(checker.LAYERS)
        for layer, below in checker.LAYERS.items():
            for b in below:
                self.assertLess(order.index(b), order.index(layer),
                                "%s may include %s, which is not below it" % (layer, b))


if __name__ == "__main__":
    unittest.main(verbosity=2)
