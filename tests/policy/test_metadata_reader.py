"""The optimizer metadata reader cannot be steered (issue 30, round two): no class is changed by
BUILD, no opcode stream crashes or hangs it, non-regular files are refused, crafted sizes and
offsets are refused before dcp.load, messages stay short. Every crafted file is built here."""

from __future__ import annotations

import os
import pathlib
import pickle
import random
import struct
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from policy.test_metadata_guard import _trained

from exgrpo_cli.checkpoint.metadata_guard import (
    MAX_MESSAGE,
    METADATA_FILE,
    NotDataError,
    metadata_from_bytes,
    read_metadata,
    refusal,
)

_DCP = b"torch.distributed.checkpoint.metadata"


def _sub(s: bytes) -> bytes:
    if len(s) < 256:
        return b"\x8c" + bytes([len(s)]) + s
    return b"X" + struct.pack("<I", len(s)) + s  # BINUNICODE


def _global(module: bytes, name: bytes) -> bytes:
    return _sub(module) + _sub(name) + b"\x93"


def _real(folder: Path) -> bytes:
    _trained(folder)
    return (folder / METADATA_FILE).read_bytes()


def _class_snapshot() -> dict[str, dict[str, Any]]:
    from torch.distributed.checkpoint import metadata as m
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    classes = [pathlib.PurePath, pathlib.PurePosixPath, pathlib.Path, pathlib.PosixPath, torch.Size]
    classes += [m.Metadata, m.TensorStorageMetadata, m.TensorProperties, m.ChunkStorageMetadata]
    classes += [m.MetadataIndex, m.StorageMeta, _StorageInfo]
    return {c.__qualname__: dict(vars(c)) for c in classes}


def test_build_on_an_allowed_class_changes_nothing(tmp_path: Path) -> None:
    """BUILD with a (None, slots) state on a class object is setattr on the class: the old
    restricted unpickler let a file set attributes of pathlib's classes."""
    before = _class_snapshot()
    crafted = (
        b"\x80\x04" + _global(b"pathlib", b"PosixPath") + b"N}" + _sub(b"exgrpo_poisoned") + b"K\x01s\x86b."
    )
    (tmp_path / METADATA_FILE).write_bytes(crafted)
    with pytest.raises(NotDataError):
        read_metadata(tmp_path / METADATA_FILE)
    assert not hasattr(pathlib.PosixPath, "exgrpo_poisoned")
    assert _class_snapshot() == before


def test_a_refused_torch_name_imports_nothing(tmp_path: Path) -> None:
    """The old reader looked up `torch.<name>` with getattr, which runs torch's lazy imports
    (checked in a fresh interpreter, where nothing imported them yet)."""
    import subprocess

    crafted = b"\x80\x04" + _global(b"torch", b"onnx") + b"."
    (tmp_path / METADATA_FILE).write_bytes(crafted)
    code = (
        "import sys, torch; from pathlib import Path\n"
        "from exgrpo_cli.checkpoint.metadata_guard import refusal\n"
        "assert 'torch.onnx' not in sys.modules\n"
        f"print(refusal(Path({str(tmp_path)!r})) is not None, 'torch.onnx' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["True", "False"], out.stdout + out.stderr[-2000:]


def test_not_regular_files_are_refused_without_blocking(tmp_path: Path) -> None:
    """A FIFO as .metadata hung resume for ever; a link to /dev/zero read until memory ran out."""
    fifo, link = tmp_path / "fifo", tmp_path / "link"
    fifo.mkdir()
    link.mkdir()
    os.mkfifo(fifo / METADATA_FILE)
    (link / METADATA_FILE).symlink_to("/dev/zero")
    t0 = time.monotonic()
    for folder in (fifo, link):
        reason = refusal(folder)
        assert reason is not None and "not a regular file" in reason or "cannot be opened" in str(reason)
    assert time.monotonic() - t0 < 5


@pytest.mark.parametrize(
    "crafted",
    [
        pytest.param(b"\x80\x04" + b"]" * 200_000 + b".", id="deep-nesting"),  # RecursionError before
        pytest.param(b"\x80\x04" + b"(" * 300_000 + b"t.", id="wide-mark"),
        pytest.param(b"\x80\x04)" + b"\x94h\x00h\x00\x86" * 60 + b"}\x94h\x01K\x00s.", id="tuple-key-hash"),
        pytest.param(b"\x80\x04\x8d" + struct.pack("<Q", 2**40) + b"x.", id="huge-declared-length"),
        pytest.param(b"\x80\x04" + _global(b"os" * 400_000, b"system") + b".", id="long-name"),
    ],
)
def test_hostile_streams_are_refused_quickly_and_briefly(tmp_path: Path, crafted: bytes) -> None:
    t0 = time.monotonic()
    with pytest.raises(NotDataError) as info:
        metadata_from_bytes(crafted, tmp_path)
    assert time.monotonic() - t0 < 5
    assert len(str(info.value)) <= MAX_MESSAGE


def _edited(folder: Path, edit: str) -> None:
    meta = pickle.loads((folder / METADATA_FILE).read_bytes())  # our own file, just written
    entry = meta.state_dict_metadata["state.weight.exp_avg"]
    info_key = next(k for k in meta.storage_data if k.fqn == "state.weight.exp_avg")
    if edit == "offset-past-the-file":
        meta.storage_data[info_key].offset = 10**9
    elif edit == "chunk-outside-the-tensor":
        entry.chunks[0].sizes = torch.Size([3, 9])
    elif edit == "huge-size":
        entry.size = torch.Size([2**35, 2**35])
    elif edit == "chunk-not-stored":
        del meta.storage_data[info_key]
    (folder / METADATA_FILE).write_bytes(pickle.dumps(meta))


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        ("offset-past-the-file", "past the end"),
        ("chunk-outside-the-tensor", "outside the tensor"),
        ("huge-size", "more than any model"),
        ("chunk-not-stored", "not stored"),
    ],
)
def test_sizes_and_offsets_are_checked_against_the_files(tmp_path: Path, edit: str, said: str) -> None:
    """These passed the old guard and failed inside dcp.load (or allocated without bound)."""
    _real(tmp_path)
    _edited(tmp_path, edit)
    with pytest.raises(NotDataError, match=said):
        read_metadata(tmp_path / METADATA_FILE)


