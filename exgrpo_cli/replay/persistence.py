"""The replay buffer on disk: `<checkpoint>/replay/` holds `experiences.safetensors` (token ids,
behaviour log-probs, per-experience meta) and `index.json` (questions, buckets, retired set).

Place in the train step: none; the trainer writes it with every checkpoint and reads it on resume,
`exgrpo inspect-buffer` only reads it. No pickle, so a buffer from elsewhere is data, never code.
"""

from __future__ import annotations

import json
import os
import stat
from typing import Any

import numpy as np

FORMAT_VERSION = 1
# the columns of a question's int64 meta array, one row per experience (the format's layout)
META_LEN, META_STEP, META_HASH, META_SEQ = range(4)

ARRAYS_FILE = "experiences.safetensors"
INDEX_FILE = "index.json"
MAX_INDEX_BYTES = 64 * 2**20
MAX_GROUP_SIZE = 4096  # rollout.n of any recipe is far below; bucket schemes are built from it


def save_buffer(state: dict[str, Any], directory: str) -> None:
    """Write an ``ExperienceBuffer.state_dict()``. The index goes last (and an old one is removed
    first), so an interrupted save leaves no loadable half."""
    from safetensors.numpy import save_file

    os.makedirs(directory, exist_ok=True)
    arrays_path, index_path = os.path.join(directory, ARRAYS_FILE), os.path.join(directory, INDEX_FILE)
    if os.path.exists(index_path):
        os.remove(index_path)
    save_file(state["arrays"], arrays_path + ".tmp")
    os.replace(arrays_path + ".tmp", arrays_path)
    with open(index_path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(state["index"], f)
    os.replace(index_path + ".tmp", index_path)


def load_buffer(directory: str) -> dict[str, Any]:
    """The state written by ``save_buffer``, for ``ExperienceBuffer.load_state_dict``."""
    from safetensors.numpy import load_file

    index = _read_index(os.path.join(directory, INDEX_FILE))
    size = index.get("group_size") if isinstance(index, dict) else None
    if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= MAX_GROUP_SIZE:
        raise ValueError(f"the buffer's group size is {str(size)[:20]}, not an int in [1, {MAX_GROUP_SIZE}]")
    return {"arrays": load_file(os.path.join(directory, ARRAYS_FILE)), "index": index}


def _read_index(path: str) -> Any:
    """index.json, read only as a regular file (no link, FIFO or device) of at most MAX_INDEX_BYTES
    (replay imports nothing above it, so this is not checkpoint/safe_read.py)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_INDEX_BYTES:
            raise ValueError(f"{path} is not a regular file of at most {MAX_INDEX_BYTES} bytes")
        return json.loads(fh.read(MAX_INDEX_BYTES + 1))


def checked_arrays(
    state: dict[str, Any], group_size: int, edges: list[float]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(token ids, log-probs, meta, experiences per question) of a saved buffer state, after
    checking that it fits a buffer of `group_size` and bucket `edges` and that its arrays and index
    agree (ValueError naming what does not)."""
    from exgrpo_cli.replay.buckets import default_bucket_edges

    arrays, index = state["arrays"], state["index"]
    if index.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"unsupported buffer format {index.get('format_version')!r}")
    if index["group_size"] != group_size:
        raise ValueError(
            f"buffer was saved with group size {index['group_size']}, this run uses {group_size}"
        )
    saved_edges = index["bucket_edges"]
    if saved_edges is None:
        saved_edges = default_bucket_edges(group_size)
    if [float(e) for e in saved_edges] != edges:
        raise ValueError(f"replay.bucket_edges differ from the saved buffer's ({saved_edges})")
    ids = np.asarray(arrays["response_ids"], dtype=np.int32)
    logp = np.asarray(arrays["behavior_logp"], dtype=np.float32)
    meta = np.asarray(arrays["meta"], dtype=np.int64).reshape(-1, 4)
    counts = np.asarray(arrays["experience_counts"], dtype=np.int64)
    if not (
        len(index["questions"]) == len(index["question_buckets"]) == len(counts)
        and (counts >= 0).all()  # 0: a question kept with no response (a prompts-only method)
        and int(counts.sum()) == len(meta)
        and int(meta[:, META_LEN].sum()) == len(ids) == len(logp)
    ):
        raise ValueError("inconsistent buffer state: array sizes do not match the index")
    return ids, logp, meta, counts
