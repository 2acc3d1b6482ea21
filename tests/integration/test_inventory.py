#!/usr/bin/python3
"""This node's devices as GetTopology reports them: host devices spread over NUMA nodes, and
CUDA GPUs when a driver loads (here the tests' fake libcuda, through familyd's own dlopen path;
FAMILYD_CUDA_DRIVER names it). A node without a usable driver falls back to host memory and
says why in its log."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import familyd_harness as H  # noqa: E402

REGISTRY = os.path.join(H.CONFORMANCE, "registry")
FAKE = os.environ.get("FAKE_LIBCUDA") or H._default_build_file("tests", "fake-cuda",
                                                               "libfake-libcuda.so")


def topology(d):
    res = d.client.call("familyd.v1.MeshService/GetTopology")
    assert res.ok, res
    return res.reply


class EnvDaemon(H.Daemon):
    """A Daemon with extra environment variables for its process."""

    def __init__(self, env, **kw):
        super().__init__(REGISTRY, state_dir=False, **kw)
        self.env = env

    def spawn(self):
        saved = {k: os.environ.get(k) for k in self.env}
        os.environ.update({k: v for k, v in self.env.items() if v is not None})
        for k, v in self.env.items():
            if v is None:
                os.environ.pop(k, None)
        try:
            return super().spawn()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


class TestInventory(unittest.TestCase):
    def test_host_devices(self):
        with EnvDaemon({"FAMILYD_CUDA_DRIVER": FAKE}, host_devices=3) as d:
            # --host-devices wins over any GPU.
            t = topology(d)
            devs = t.nodes[0].devices
            self.assertEqual([x.kind for x in devs], ["host"] * 3)
            self.assertEqual([x.name for x in devs], ["host0", "host1", "host2"])
            self.assertEqual([x.local_index for x in devs], [0, 1, 2])
            # hwloc knows this machine's NUMA nodes, and each device has a share of memory.
            self.assertTrue(all(x.numa_node >= 0 for x in devs), devs)
            self.assertTrue(all(x.memory_bytes > 0 for x in devs), devs)
            self.assertIn("Devices: 3 host-memory devices (--host-devices)", d.stderr())

    @unittest.skipUnless(os.path.exists(FAKE), "the fake libcuda was not built")
    def test_cuda_gpus_from_the_driver(self):
        with EnvDaemon({"FAMILYD_CUDA_DRIVER": FAKE, "FAKE_CUDA_DEVICES": "2"},
                       host_devices=None) as d:
            t = topology(d)
            self.assertEqual(t.world_size, 2)
            devs = t.nodes[0].devices
            self.assertEqual([x.kind for x in devs], ["cuda", "cuda"])
            self.assertEqual([x.name for x in devs], ["Fake GPU 0", "Fake GPU 1"])
            self.assertEqual(devs[1].uuid, "GPU-10111213-1415-1617-1819-1a1b1c1d1e1f")
            self.assertEqual(devs[0].memory_bytes, 80 << 30)
            self.assertEqual([x.pci_bus_id for x in devs], ["0000:10:00.0", "0000:11:00.0"])
            self.assertIn("Devices: 2 CUDA GPUs.", d.stderr())

    @unittest.skipUnless(os.path.exists(FAKE), "the fake libcuda was not built")
    def test_driver_that_fails_falls_back_to_host(self):
        with EnvDaemon({"FAMILYD_CUDA_DRIVER": FAKE, "FAKE_CUDA_INIT_ERROR": "100"},
                       host_devices=None) as d:
            devs = topology(d).nodes[0].devices
            self.assertEqual([x.kind for x in devs], ["host"])
            self.assertIn("Devices: 1 host-memory device (no CUDA-capable device is detected)",
                          d.stderr())

    def test_no_driver_falls_back_to_host(self):
        with EnvDaemon({"FAMILYD_CUDA_DRIVER": "/nonexistent/libcuda.so.1"},
                       host_devices=None) as d:
            devs = topology(d).nodes[0].devices
            self.assertEqual([x.kind for x in devs], ["host"])
            self.assertIn("the CUDA driver (libcuda.so.1) is not installed", d.stderr())


if __name__ == "__main__":
    unittest.main(verbosity=2)
