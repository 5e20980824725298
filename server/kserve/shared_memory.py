"""Triton's system shared memory extension: regions of POSIX shared memory objects that a
co-located client registers by key, and tensors read from and written to them in place.

A region is (name -> key, offset, byte_size); its object is `/dev/shm/<key>` (what `shm_open`
names, tritonclient.utils.shared_memory creates). It is checked when registered (the object
opens and holds offset + byte_size) and mapped into a process on first use; an input is then a
read-only view of the mapping (no copy through the socket), an output is written into it.

Names are per tenant (the API key's name, server/tenancy.py): two keys never see or use each
other's regions. With several processes on one port (api_servers, replicas) a region
registered through one is used through another, so the registrations live in a directory of
the supervisor's run dir (`SharedRegions`, one file each), else in this process (`LocalRegions`).

Every fault of a request is a 4xx naming its field, never a crash: a region not registered
(or unregistered meanwhile), a range past its end, an output larger than its range, an object
that shrank since it was registered (checked before each read, so no SIGBUS from a page past
its end) or was replaced by another of the same key. A mapping is never closed while a view of
it lives: an unregistered region's mapping goes when its last view does.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
import stat
import threading
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from ferry.server.errors import Forbidden, InvalidInput, MalformedRequest

SHM_DIR = Path("/dev/shm")
# The parameters that put a tensor in a region (Triton's names, HTTP and gRPC alike).
REGION = "shared_memory_region"
BYTE_SIZE = "shared_memory_byte_size"
OFFSET = "shared_memory_offset"
# Regions one tenant may hold at once: each is a mapping in every process that used it.
MAX_REGIONS = 1024
MAX_KEY_CHARS = 255  # a file name's limit
CUDA_UNSUPPORTED = (
    "CUDA shared memory is not supported by this server; use system shared memory "
    "(/v2/systemsharedmemory) or send tensors in the request"
)
DISABLED = (
    "system shared memory is off on this server: set allow_client_shm = true (a client that "
    "may register regions can read any /dev/shm object the server's user can open)"
)


@dataclass(frozen=True)
class Region:
    name: str
    key: str
    offset: int
    byte_size: int
    # The object's (st_dev, st_ino) when registered: another object under the same key (the
    # client recreated it) is refused, not read.
    device: int
    inode: int

    def status(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "key": self.key,
            "offset": self.offset,
            "byte_size": self.byte_size,
        }


@dataclass(frozen=True)
class TensorRef:
    """An input's or output's place in a region, as the request gave it."""

    region: str
    offset: int
    byte_size: int


class RegionStore(Protocol):
    def add(self, tenant: str | None, region: Region) -> bool:
        """False when the tenant has a region of that name already."""

    def get(self, tenant: str | None, name: str) -> Region | None: ...

    def remove(self, tenant: str | None, name: str | None) -> None:
        """One region, or every region of the tenant (name None)."""

    def all(self, tenant: str | None) -> list[Region]: ...


class LocalRegions:
    """Registrations of a one-process server."""

    def __init__(self) -> None:
        self._regions: dict[tuple[str | None, str], Region] = {}

    def add(self, tenant: str | None, region: Region) -> bool:
        return self._regions.setdefault((tenant, region.name), region) is region

    def get(self, tenant: str | None, name: str) -> Region | None:
        return self._regions.get((tenant, name))

    def remove(self, tenant: str | None, name: str | None) -> None:
        for key in [k for k in self._regions if k[0] == tenant and name in (None, k[1])]:
            del self._regions[key]

    def all(self, tenant: str | None) -> list[Region]:
        return [r for (t, _), r in self._regions.items() if t == tenant]


class SharedRegions:
    """Registrations every process of one server reads: a file per region in `directory`,
    created with `link` (atomic, and refused when the name is taken) and removed with `unlink`."""

    def __init__(self, directory: Path) -> None:
        self._dir = directory
        directory.mkdir(exist_ok=True)

    def _path(self, tenant: str | None, name: str) -> Path:
        digest = hashlib.sha256(json.dumps([tenant, name]).encode()).hexdigest()
        return self._dir / f"{digest}.json"

    def add(self, tenant: str | None, region: Region) -> bool:
        record = json.dumps({"tenant": tenant, **asdict(region)})
        partial = self._dir / f".{os.getpid()}.{threading.get_ident()}.partial"
        partial.write_text(record)
        try:
            os.link(partial, self._path(tenant, region.name))
        except FileExistsError:
            return False
        finally:
            partial.unlink()
        return True

    def get(self, tenant: str | None, name: str) -> Region | None:
        try:
            return _region(self._path(tenant, name).read_text())
        except FileNotFoundError:
            return None

    def remove(self, tenant: str | None, name: str | None) -> None:
        names = [r.name for r in self.all(tenant)] if name is None else [name]
        for each in names:
            self._path(tenant, each).unlink(missing_ok=True)

    def all(self, tenant: str | None) -> list[Region]:
        regions = []
        for path in self._dir.glob("*.json"):
            try:
                record = json.loads(path.read_text())
            except FileNotFoundError:  # unregistered meanwhile
                continue
            if record.pop("tenant") == tenant:
                regions.append(Region(**record))
        return sorted(regions, key=lambda r: r.name)


def _region(text: str) -> Region:
    record = json.loads(text)
    record.pop("tenant")
    return Region(**record)


@dataclass(frozen=True)
class _Mapped:
    region: Region
    mapping: mmap.mmap
    start: int  # where the region begins in the mapping (the mapping starts page-aligned)
    writable: bool  # the server's user may write the object (outputs)


class SharedMemory:
    """One server's regions, per tenant, and this process's mappings of them."""

    def of(self, tenant: str | None) -> TenantRegions:
        return TenantRegions(self, tenant)

    def __init__(self, store: RegionStore, enabled: bool, shm_dir: Path = SHM_DIR) -> None:
        self._store = store
        self.enabled = enabled
        self._dir = shm_dir
        self._mapped: dict[tuple[str | None, str], _Mapped] = {}

    def _check_enabled(self) -> None:
        if not self.enabled:
            raise Forbidden(REGION, DISABLED)

    # -- the extension's calls ---------------------------------------------------------------

    def register(self, tenant: str | None, name: str, body: Mapping[str, Any]) -> None:
        """Triton's register: `body` is {key, offset, byte_size}; the object must open and hold
        the whole range."""
        self._check_enabled()
        if not name:
            raise MalformedRequest("a region needs a name", "name")
        key = _field(body, "key", str)
        offset = _field(body, "offset", int, 0)
        byte_size = _field(body, "byte_size", int)
        if offset < 0 or byte_size < 1:
            raise InvalidInput("byte_size" if byte_size < 1 else "offset", "must be a byte count")
        path = self._object_path(key)
        with _opened(path, key) as (fd, _):
            info = os.fstat(fd)
        if offset + byte_size > info.st_size:
            raise InvalidInput(
                "byte_size",
                f"offset {offset} + byte_size {byte_size} runs past the end of shared memory "
                f"object {key!r} ({info.st_size} bytes)",
            )
        if len(self._store.all(tenant)) >= MAX_REGIONS:
            raise InvalidInput("name", f"at most {MAX_REGIONS} regions are registered at once")
        region = Region(name, key, offset, byte_size, info.st_dev, info.st_ino)
        if not self._store.add(tenant, region):
            raise InvalidInput(
                "name", f"shared memory region {name!r} is registered already; unregister it first"
            )

    def unregister(self, tenant: str | None, name: str | None) -> None:
        """One region (unknown names are fine, as in Triton), or all of the tenant's."""
        self._check_enabled()
        self._store.remove(tenant, name)
        for key in [k for k in self._mapped if k[0] == tenant and name in (None, k[1])]:
            del self._mapped[key]  # not closed: views of it may live (see the module's doc)

    def status(self, tenant: str | None, name: str | None) -> list[dict[str, Any]]:
        self._check_enabled()
        if name is None:
            return [r.status() for r in self._store.all(tenant)]
        region = self._store.get(tenant, name)
        if region is None:
            raise InvalidInput("name", f"unable to find system shared memory region {name!r}")
        return [region.status()]

    # -- tensors -----------------------------------------------------------------------------

    def read(self, tenant: str | None, ref: TensorRef, field: str) -> memoryview:
        """The input's bytes, a read-only view of the region (no copy)."""
        mapped = self._range(tenant, ref, field)
        start = mapped.start + ref.offset
        return memoryview(mapped.mapping)[start : start + ref.byte_size].toreadonly()

    def write(self, tenant: str | None, ref: TensorRef, data: bytes, field: str) -> int:
        """An output's bytes written into the region; how many."""
        mapped = self._range(tenant, ref, field)
        if len(data) > ref.byte_size:
            raise InvalidInput(
                field,
                f"output takes {len(data)} bytes; shared_memory_byte_size gives it "
                f"{ref.byte_size} in region {ref.region!r}",
            )
        if not mapped.writable:
            raise InvalidInput(field, f"region {ref.region!r} is read-only to the server")
        start = mapped.start + ref.offset
        mapped.mapping[start : start + len(data)] = data
        return len(data)

    def check(self, tenant: str | None, ref: TensorRef, field: str) -> None:
        """An output's region and range, checked before the work."""
        self._range(tenant, ref, field)

    def _range(self, tenant: str | None, ref: TensorRef, field: str) -> _Mapped:
        self._check_enabled()
        mapped = self._mapping(tenant, ref.region, field)
        region = mapped.region
        if ref.offset + ref.byte_size > region.byte_size:
            raise InvalidInput(
                field,
                f"shared_memory_offset {ref.offset} + shared_memory_byte_size {ref.byte_size} "
                f"runs past the end of region {region.name!r} ({region.byte_size} bytes)",
            )
        # Read before every use: a page past the object's end is a SIGBUS, not an exception.
        if mapped.mapping.size() < region.offset + region.byte_size:
            raise InvalidInput(
                field,
                f"shared memory object {region.key!r} shrank to {mapped.mapping.size()} bytes "
                f"since region {region.name!r} was registered",
            )
        return mapped

    def _mapping(self, tenant: str | None, name: str, field: str) -> _Mapped:
        region = self._store.get(tenant, name)
        if region is None:
            self._mapped.pop((tenant, name), None)
            raise InvalidInput(field, f"shared memory region {name!r} is not registered")
        mapped = self._mapped.get((tenant, name))
        if mapped is None or mapped.region != region:
            mapped = self._map(region, field)
            self._mapped[(tenant, name)] = mapped
        return mapped

    def _map(self, region: Region, field: str) -> _Mapped:
        with _opened(self._object_path(region.key), region.key, field) as (fd, writable):
            info = os.fstat(fd)
            if (info.st_dev, info.st_ino) != (region.device, region.inode):
                raise InvalidInput(
                    field,
                    f"shared memory key {region.key!r} names another object than when region "
                    f"{region.name!r} was registered; register it again",
                )
            if info.st_size < region.offset + region.byte_size:
                raise InvalidInput(
                    field, f"shared memory object {region.key!r} is smaller than its region"
                )
            aligned = region.offset - region.offset % mmap.ALLOCATIONGRANULARITY
            length = region.offset - aligned + region.byte_size
            access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
            mapping = mmap.mmap(fd, length, offset=aligned, access=access)
        return _Mapped(region, mapping, region.offset - aligned, writable)

    def _object_path(self, key: str) -> Path:
        """`/dev/shm/<key>`: one file name (shm_open's leading slashes dropped), never a path
        out of the directory."""
        name = key.lstrip("/")
        if not name or "/" in name or name in (".", "..") or "\0" in name:
            raise InvalidInput("key", f"{key[:80]!r} is not a shared memory key (/name)")
        if len(name) > MAX_KEY_CHARS:
            raise InvalidInput("key", f"a shared memory key has at most {MAX_KEY_CHARS} characters")
        return self._dir / name


