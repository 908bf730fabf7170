"""Shared test helpers: the repo root, ../shared/data, the shipped tiny model, CLI subprocesses,
torchrun launches, what a run wrote (metrics.jsonl, a checkpoint's tensors), a tiny random Qwen2
model, and the short training runs that several test files only read, built once per test run
(tests/shared_artefacts.py; safe under pytest-xdist)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pytest

from shared_artefacts import build_once, session_root

if TYPE_CHECKING:
    import torch
    from transformers import Qwen2ForCausalLM

    from exgrpo_cli.config.schema import ExgrpoConfig

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"
TINY = REPO / "exgrpo_cli" / "assets" / "tiny"

# a short CPU training run of the tiny model through the CLI: 4 questions x 4 responses a step,
# 8 validation questions answered once, one thread, no wandb
SMALL_RUN = [
    "algo.questions_per_step=4",
    "rollout.n=4",
    "trainer.val_questions=8",
    "trainer.val_samples=1",
    "logger.wandb.mode=disabled",
    "trainer.threads=1",
]


def toy_sweep(root: Path, variants: dict[str, list[str]]) -> Path:
    """A user's sweep `ablation=toy` (root/conf/ablation/toy.yaml): SMALL_RUN at 2 steps and 1 seed,
    replay from the first step, with `variants`. Returns the folder for hydra.searchpath."""
    conf = root / "conf"
    (conf / "ablation").mkdir(parents=True, exist_ok=True)
    base = [*SMALL_RUN, "trainer.steps=2", "replay.start_threshold=0"]
    lines = ["name: toy", "seeds: 1", f"base: [{', '.join(base)}]", "variants:"]
    lines += [f"  {name}: [{', '.join(overrides)}]" for name, overrides in variants.items()]
    (conf / "ablation" / "toy.yaml").write_text("\n".join(lines) + "\n")
    return conf


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip_gpu)
    if hasattr(config, "workerinput"):  # a pytest-xdist worker (each sorts the same collection alike)
        # the files that hold slow tests first, each file's own order kept: the long end-to-end
        # runs start at once and the quick tests fill the workers' last minutes, rather than one
        # long run starting when the other worker has nothing left to do
        slow_files = {item.path for item in items if "slow" in item.keywords}
        items.sort(key=lambda item: item.path not in slow_files)


FAKE_VLLM = REPO / "tests" / "rollout" / "fake_vllm"
# the env_extra of a CLI run whose `import vllm` finds the stand-in (rollout=vllm on a CPU)
FAKE_VLLM_ENV = {"PYTHONPATH": f"{FAKE_VLLM}:{REPO}"}


@pytest.fixture
def vllm(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The vLLM stand-in (tests/rollout/fake_vllm) as `vllm`, its event log empty; a real vllm, if
    imported, is put back afterwards. The launch and stand-in switches of the environment are unset."""
    from exgrpo_cli.rollout.vllm_launch import MP_ENV

    for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(FAKE_VLLM))
    for key in (MP_ENV, "RANK", "LOCAL_RANK", "WORLD_SIZE", "EXGRPO_STANDIN_STALE_SYNC"):
        monkeypatch.delenv(key, raising=False)
    import vllm as fake

    assert Path(fake.__file__).is_relative_to(FAKE_VLLM)
    fake.EVENTS.clear()
    yield fake
    for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        del sys.modules[name]


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/data is absent")
    return SHARED_DATA


@pytest.fixture
def tiny_model() -> Path:
    if not (TINY / "config.json").is_file():
        pytest.skip("the tiny model is not built (make tiny-model)")
    return TINY


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        WANDB_MODE="disabled",
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
    )
    return env


