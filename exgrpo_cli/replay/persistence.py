"""The replay buffer on disk: `<checkpoint>/replay/` holds `experiences.safetensors` (token ids,
behaviour log-probs, per-experience meta) and `index.json` (questions, buckets, retired set).

Place in the train step: none; the trainer writes it with every checkpoint and reads it on resume,
`exgrpo inspect-buffer` only reads it. No pickle, so a buffer from elsewhere is data, never code.
"""

from __future__ import annotations

import json
import os

ARRAYS_FILE = "experiences.safetensors"
INDEX_FILE = "index.json"


def save_buffer(state: dict, directory: str) -> None:
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


def load_buffer(directory: str) -> dict:
    """The state written by ``save_buffer``, for ``ExperienceBuffer.load_state_dict``."""
    from safetensors.numpy import load_file

    with open(os.path.join(directory, INDEX_FILE), encoding="utf-8") as f:
        index = json.load(f)
    return {"arrays": load_file(os.path.join(directory, ARRAYS_FILE)), "index": index}
