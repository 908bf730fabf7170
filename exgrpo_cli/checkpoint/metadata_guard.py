"""The optimizer checkpoint's metadata read as data, never as code.

Where it sits: at resume, before the optimizer state is loaded (and in `checkpoint.verify`, so a
refused checkpoint is quarantined like a corrupt one). torch.distributed.checkpoint keeps the index
of a sharded state in `optimizer/.metadata`, which its FileSystemReader reads with plain
`pickle.load`: a crafted file runs whatever it names.

How it is read here: not by pickle at all. checkpoint/pickle_ops.py decodes the opcode stream into
a tree of plain values (a global is a name, a call is a node, nothing is imported, called or
mutated), and this module builds torch's metadata objects from that tree in its own code, checking
every value: only the shapes torch writes for a state of tensors (a bytes entry would be loaded by
torch with `torch.load(weights_only=False)`, a full unpickle, so it is refused), data files that
are plain names of regular files inside the folder, offsets and lengths inside those files, chunk
geometry inside each tensor, every chunk stored. Any failure is a `NotDataError` with a short
message.

Why this rather than a restricted unpickler or a pickle-free format. A restricted unpickler hands
the allowed classes themselves to pickle's machinery, and its BUILD opcode sets attributes on
whatever is on the stack, classes included (the hole of round two): allow-lists bound what is
*named*, not what is *done*. Parsing the opcodes into plain values leaves no object of ours for the
file to act on. A pickle-free optimizer format would also be safe, but the sharded state must keep
resharding onto another rank count at load, which torch.distributed.checkpoint's planner already
does from this metadata; a second format would duplicate that planner and could not read the
checkpoints already written.
"""

from __future__ import annotations

import math
import os
import stat
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from exgrpo_cli.checkpoint.pickle_ops import Call, Global, PickleRefused, parse, short
from exgrpo_cli.checkpoint.safe_read import UnsafeFile, read_regular

if TYPE_CHECKING:
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import Metadata

METADATA_FILE = ".metadata"
MAX_METADATA_BYTES = 256 * 2**20  # ~2 MB at 7B on 8 ranks; generous for 70B on hundreds of ranks
MAX_MESSAGE = 240
_DCP = "torch.distributed.checkpoint.metadata"
_FS = "torch.distributed.checkpoint.filesystem"
# StorageMeta.checkpoint_id, where the files were written: a path. Python 3.13 pickles the path
# classes under pathlib._local, other versions under pathlib
_PATHS = {(m, n) for m in ("pathlib", "pathlib._local") for n in ("PosixPath", "PurePosixPath")}
_MAX_DIM = 2**40  # per dimension and per tensor (elements): beyond any model, below int64 overflow
_MAX_DIMS = 16


class NotDataError(ValueError):
    """The metadata file holds something other than checkpoint data."""

    def __init__(self, message: str) -> None:
        super().__init__(message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 3] + "...")


def _obj(node: Any, cls: str, module: str = _DCP) -> Any:
    """The state of a `Call` node of `module.cls()` (NEWOBJ with no arguments, then BUILD)."""
    if not isinstance(node, Call) or node.func != Global(module, cls):
        what = (
            f"a call of {node.func.module}.{node.func.name}"
            if isinstance(node, Call) and isinstance(node.func, Global)
            else short(node)
        )
        raise NotDataError(f"it holds {what} where torch writes a {cls}")
    if node.args != () or not node.built:
        raise NotDataError(f"a {cls} is built in a way torch never writes")
    return node.state


def _fields(state: Any, cls: str, required: set[str], optional: set[str]) -> dict[str, Any]:
    if not isinstance(state, dict) or not required <= set(state) or set(state) - required - optional:
        raise NotDataError(f"a {cls} has other fields than torch writes")
    return state


def _int(v: Any, what: str, low: int = 0, high: int = 2**62) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
        raise NotDataError(f"{what} is {short(v)}, not an int in [{low}, {high}]")
    return v


