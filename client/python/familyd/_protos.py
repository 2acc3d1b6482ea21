"""Message classes of the familyd.v1 API: protoc's generated modules, or the descriptor set.

An installed package (``pip install``, ``meson install``) carries the classes that protoc
generated at build time (client/python/build_protos.py): ``familyd.v1.family_pb2`` and the
others, with typed ``.pyi`` stubs. ``Protos()`` uses them when they import, and needs no file.

A source tree (``PYTHONPATH=client/python``) has none: the classes are then built at run time
from a FileDescriptorSet (``familyd.binpb``, made by the build as ``<build>/proto/familyd.binpb``
and installed as ``/usr/share/familyd/familyd.binpb``), looked for in order at:

1. ``$FAMILYD_DESCRIPTORS`` when set (an explicit path; an error when missing);
2. next to the package: ``familyd/familyd.binpb``, then ``familyd.binpb`` in the folder that
   holds the package (``client/python/``);
3. ``/usr/share/familyd/familyd.binpb``.

``Protos(path)`` always loads the descriptor set at ``path``.

The google.rpc types (Status, ErrorInfo: the details of an error) always live in a descriptor
pool of the package's own, never in protobuf's default pool: the project's
google/rpc/status.proto (with ErrorInfo in it) is not the file of that name other packages
register there (googleapis-common-protos), and a pool holds one file per name. An installed
package loads them from ``familyd/google-rpc.binpb``, a source tree from the descriptor set.
"""

import importlib
import os
from types import ModuleType
from typing import Any, Dict, Iterator, List, Optional, Tuple, Type

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message

SYSTEM_PATH = "/usr/share/familyd/familyd.binpb"
HERE = os.path.dirname(os.path.abspath(__file__))
RPC_SET = os.path.join(HERE, "google-rpc.binpb")

# The generated modules, as client/python/build_protos.py writes them.
API_MODULES = ("values", "family", "mesh", "admin", "shard", "peer")

# A value Protos.value() turns into a familyd.v1.Value (numpy scalars too: anything with .item()).
ValueLike = Any


def descriptor_path() -> str:
    """The descriptor set to load (see the module's docstring), or raise FileNotFoundError."""
    env = os.environ.get("FAMILYD_DESCRIPTORS")
    if env:
        if not os.path.isfile(env):
            raise FileNotFoundError("FAMILYD_DESCRIPTORS=%s: no such file" % env)
        return env
    candidates = [os.path.join(HERE, "familyd.binpb"),
                  os.path.join(os.path.dirname(HERE), "familyd.binpb"),
                  SYSTEM_PATH]
    for p in candidates:
        if os.path.isfile(p):
            return p
    raise FileNotFoundError("familyd descriptor set not found: set FAMILYD_DESCRIPTORS to "
                            "<build>/proto/familyd.binpb (looked in %s)" % ", ".join(candidates))


def generated_modules() -> Optional[List[ModuleType]]:
    """The protoc-generated familyd.v1 modules, or None where they are not installed (a source
    tree) or incomplete (no google-rpc.binpb beside them)."""
    if not os.path.isfile(RPC_SET):
        return None
    try:
        return [importlib.import_module("%s.v1.%s_pb2" % (__package__, m)) for m in API_MODULES]
    except ImportError:
        return None


def _load_pool(path: str) -> Any:
    """A private descriptor pool holding every file of the FileDescriptorSet at path."""
    with open(path, "rb") as f:
        fds = descriptor_pb2.FileDescriptorSet.FromString(f.read())
    pool = descriptor_pool.DescriptorPool()
    for fd in fds.file:
        pool.Add(fd)
    return pool


def _walk(cls: Type[Message]) -> Iterator[Tuple[str, Type[Message]]]:
    yield cls.DESCRIPTOR.full_name, cls
    for nested in cls.DESCRIPTOR.nested_types:
        yield from _walk(getattr(cls, nested.name))


class Protos:
    """The API's message classes: ``protos.cls("familyd.v1.Build")``, ``protos.Build``.

    .generated: whether they are protoc's generated classes (then .path is None and .pool is
    protobuf's default pool) or built from the descriptor set at .path (.pool: its own pool).
    """

    def __init__(self, path: Optional[str] = None) -> None:
        modules = None if path else generated_modules()
        self._classes: Dict[str, Type[Message]] = {}
        self._factories: Dict[int, Any] = {}
        self.generated = modules is not None
        if modules is not None:
            self.path: Optional[str] = None
            self.pool: Any = descriptor_pool.Default()
            self._rpc_pool: Any = _load_pool(RPC_SET)
            for m in modules:
                for name in m.DESCRIPTOR.message_types_by_name:
                    self._classes.update(_walk(getattr(m, name)))
        else:
            self.path = path or descriptor_path()
            self.pool = _load_pool(self.path)
            self._rpc_pool = self.pool

    def _build(self, pool: Any, full_name: str) -> Type[Message]:
        desc = pool.FindMessageTypeByName(full_name)
        get = getattr(message_factory, "GetMessageClass", None)   # protobuf >= 4.22
        if get is not None:
            return get(desc)   # type: ignore[no-any-return]
        factory = self._factories.get(id(pool))
        if factory is None:
            factory = self._factories[id(pool)] = message_factory.MessageFactory(pool)
        return factory.GetPrototype(desc)   # type: ignore[no-any-return]

    def cls(self, full_name: str) -> Type[Message]:
        """The message class of full_name ("familyd.v1.Build", "google.rpc.ErrorInfo");
        KeyError for a name the API does not have."""
        c = self._classes.get(full_name)
        if c is None:
            # Generated: the familyd.v1 classes are all in _classes; the rest (google.rpc, and
            # google.protobuf.Any that it imports) come from the private pool.
            c = self._classes[full_name] = self._build(self._rpc_pool, full_name)
        return c

    def __getattr__(self, name: str) -> Type[Message]:
        # protos.Build -> familyd.v1.Build
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self.cls("familyd.v1." + name)
        except KeyError:
            raise AttributeError(name) from None

    def method(self, rpc: str) -> Tuple[str, Type[Message], Type[Message]]:
        """'familyd.v1.FamilyService/Build' -> (path, request class, response class)."""
        service, name = rpc.lstrip("/").split("/", 1)
        md = self.pool.FindServiceByName(service).methods_by_name[name]
        return ("/%s/%s" % (service, name), self.cls(md.input_type.full_name),
                self.cls(md.output_type.full_name))

    def value(self, v: ValueLike) -> Message:
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
    def py(value: Message) -> Any:
        """A Python value from a familyd.v1.Value (None when no kind is set)."""
        k = value.WhichOneof("kind")
        if k is None:
            return None
        if k == "list_value":
            return [Protos.py(x) for x in value.list_value.values]
        return getattr(value, k)


_default: Optional[Protos] = None


def default_protos() -> Protos:
    """The process's Protos(), made on first use."""
    global _default
    if _default is None:
        _default = Protos()
    return _default
