"""Message classes of the familyd.v1 API, built at run time from the descriptor set.

No protoc-generated modules: the classes come from a FileDescriptorSet (``familyd.binpb``, made
by the build as ``<build>/proto/familyd.binpb`` and installed as
``/usr/share/familyd/familyd.binpb``). It is looked for, in order:

1. ``$FAMILYD_DESCRIPTORS`` when set (an explicit path; an error when missing);
2. next to the package: ``familyd/familyd.binpb``, then ``familyd.binpb`` in the folder that
   holds the package (``client/python/``);
3. ``/usr/share/familyd/familyd.binpb``.
"""

import os

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

SYSTEM_PATH = "/usr/share/familyd/familyd.binpb"


def descriptor_path():
    """The descriptor set to load (see the module's docstring), or raise FileNotFoundError."""
    env = os.environ.get("FAMILYD_DESCRIPTORS")
    if env:
        if not os.path.isfile(env):
            raise FileNotFoundError("FAMILYD_DESCRIPTORS=%s: no such file" % env)
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [os.path.join(here, "familyd.binpb"),
                  os.path.join(os.path.dirname(here), "familyd.binpb"),
                  SYSTEM_PATH]
    for p in candidates:
        if os.path.isfile(p):
            return p
    raise FileNotFoundError("familyd descriptor set not found: set FAMILYD_DESCRIPTORS to "
                            "<build>/proto/familyd.binpb (looked in %s)" % ", ".join(candidates))


class Protos:
    """A descriptor pool and its message classes: ``protos.cls("familyd.v1.Build")``."""

    def __init__(self, path=None):
        self.path = path or descriptor_path()
        with open(self.path, "rb") as f:
            fds = descriptor_pb2.FileDescriptorSet.FromString(f.read())
        self.pool = descriptor_pool.DescriptorPool()
        for fd in fds.file:
            self.pool.Add(fd)
        self._classes = {}
        self._factory = None

    def cls(self, full_name):
        c = self._classes.get(full_name)
        if c is None:
            desc = self.pool.FindMessageTypeByName(full_name)
            get = getattr(message_factory, "GetMessageClass", None)   # protobuf >= 4.22
            if get is not None:
                c = get(desc)
            else:
                if self._factory is None:
                    self._factory = message_factory.MessageFactory(self.pool)
                c = self._factory.GetPrototype(desc)
            self._classes[full_name] = c
        return c

    def __getattr__(self, name):
        # protos.Build -> familyd.v1.Build
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self.cls("familyd.v1." + name)
        except KeyError:
            raise AttributeError(name) from None

    def method(self, rpc):
        """'familyd.v1.FamilyService/Build' -> (path, request class, response class)."""
        service, name = rpc.lstrip("/").split("/", 1)
        md = self.pool.FindServiceByName(service).methods_by_name[name]
        return ("/%s/%s" % (service, name), self.cls(md.input_type.full_name),
                self.cls(md.output_type.full_name))

    def value(self, v):
        """A familyd.v1.Value from a Python bool, int, float, str or list of them."""
        out = self.cls("familyd.v1.Value")()
        if isinstance(v, bool):
            out.bool_value = v
        elif isinstance(v, int):
            out.int_value = v
        elif isinstance(v, float):
            out.double_value = v
        elif isinstance(v, str):
            out.string_value = v
        elif isinstance(v, (list, tuple)):
            out.list_value.SetInParent()
            for x in v:
                out.list_value.values.append(self.value(x))
        else:
            # numpy scalars and the like
            if hasattr(v, "item"):
                return self.value(v.item())
            raise TypeError("cannot send %r as a familyd.v1.Value" % (v,))
        return out

    @staticmethod
    def py(value):
        """A Python value from a familyd.v1.Value (None when no kind is set)."""
        k = value.WhichOneof("kind")
        if k is None:
            return None
        if k == "list_value":
            return [Protos.py(x) for x in value.list_value.values]
        return getattr(value, k)


_default = None


def default_protos():
    global _default
    if _default is None:
        _default = Protos()
    return _default