def _str(v: Any, what: str, none: bool = False) -> Any:
    if (v is None and none) or isinstance(v, str):
        return v
    raise NotDataError(f"{what} is {short(v)}, not a string")


def _size(node: Any, what: str) -> Any:
    import torch

    if not isinstance(node, Call) or node.func != Global("torch", "Size") or node.built:
        raise NotDataError(f"{what} is {short(node)}, not a torch.Size")
    dims = node.args[0] if len(node.args) == 1 else None
    if not isinstance(dims, (tuple, list)) or len(dims) > _MAX_DIMS:
        raise NotDataError(f"{what} is not a torch.Size of at most {_MAX_DIMS} dimensions")
    return torch.Size([_int(d, what, 0, _MAX_DIM) for d in dims])


def _properties(node: Any) -> Any:
    import torch
    from torch.distributed.checkpoint.metadata import TensorProperties

    state = _obj(node, "TensorProperties")
    if not isinstance(state, tuple) or len(state) != 5:
        raise NotDataError("a TensorProperties is not the 5 values torch writes")
    dtype, layout, grad, mem, pin = state
    if not isinstance(dtype, Global) or dtype.module != "torch":
        raise NotDataError(f"a dtype is {short(dtype)}, not a torch dtype")
    # looked up in torch's namespace as it is: getattr would trigger torch's lazy submodule imports
    value = vars(torch).get(dtype.name)
    if not isinstance(value, torch.dtype):
        raise NotDataError(f"a dtype is {short(dtype)}, not a torch dtype")
    if not isinstance(layout, Call) or layout.func != Global("torch.serialization", "_get_layout"):
        raise NotDataError(f"a layout is {short(layout)}, not torch's")
    if layout.args != ("torch.strided",) or layout.built:
        raise NotDataError("a layout other than torch.strided (the optimizer state is dense)")
    formats = (torch.contiguous_format, torch.channels_last, torch.preserve_format)
    if not isinstance(mem, Call) or mem.func != Global(_DCP, "_MEM_FORMAT_ENCODING") or mem.built:
        raise NotDataError(f"a memory format is {short(mem)}, not torch's encoding")
    code = _int(mem.args[0] if len(mem.args) == 1 else None, "a memory format", 0, len(formats) - 1)
    if not isinstance(grad, bool) or not isinstance(pin, bool):
        raise NotDataError("a TensorProperties flag is not a bool")
    return TensorProperties(
        dtype=value, layout=torch.strided, requires_grad=grad, memory_format=formats[code], pin_memory=pin
    )


def _tensor_entry(key: str, node: Any) -> Any:
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, TensorStorageMetadata

    if isinstance(node, Call) and node.func != Global(_DCP, "TensorStorageMetadata"):
        name = node.func.name if isinstance(node.func, Global) else "something else"
        raise NotDataError(
            f"entry {short(key)} is a {name}, not a tensor (torch would unpickle it unrestricted)"
        )
    st = _fields(
        _obj(node, "TensorStorageMetadata"), "TensorStorageMetadata", {"properties", "size", "chunks"}, set()
    )
    size = _size(st["size"], f"the size of {short(key)}")
    numel = math.prod(size)  # Python ints: torch.Size.numel() wraps around int64
    if numel > _MAX_DIM:
        raise NotDataError(f"entry {short(key)} has {numel} elements, more than any model's")
    chunks, covered = [], 0
    if not isinstance(st["chunks"], list) or not st["chunks"]:
        raise NotDataError(f"entry {short(key)} has no list of chunks")
    for c in st["chunks"]:
        cs = _fields(_obj(c, "ChunkStorageMetadata"), "ChunkStorageMetadata", {"offsets", "sizes"}, set())
        offsets, sizes = _size(cs["offsets"], "a chunk offset"), _size(cs["sizes"], "a chunk size")
        if len(offsets) != len(size) or len(sizes) != len(size):
            raise NotDataError(f"a chunk of {short(key)} has other dimensions than the tensor")
        if any(o + n > d for o, n, d in zip(offsets, sizes, size)):
            raise NotDataError(f"a chunk of {short(key)} reaches outside the tensor")
        covered += math.prod(sizes)
        chunks.append(ChunkStorageMetadata(offsets=offsets, sizes=sizes))
    if covered != numel:
        raise NotDataError(f"the chunks of {short(key)} hold {covered} elements, the tensor {numel}")
    return TensorStorageMetadata(properties=_properties(st["properties"]), size=size, chunks=chunks)


