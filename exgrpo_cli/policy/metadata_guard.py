"""The optimizer checkpoint's metadata read as data, never as code.

Where it sits: at resume, before the optimizer state is loaded (and in `checkpoint.verify`, so a
refused checkpoint is quarantined like a corrupt one). torch.distributed.checkpoint keeps the index
of a sharded state in `optimizer/.metadata`, which its FileSystemReader reads with plain
`pickle.load`: a crafted file runs whatever it names. Here the file is parsed by an unpickler that
knows only the types torch writes there (the checkpoint-metadata dataclasses, torch.Size, dtypes,
layouts, memory formats, a path), and the result is checked further:

- every entry is a tensor: torch loads tensor entries with `torch.load(weights_only=True)`, a
  restricted unpickler of its own, but a non-tensor ("bytes") entry with `weights_only=False`, a
  full unpickle. Our optimizer state holds only tensors, so a bytes entry is refused outright.
- every entry's data file is a plain file name inside the folder (no `../`): the reader must not
  be steered to other files.

Why a restricted unpickler rather than a pickle-free optimizer format: the sharded state must keep
resharding onto another rank count at load, which torch.distributed.checkpoint's planner already
does from this metadata; a second format would duplicate that planner. The metadata is a few
dozen kilobytes of dataclasses, so an allow-list of its types is small and complete.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import Metadata

METADATA_FILE = ".metadata"
_DCP_METADATA = "torch.distributed.checkpoint.metadata"
# (module, name) of every type torch.distributed.checkpoint writes into the metadata of a state
# made only of tensors (read in torch 2.13's metadata.py and filesystem.py, and seen in the files)
_ALLOWED = {
    (_DCP_METADATA, "Metadata"),
    (_DCP_METADATA, "MetadataIndex"),
    (_DCP_METADATA, "StorageMeta"),
    (_DCP_METADATA, "TensorStorageMetadata"),
    (_DCP_METADATA, "ChunkStorageMetadata"),
    (_DCP_METADATA, "TensorProperties"),
    (_DCP_METADATA, "_MEM_FORMAT_ENCODING"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.serialization", "_get_layout"),  # a layout by its name (str -> torch.layout)
    ("torch", "Size"),
}
# StorageMeta.checkpoint_id, where the files were written: a path. Python 3.13 pickles the path
# classes under pathlib._local, other versions under pathlib; both resolve to this Python's class
_PATH_MODULES = ("pathlib", "pathlib._local")
_PATH_CLASSES = ("PosixPath", "PurePosixPath")


class NotDataError(ValueError):
    """The metadata file holds something other than checkpoint data."""


class _DataOnlyUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        import torch

        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module in _PATH_MODULES and name in _PATH_CLASSES:
            import pathlib

            return getattr(pathlib, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise NotDataError(f"it names {module}.{name}, which is not one of the checkpoint-metadata types")

    def persistent_load(self, pid: Any) -> Any:
        raise NotDataError("it holds a persistent reference, which checkpoint metadata never does")


def read_metadata(path: Path) -> Metadata:
    """The torch.distributed.checkpoint metadata in file `path`, parsed as data only. Raises
    NotDataError (saying what it found) for anything else; nothing named in the file is run."""
    from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

    try:
        meta = _DataOnlyUnpickler(io.BytesIO(path.read_bytes())).load()
    except NotDataError:
        raise
    except Exception as err:  # a truncated or garbled file: not data we can use either
        raise NotDataError(f"it does not parse as checkpoint metadata ({type(err).__name__}: {err})") from err
    if not isinstance(meta, Metadata):
        raise NotDataError(f"it holds a {type(meta).__name__}, not torch's checkpoint Metadata")
    # allowed types can still be filled with the wrong shapes: checked, never assumed
    entries, storage = getattr(meta, "state_dict_metadata", None), getattr(meta, "storage_data", None)
    if not isinstance(entries, dict) or not isinstance(storage, dict):
        raise NotDataError("its entries or storage index are not mappings, as torch writes them")
    for key, entry in entries.items():
        if not isinstance(entry, TensorStorageMetadata):
            raise NotDataError(
                f"entry {key!r} is a {type(entry).__name__}, not a tensor "
                "(torch would unpickle it unrestricted)"
            )
    for info in storage.values():
        name = getattr(info, "relative_path", None)
        if not isinstance(name, str) or not name or PurePosixPath(name).name != name or name in (".", ".."):
            raise NotDataError(f"a data file is named {name!r}, not a plain file name inside the folder")
    return meta


def refusal(folder: Path) -> str | None:
    """None when optimizer folder `folder` has no metadata file or one that is data, else the
    reason, naming the file (for `checkpoint.verify`)."""
    path = folder / METADATA_FILE
    if not path.is_file():
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