@dataclass(frozen=True)
class TenantRegions:
    """One request's view: its tenant's regions, to read inputs from and write outputs to."""

    memory: SharedMemory
    tenant: str | None

    def read(self, ref: TensorRef, field: str, datatype: str) -> bytes | memoryview:
        """An input's bytes: a view of the region (BYTES copied, their items are bytes)."""
        view = self.memory.read(self.tenant, ref, field)
        return bytes(view) if datatype == "BYTES" else view

    def check(self, refs: Mapping[str, TensorRef]) -> None:
        """Outputs' regions and ranges, checked before the work."""
        for name, ref in refs.items():
            self.memory.check(self.tenant, ref, name)

    def write(self, ref: TensorRef, data: bytes, field: str) -> None:
        """An output written into its region. Its response entry then has a name, datatype
        and shape only, as from Triton (perf_analyzer's HTTP client reads any `parameters` of
        an output as binary data's)."""
        self.memory.write(self.tenant, ref, data, field)


@contextlib.contextmanager
def _opened(path: Path, key: str, field: str = "key") -> Iterator[tuple[int, bool]]:
    """The object's file descriptor and whether it is writable, closed on exit; a 4xx naming
    `field` when it cannot be opened or is not a memory object (a FIFO, a directory)."""
    flags = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        try:
            fd, writable = os.open(path, os.O_RDWR | flags), True
        except PermissionError:
            fd, writable = os.open(path, os.O_RDONLY | flags), False
    except OSError as exc:
        message = f"unable to open shared memory key {key!r}: {exc.strerror}"
        raise InvalidInput(field, message) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InvalidInput(field, f"shared memory key {key!r} is not a memory object")
        yield fd, writable
    finally:
        os.close(fd)