def _storage(storage: dict[Any, Any], entries: dict[str, Any], folder: Path) -> dict[Any, Any]:
    """The index of where each chunk is stored, checked against the folder's files."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import MetadataIndex

    out, sizes = {}, {}
    for key, value in storage.items():
        k = _fields(_obj(key, "MetadataIndex"), "MetadataIndex", {"fqn"}, {"offset", "index"})
        fqn = _str(k["fqn"], "a stored entry's name")
        if fqn not in entries:
            raise NotDataError(f"a stored chunk belongs to {short(fqn)}, which is not an entry")
        offset = _size(k["offset"], "a stored chunk's offset")
        index = None if k.get("index") is None else _int(k["index"], "a chunk index", 0, 2**31)
        v = _fields(
            _obj(value, "_StorageInfo", _FS),
            "_StorageInfo",
            {"relative_path", "offset", "length"},
            {"transform_descriptors"},
        )
        name = v["relative_path"]
        if not isinstance(name, str) or not name or PurePosixPath(name).name != name or name in (".", ".."):
            raise NotDataError(f"a data file is named {short(name)}, not a plain file name inside the folder")
        if v.get("transform_descriptors"):
            raise NotDataError("a stored chunk is transformed (compressed), which exgrpo never writes")
        if name not in sizes:
            sizes[name] = _regular_size(folder / name)
        start, length = _int(v["offset"], "a chunk's file offset"), _int(v["length"], "a chunk's length")
        if start + length > sizes[name]:
            raise NotDataError(f"a chunk reaches past the end of {short(name)} ({sizes[name]} bytes)")
        out[MetadataIndex(fqn, offset, index)] = _StorageInfo(relative_path=name, offset=start, length=length)
    stored = {(i.fqn, tuple(i.offset or ())) for i in out}
    for key, entry in entries.items():
        for c in entry.chunks:
            if (key, tuple(c.offsets)) not in stored:
                raise NotDataError(f"a chunk of {short(key)} is not stored in any file")
    return out


def _storage_meta(node: Any) -> Any:
    from pathlib import PosixPath

    from torch.distributed.checkpoint.metadata import StorageMeta

    if node is None:
        return None
    st = _fields(
        _obj(node, "StorageMeta"), "StorageMeta", set(), {"checkpoint_id", "save_id", "load_id", "modules"}
    )
    where = st.get("checkpoint_id")
    if (
        isinstance(where, Call)
        and isinstance(where.func, Global)
        and (where.func.module, where.func.name) in _PATHS
    ):
        if where.built or not all(isinstance(p, str) for p in where.args):
            raise NotDataError("a checkpoint path is not a path of strings")
        where = PosixPath(*where.args)
    elif where is not None and not isinstance(where, str):
        raise NotDataError(f"a checkpoint path is {short(where)}")
    modules = st.get("modules", [])
    if not isinstance(modules, list) or not all(isinstance(m, str) for m in modules):
        raise NotDataError("its module list is not a list of strings")
    return StorageMeta(
        checkpoint_id=where,
        save_id=_str(st.get("save_id"), "a save id", none=True),
        load_id=_str(st.get("load_id"), "a load id", none=True),
        modules=list(modules),
    )


def _regular_size(path: Path) -> int:
    """The size of `path`, a regular file that is no symlink; NotDataError otherwise."""
    try:
        st = os.lstat(path)
    except OSError as err:
        raise NotDataError(f"{short(path.name)} cannot be read ({type(err).__name__})") from None
    if not stat.S_ISREG(st.st_mode):
        raise NotDataError(f"{short(path.name)} is not a regular file (a link, a pipe or a device)")
    return st.st_size


def _read(path: Path) -> bytes:
    try:
        return read_regular(path, MAX_METADATA_BYTES)
    except UnsafeFile as err:
        raise NotDataError(str(err)) from None


def read_metadata(path: Path) -> Metadata:
    """The torch.distributed.checkpoint metadata in file `path`, parsed as data only (see the
    module docstring). Raises NotDataError (saying what it found, briefly) for anything else;
    nothing named in the file is imported, run or changed."""
    return metadata_from_bytes(_read(path), path.parent)


def metadata_from_bytes(data: bytes, folder: Path) -> Metadata:
    """`read_metadata` of the bytes of a metadata file in `folder` (whose data files it checks)."""
    from torch.distributed.checkpoint.metadata import Metadata

    try:
        tree = parse(data)
    except PickleRefused as err:
        raise NotDataError(f"it does not parse as checkpoint metadata ({err})") from None
    try:
        return _metadata(tree, folder, Metadata)
    except NotDataError:
        raise
    except Exception as err:  # noqa: BLE001 - whatever a crafted tree trips is a refusal
        raise NotDataError(f"it does not parse as checkpoint metadata ({type(err).__name__})") from None


def _metadata(tree: Any, folder: Path, cls: type) -> Any:
    if isinstance(tree, Call) and isinstance(tree.func, Global) and tree.func != Global(_DCP, "Metadata"):
        raise NotDataError(
            f"it names {tree.func.module}.{tree.func.name}, which is not one of the checkpoint-metadata types"
        )
    st = _fields(
        _obj(tree, "Metadata"),
        "Metadata",
        {"state_dict_metadata"},
        {"planner_data", "storage_data", "storage_meta", "version"},
    )
    entries = st["state_dict_metadata"]
    if not isinstance(entries, dict) or not isinstance(st.get("storage_data"), dict):
        raise NotDataError("its entries or storage index are not mappings, as torch writes them")
    tensors = {_str(k, "an entry name"): _tensor_entry(k, v) for k, v in entries.items()}
    planner = st.get("planner_data")
    if planner is not None:
        ok = isinstance(planner, dict) and all(
            isinstance(v, tuple) and all(isinstance(p, (str, int)) and not isinstance(p, bool) for p in v)
            for v in planner.values()
        )
        if not ok:
            raise NotDataError("its planner data is not a mapping of name paths")
    return cls(
        state_dict_metadata=tensors,
        planner_data=planner,
        storage_data=_storage(st["storage_data"], tensors, folder),
        storage_meta=_storage_meta(st.get("storage_meta")),
        version=_str(st.get("version"), "its version", none=True),
    )


def refusal(folder: Path) -> str | None:
    """None when optimizer folder `folder` has no metadata file or one that is data, else the
    reason, naming the file (for `checkpoint.verify`)."""
    path = folder / METADATA_FILE
    if not os.path.lexists(path):  # a link to a device is not "no file": read_regular refuses it
        return None
    try:
        read_metadata(path)
    except NotDataError as err:
        return f"{path}: holds something other than data ({err}); it was not loaded and nothing in it ran"
    return None


def data_only_reader(folder: Path) -> FileSystemReader:
    """A torch.distributed.checkpoint reader of `folder` whose metadata goes through
    `read_metadata` instead of `pickle.load` (hand it to `dcp.load(storage_reader=...)`)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class DataOnlyReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
            rank = kwargs.get("rank")
            name = METADATA_FILE if rank is None else f"__{rank}{METADATA_FILE}"
            meta = read_metadata(Path(self.path) / name)
            # what FileSystemReader.read_metadata adds after its pickle.load
            storage = meta.storage_meta if meta.storage_meta is not None else StorageMeta()
            storage.load_id = self.load_id
            meta.storage_meta = storage
            return meta

    return DataOnlyReader(str(folder))