# ----------------------------------------------------------------------------- fuzzing

_NAMES = [b"torch", b"Size", b"float32", b"pathlib", b"PosixPath", b"os", b"system", _DCP, b"Metadata"]
_NAMES += [b"TensorProperties", b"TensorStorageMetadata", b"ChunkStorageMetadata", b"__class__"]
_OPS = [b"(", b")", b"]", b"}", b"\x85", b"\x86", b"\x87", b"t", b"l", b"d", b"a", b"e", b"s", b"u"]
_OPS += [b"b", b"R", b"\x81", b"\x93", b"0", b"1", b"2", b"\x94", b"N", b"\x88", b"\x89", b"\x8f", b"\x92"]
_OPS += [b"\x91", b"\x90", b"o", b"P", b"Q", b"\x82", b"\x95"]


def _random_stream(rng: random.Random) -> bytes:
    parts = [b"\x80\x04"]
    for _ in range(rng.randint(1, 60)):
        r = rng.random()
        if r < 0.25:
            parts.append(_sub(rng.choice(_NAMES)))
        elif r < 0.35:
            parts.append(b"h" + bytes([rng.randrange(8)]))
        elif r < 0.45:
            parts.append(b"K" + bytes([rng.randrange(256)]))
        elif r < 0.5:
            parts.append(b"c" + rng.choice(_NAMES) + b"\n" + rng.choice(_NAMES) + b"\n")
        else:
            parts.append(rng.choice(_OPS))
    parts.append(b".")
    return b"".join(parts)


def _mutated(rng: random.Random, real: bytes) -> bytes:
    data = bytearray(real)
    for _ in range(rng.randint(1, 6)):
        i = rng.randrange(len(data))
        kind = rng.random()
        if kind < 0.5:
            data[i] = rng.randrange(256)
        elif kind < 0.7:
            del data[i : i + rng.randint(1, 8)]
        elif kind < 0.9:
            data[i:i] = rng.choice(_OPS) * rng.randint(1, 3)
        else:  # splice a piece of the file elsewhere (memo references, repeated objects)
            j = rng.randrange(len(data))
            data[i:i] = data[j : j + rng.randint(1, 40)]
    return bytes(data)


def test_fuzzed_streams_give_a_refusal_or_metadata_never_a_crash(tmp_path: Path) -> None:
    """Thousands of random and mutated opcode streams: each is refused (NotDataError, short
    message) or is valid metadata; no other exception, no slow case, no class changed."""
    from torch.distributed.checkpoint.metadata import Metadata

    real = _real(tmp_path)
    rng, before = random.Random(30), _class_snapshot()
    counts = {"refused": 0, "valid": 0}
    slowest, t0 = 0.0, time.monotonic()
    streams = [_random_stream(rng) for _ in range(3000)] + [_mutated(rng, real) for _ in range(3000)]
    for data in streams:
        t = time.monotonic()
        try:
            meta = metadata_from_bytes(data, tmp_path)
            assert isinstance(meta, Metadata)
            counts["valid"] += 1
        except NotDataError as err:
            assert len(str(err)) <= MAX_MESSAGE
            counts["refused"] += 1
        slowest = max(slowest, time.monotonic() - t)
    total = time.monotonic() - t0
    print(f"fuzz: {len(streams)} streams in {total:.2f} s ({counts}), slowest {slowest * 1000:.1f} ms")
    assert counts["refused"] + counts["valid"] == 6000 and counts["refused"] > 5000
    assert slowest < 2.0 and total < 60
    assert _class_snapshot() == before