def _field(body: Mapping[str, Any], name: str, kind: type, default: Any = None) -> Any:
    value = body.get(name, default)
    if value is None:
        raise InvalidInput(name, f"{name} is required")
    if type(value) is not kind:
        raise InvalidInput(name, f"{name} must be {'a string' if kind is str else 'an integer'}")
    return value


def tensor_ref(field: str, parameters: Mapping[str, Any]) -> TensorRef | None:
    """A tensor's region from its parameters (HTTP's JSON object, gRPC's as plain values);
    None when it names none. Region and byte size come together, or neither (Triton's rule)."""
    region = parameters.get(REGION)
    size = parameters.get(BYTE_SIZE)
    offset = parameters.get(OFFSET, 0)
    if region is None and size is None:
        if OFFSET in parameters:
            raise InvalidInput(field, f"parameters.{OFFSET} needs {REGION} and {BYTE_SIZE}")
        return None
    if region is None or size is None:
        raise InvalidInput(field, f"parameters.{REGION} and {BYTE_SIZE} go together")
    if not isinstance(region, str) or not region:
        raise InvalidInput(field, f"parameters.{REGION} must be a region's name")
    for name, value in ((BYTE_SIZE, size), (OFFSET, offset)):
        if type(value) is not int or value < 0:
            raise InvalidInput(
                field, f"parameters.{name} must be a count of bytes, got {value!r:.40}"
            )
    return TensorRef(region, offset, size)