def run_captured(
    cmd: list[str], cwd: Path = REPO, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    """`cmd` run to its end in `cwd`, its output captured as text; `env`: cli_env() unless given."""
    env = cli_env() if env is None else env
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def run_cli(
    args: list[str], cwd: Path | None = None, timeout: float = 600, env_extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    return run_captured(
        [sys.executable, "-m", "exgrpo_cli", *args], cwd or REPO, cli_env() | (env_extra or {}), timeout
    )


def train_ok(
    out: Path, *overrides: str, env_extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`exgrpo train hydra.run.dir=out *overrides`, asserted to exit 0 (its output's tails if not)."""
    res = run_cli(["train", f"hydra.run.dir={out}", *overrides], env_extra=env_extra)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res


def metrics(out: Path) -> list[dict[str, Any]]:
    """The run dir `out`'s metrics.jsonl: one row per logged step, in order."""
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def compose_train(overrides: list[str]) -> ExgrpoConfig:
    """The typed config as `exgrpo train` builds it (the model preset named after its file)."""
    from hydra import compose, initialize_config_dir

    from exgrpo_cli.commands import to_typed, with_preset_name
    from exgrpo_cli.config.paths import config_dir
    from exgrpo_cli.config.schema import register_configs

    register_configs()
    with initialize_config_dir(config_dir=config_dir(), version_base=None):
        cfg = compose(
            config_name="config",
            overrides=overrides + ["trainer.output_dir=/tmp/x"],
            return_hydra_config=True,
        )
    choices = {k: str(v) for k, v in cfg.hydra.runtime.choices.items() if v is not None}
    del cfg.hydra
    return with_preset_name(to_typed(cfg), choices)


def torchrun(*args: str, nproc: int = 2) -> list[str]:
    """`python -m torch.distributed.run` with `nproc` ranks meeting on a free local port, then
    `args` (a script and its arguments, or `-m module ...`)."""
    from exgrpo_cli.parallel.fsdp import free_port

    launch = ["-m", "torch.distributed.run", "--nproc_per_node", str(nproc)]
    return [sys.executable, *launch, "--master_addr", "127.0.0.1", "--master_port", str(free_port()), *args]


def torchrun_ok(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """`args` (after torchrun's own) on two ranks, importing this checkout also from a `cwd` outside
    it; asserted to exit 0."""
    res = run_captured(torchrun(*args), cwd, cli_env() | {"PYTHONPATH": str(REPO)})
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-6000:]
    return res


def checkpoint_tensors(ck: Path, weights: str = "model/model.safetensors") -> dict[str, torch.Tensor]:
    """Every tensor that a resume from checkpoint `ck` restores: the weights (the file `weights`
    under `ck`), the optimizer's state (keys `opt.*`) and the replay buffer's (keys `replay.*`)."""
    from safetensors.torch import load_file

    from exgrpo_cli.checkpoint.optimizer_files import read_optimizer_tensors

    state = load_file(str(ck / weights))
    replay = load_file(str(ck / "replay" / "experiences.safetensors"))
    state.update({f"replay.{k}": v for k, v in replay.items()})
    state.update({f"opt.{k}": v for k, v in read_optimizer_tensors(ck / "optimizer").items()})
    return state


def same_tensors(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def sigkill_mid_run(out: Path, overrides: list[str]) -> None:
    """Start `exgrpo train hydra.run.dir=out *overrides` and SIGKILL it from outside once it has
    published its step_2 or step_3 checkpoint (asserting that it was still running then)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "exgrpo_cli", "train", f"hydra.run.dir={out}", *overrides],
        cwd=REPO,
        env=cli_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    latest = out / "checkpoints" / "latest"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if latest.is_file() and latest.read_text().strip() in ("step_2", "step_3"):
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def worker_env(*pythonpath: Path) -> dict[str, str]:
    """The environment of worker scripts under torchrun: one thread, offline, `pythonpath` first
    on PYTHONPATH."""
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([*map(str, pythonpath), env.get("PYTHONPATH", "")])
    return env


def tiny_qwen2(
    *, vocab: int, hidden: int, layers: int, heads: int, kv_heads: int, positions: int = 128, **config: Any
) -> Qwen2ForCausalLM:
    """A random float32 Qwen2ForCausalLM with tied embeddings and an intermediate size of twice
    `hidden`, its weights drawn after torch.manual_seed(0); `config`: more Qwen2Config fields."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=positions,
        tie_word_embeddings=True,
        **config,
    )
    torch.manual_seed(0)
    return Qwen2ForCausalLM(cfg).float()


# ---------------------------------------------------------------- short runs shared by test files

# The two runs that tests only read, each trained once per test run (every xdist worker reads the
# same folder). A test that changes a run works on its own copy (shared_artefacts.private_copy).
ONPOLICY_RUN = [*SMALL_RUN, "trainer.steps=2", "replay.ratio=0"]
# replay from step 1 (start_threshold=0) with 8 questions a step, so that the tiny model leaves
# some partly solved questions in the buffer at step 1 and replays them at steps 2 and 3
REPLAY_RUN = [
    *SMALL_RUN,
    "algo.questions_per_step=8",
    "trainer.steps=3",
    "replay.ratio=0.5",
    "replay.start_threshold=0",
]


@dataclass(frozen=True)
class SharedRun:
    dir: Path  # the run dir (hydra.run.dir): read it, never write into it
    console: str  # the command's stdout and stderr
    overrides: tuple[str, ...]


def shared_train_run(request: pytest.FixtureRequest, name: str, overrides: list[str]) -> SharedRun:
    if not (TINY / "config.json").is_file():
        pytest.skip("the tiny model is not built (make tiny-model)")
    root = session_root(request)

    def build(out: Path) -> None:
        res = run_cli(["train", f"hydra.run.dir={out}", *overrides], timeout=600)
        (root / f"{name}.console").write_text(res.stdout + res.stderr)
        said = res.stdout[-3000:] + res.stderr[-3000:]
        assert res.returncode == 0, f"exgrpo train {' '.join(overrides)}:\n{said}"

    out = build_once(root, name, build)
    return SharedRun(out, (root / f"{name}.console").read_text(), tuple(overrides))


@pytest.fixture(scope="session")
def onpolicy_run(request: pytest.FixtureRequest) -> SharedRun:
    """2 steps of on-policy Dr.GRPO (replay.ratio=0) at SMALL_RUN's sizes."""
    return shared_train_run(request, "onpolicy-run", ONPOLICY_RUN)


@pytest.fixture(scope="session")
def replay_run(request: pytest.FixtureRequest) -> SharedRun:
    """3 steps of ExGRPO replaying from step 2 (REPLAY_RUN)."""
    return shared_train_run(request, "replay-run", REPLAY_RUN)


# ---------------------------------------------------------------- a loopback mirror of benchmark files


@dataclass
class Mirror:
    """A bounded HTTP server on 127.0.0.1 serving `files` (name -> bytes) as /<name>. `mode`:
    ok | truncate (half the body, then the connection closes) | hang (headers, then no data until
    the server stops) | chunked-cut (a chunked reply cut inside its first chunk) | not-http (another
    service's greeting instead of an HTTP reply). `hits`: GET requests per name. It stops by itself
    after `lifetime_s`."""

    url: str
    files: dict[str, bytes]
    mode: str = "ok"
    hits: dict[str, int] = dataclasses.field(default_factory=dict)


@contextmanager
def loopback_mirror(files: dict[str, bytes], lifetime_s: float = 120.0) -> Iterator[Mirror]:
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    stop = threading.Event()
    mirror = Mirror("", dict(files))

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
            name = self.path.lstrip("/")
            mirror.hits[name] = mirror.hits.get(name, 0) + 1
            body = mirror.files.get(name)
            self.close_connection = True
            if mirror.mode == "not-http":  # eval.data_url on, say, an SSH port
                self.wfile.write(b"SSH-2.0-OpenSSH_9.6\r\n")
                return
            if body is None:
                self.send_error(404)
                return
            self.send_response(200)
            if mirror.mode == "chunked-cut":
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self.wfile.write(b"%x\r\n" % len(body) + body[: len(body) // 2])
                return
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if mirror.mode == "hang":
                stop.wait(lifetime_s)
                return
            self.wfile.write(body if mirror.mode == "ok" else body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True

        def log_message(self, *args: Any) -> None:  # quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    mirror.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    timer = threading.Timer(lifetime_s, server.shutdown)  # bounded: it ends even if a test hangs
    timer.daemon = True
    timer.start()
    try:
        yield mirror
    finally:
        stop.set()
        timer.cancel()
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="session")
def prompt_run(request: pytest.FixtureRequest) -> SharedRun:
    """REPLAY_RUN under replay.method=prompt: a prompts-only buffer, replayed from step 2."""
    return shared_train_run(request, "prompt-run", [*REPLAY_RUN, "replay.method=prompt"])


@dataclass
class RecordedUpdate:
    """One step's update as the trainer made it: its batch, the advantages, the plan, the result;
    the step's groups (with their questions) as the rollout built them, and the run's tokenizer."""

    batch: Any  # replay.mixing.MixedBatch
    advantages: torch.Tensor
    plan: Any  # step.update.UpdatePlan
    result: Any  # step.update.UpdateResult
    groups: list[Any]  # replay.mixing.Group
    tokenizer: Any


def train_in_process(
    overrides: list[str], steps: int = 3
) -> tuple[list[dict[str, float]], list[RecordedUpdate]]:
    """`steps` train steps of the config `exgrpo train overrides...` builds, in this process, on the
    real path (build_trainer, Trainer.train_step), recording what reaches each update: the step's
    metrics and its RecordedUpdate. Nothing is written (no run dir, no checkpoint)."""
    import torch

    from exgrpo_cli.run.setup import build_trainer

    cfg = compose_train(overrides)
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.trainer.threads)  # as `exgrpo train` does (run/training.py)
    trainer, _, _ = build_trainer(cfg, torch.device("cpu"))
    seen: list[RecordedUpdate] = []
    groups: list[Any] = []
    real_update, real_rollout = trainer.update, trainer.rollout

    def rollout(*args: Any) -> Any:
        groups[:] = real_rollout(*args)
        return groups[:]

    def update(batch: Any, advantages: torch.Tensor, plan: Any, old: Any) -> Any:
        result = real_update(batch, advantages, plan, old)
        seen.append(RecordedUpdate(batch, advantages, plan, result, groups[:], trainer.tokenizer))
        return result

    trainer.rollout, trainer.update = rollout, update  # type: ignore[method-assign]
    try:
        rows = [trainer.train_step(step) for step in range(1, steps + 1)]
    finally:
        trainer.scorer.close()
        trainer.engine.close()
        torch.set_num_threads(threads)
    return rows, seen
