"""MetricLogger: one call per step fans the metrics out to every sink.

- `<output_dir>/metrics.jsonl`: one JSON object per line, `step` plus the namespaced metrics;
- the console: a rich progress bar with a live line of the key metrics (a plain line per step
  when the output is not a terminal, e.g. CI logs);
- W&B: `logger.wandb.mode` online | offline | disabled, or auto = online when logged in, else
  offline with one line saying how to sync. The run id is kept so a resumed run continues it.

The tracker never stops training. Before an online run starts, the W&B server is probed (at most
`PROBE_TIMEOUT_S`): unreachable, `auto` logs offline with one line saying why and how to sync
later, `online` refuses with a UsageError (exit 2) before anything is loaded. `wandb.init` itself
is bounded by `INIT_TIMEOUT_S`, and the final upload by `FINISH_TIMEOUT_S` (W&B keeps what it could
not send on disk for `wandb sync`); logging is asynchronous, so a connection lost mid-run costs
nothing but the upload. WANDB_INIT_TIMEOUT / WANDB_FINISH_TIMEOUT override the two bounds.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast
from urllib.parse import urlsplit

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from exgrpo_cli.checkpoint.safe_read import special_entry
from exgrpo_cli.config.schema import LoggerConfig
from exgrpo_cli.errors import ExgrpoError, UsageError
from exgrpo_cli.metrics.tracker_env import check_tracker_env

if TYPE_CHECKING:  # wandb is imported only when a run logs to it
    from wandb import Run

log = logging.getLogger(__name__)

CONSOLE_KEYS = (  # (metric, short label, format)
    ("reward/accuracy", "acc", "{:.3f}"),
    ("val/accuracy", "val", "{:.3f}"),
    ("loss/total", "loss", "{:+.4f}"),
    ("replay/active", "replay", "{:.0f}"),
    ("replay/buffer_questions", "buf", "{:.0f}"),
    ("rollout/response_length", "len", "{:.1f}"),
    ("timing/step", "s/step", "{:.2f}"),
)

PROBE_TIMEOUT_S = 5.0  # the reachability check of the W&B server, DNS included
INIT_TIMEOUT_S = 20.0  # wandb.init once the server answered (W&B's default: 90 s)
FINISH_TIMEOUT_S = 30.0  # the final upload (W&B's default: no bound; what is left stays on disk)
DEFAULT_BASE_URL = "https://api.wandb.ai"  # when wandb's settings cannot be read


def wandb_base_url() -> str:
    """The W&B server wandb would talk to: WANDB_BASE_URL, the settings files, or its default."""
    if os.environ.get("WANDB_BASE_URL"):
        return os.environ["WANDB_BASE_URL"].rstrip("/")
    try:
        from wandb.sdk import wandb_setup

        return str(wandb_setup.singleton().settings.base_url).rstrip("/")
    except Exception as err:  # an unreadable settings file, or a wandb without this module
        log.warning("cannot read wandb's base_url (%s); assuming %s", err, DEFAULT_BASE_URL)
        return DEFAULT_BASE_URL


def wandb_mode(requested: str) -> str:
    if requested != "auto":
        return requested
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    netrc = Path(os.environ.get("NETRC") or Path.home() / ".netrc").expanduser()
    if netrc.is_file():
        text = netrc.read_text(errors="ignore")
        hosts = {"api.wandb.ai", urlsplit(wandb_base_url()).netloc}  # `wandb login` writes the latter
        if any(h and h in text for h in hosts):
            return "online"
    return "offline"


def probe_server(url: str, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """Why the server at `url` cannot be reached, or None when it answers: any HTTP status, or a
    TLS handshake failure (that is for wandb to judge, with its own certificates), counts as an
    answer. The whole check, name lookup included, takes at most `timeout` seconds; proxies are
    taken from the environment (http_proxy, https_proxy, no_proxy) as wandb-core takes them: never
    for a loopback address."""
    result: list[str | None] = []
    loopback = urlsplit(url).hostname in ("localhost", "127.0.0.1", "::1")
    opener = urllib.request.build_opener(*([urllib.request.ProxyHandler({})] if loopback else []))

    def check() -> None:
        try:
            opener.open(url, timeout=timeout).close()
            result.append(None)
        except urllib.error.HTTPError:
            result.append(None)
        except urllib.error.URLError as err:
            result.append(_unreachable(err.reason, timeout))
        except Exception as err:  # a reset, a timeout reading the answer, a garbled answer
            result.append(_unreachable(err, timeout))

    t = threading.Thread(target=check, name="wandb-probe", daemon=True)
    t.start()
    t.join(timeout)
    return result[0] if result else f"no answer within {timeout:g} s"


def _unreachable(reason: object, timeout: float) -> str | None:
    import ssl

    if isinstance(reason, ssl.SSLError | ssl.CertificateError):
        return None
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, socket.gaierror):
        return f"host not found ({reason.strerror})"
    if isinstance(reason, TimeoutError):
        return f"no answer within {timeout:g} s"
    return str(reason) or type(reason).__name__


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else "no message"


def _no_wandb_analytics() -> None:
    """wandb's own usage analytics post to the server at exit, waiting up to 10 s for a server
    that accepts connections but does not answer: turn them off once the server is known to be
    unreachable (wandb.analytics.opentelemetry.opentelemetry_proxy.disable, wandb 0.31)."""
    try:
        from wandb.analytics.opentelemetry.opentelemetry_proxy import disable
    except ImportError as err:
        log.info("cannot turn off wandb's analytics (%s): exit may wait for the server", err)
        return
    disable()


def _plain(v: Any) -> Any:
    """numpy and torch scalars (and arrays) as Python numbers (and lists)."""
    return v.tolist() if hasattr(v, "tolist") else v  # np.generic, np.ndarray, torch.Tensor


def _jsonable(v: Any) -> Any:
    """A plain metric value as JSON: non-finite floats as null / "inf" / "-inf"."""
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, list | tuple):
        return [_jsonable(x) for x in v]
    return v


def resume_point(checkpoint: str | Path | None) -> tuple[int, str | None]:
    """(step, W&B run id) of the checkpoint a run resumes from, read from its trainer_state.json
    without loading anything else; (0, None) for a fresh start. What `MetricLogger` needs, so that
    the tracker can start before the model loads."""
    if checkpoint is None:
        return 0, None
    from exgrpo_cli.checkpoint.safe_read import read_json

    state = read_json(Path(checkpoint) / "trainer_state.json")  # a regular file, size-capped
    run_id = state.get("wandb_id")
    return int(state["step"]), (str(run_id)[:128] if run_id else None)


METRICS_FILE = "metrics.jsonl"  # a training run's rows; `exgrpo eval` appends to EVAL_METRICS_FILE
EVAL_METRICS_FILE = "eval_metrics.jsonl"


class MetricsWriteError(ExgrpoError):
    """metrics.jsonl could not be written (disk full, quota): the run stops, its checkpoints intact."""


class MetricLogger:
    """Raises UsageError (before metrics.jsonl is touched) when `logger.wandb.mode=online` and the
    W&B server cannot be reached or refuses the run; never blocks for long (see the module doc)."""

    def __init__(
        self,
        output_dir: str,
        cfg: LoggerConfig,
        run_config: dict[str, Any],
        total_steps: int,
        start_step: int = 0,
        wandb_id: str | None = None,
        job_type: str = "train",
        rows_file: str = METRICS_FILE,
    ) -> None:
        self.console = Console(stderr=True)
        self.cfg = cfg
        self.total_steps = total_steps
        self.wandb_run: Run | None = None
        self.wandb_id = wandb_id
        self.wandb_dir = ""  # the W&B run's local folder (what `wandb sync` takes)
        self.wandb_online = False
        self.wandb_fallback = ""  # why an auto run logs offline although logged in ("" if it does not)
        if cfg.wandb.mode != "disabled":  # an empty WANDB_MODE is unset; a bad one refused in one line
            check_tracker_env()
        mode = wandb_mode(cfg.wandb.mode)
        if mode != "disabled":  # first: an online run that cannot start refuses before any file changes
            self._start_wandb(mode, output_dir, run_config, job_type)
        self.path = Path(output_dir) / rows_file
        special = special_entry(self.path)  # a FIFO there blocked the start in open() for ever
        if special:
            raise UsageError(special)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if rows_file == METRICS_FILE:  # a training run's rows; other files (eval's) only grow
            self._drop_rows_after(start_step)
        self._fh = self.path.open("a", encoding="utf-8")
        self.live = cfg.console and self.console.is_terminal
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._t0 = time.time()
        if cfg.console and self.live:
            self._progress = Progress(
                TextColumn("[bold]exgrpo[/]"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("eta"),
                TimeRemainingColumn(),
                TextColumn("{task.fields[line]}", markup=False),
                console=self.console,
                transient=False,
            )
            self._progress.start()
            self._task = self._progress.add_task("train", total=total_steps, completed=start_step, line="")

    def _start_wandb(self, mode: str, output_dir: str, run_config: dict[str, Any], job_type: str) -> None:
        why_offline = "not logged in"
        if mode == "online":
            url = wandb_base_url()
            why = probe_server(url, PROBE_TIMEOUT_S)
            if why is None:
                try:
                    self._init_wandb("online", output_dir, run_config, job_type)
                    self.wandb_online = True
                    return
                except Exception as err:  # wandb raises CommError, AuthenticationError, UsageError ...
                    problem = f"refused the run ({type(err).__name__}: {_first_line(err)})"
            else:
                problem = f"is unreachable ({why})"
            _no_wandb_analytics()
            if self.cfg.wandb.mode == "online":
                raise UsageError(
                    f"logger.wandb.mode=online: the W&B server {url} {problem}. Check the network or "
                    "WANDB_BASE_URL, or run with logger.wandb.mode=auto (logs offline when the server "
                    "cannot be used), offline (sync later) or disabled"
                )
            why_offline = self.wandb_fallback = f"the server {url} {problem}"
            mode = "offline"
        self._init_wandb(mode, output_dir, run_config, job_type)
        if mode == "offline":
            self.print(
                f"W&B is offline ({why_offline}): sync later with `wandb sync {self.wandb_dir}`, "
                "or set logger.wandb.mode=disabled"
            )

    def _init_wandb(self, mode: str, output_dir: str, run_config: dict[str, Any], job_type: str) -> None:
        import wandb

        w = self.cfg.wandb
        settings = wandb.Settings()  # the user's WANDB_INIT_TIMEOUT / WANDB_FINISH_TIMEOUT win
        if not os.environ.get("WANDB_INIT_TIMEOUT"):
            settings.init_timeout = INIT_TIMEOUT_S
        if not os.environ.get("WANDB_FINISH_TIMEOUT"):
            settings.finish_timeout = FINISH_TIMEOUT_S
        if mode == "offline" and not os.environ.get("WANDB_SILENT"):
            # wandb's banners and its end-of-run history (~35 lines) say nothing the run's own lines
            # and the one "W&B is offline ... wandb sync <dir>" line do not; WANDB_SILENT=false keeps them
            settings.silent = True
        elif not os.environ.get("WANDB_QUIET"):
            settings.quiet = True  # online: the run's URL, not its history
        # the config's modes, or WANDB_MODE as it is: wandb.init checks the value itself
        init_mode = cast(Literal["online", "offline", "disabled", "shared"], mode)
        run = self.wandb_run = wandb.init(
            project=w.project,
            entity=w.entity or None,
            name=w.name or None,
            group=w.group or None,
            tags=list(w.tags) or None,
            config=run_config,
            dir=output_dir,
            mode=init_mode,
            job_type=job_type,
            id=self.wandb_id,
            resume="allow" if self.wandb_id else None,
            settings=settings,
        )
        self.wandb_id = run.id
        self.wandb_dir = str(Path(run.dir).parent)  # run.dir is <run folder>/files

    def _drop_rows_after(self, step: int) -> None:
        """A run killed after its last checkpoint logged steps that the resumed run repeats:
        keep only the rows up to the checkpoint's step (none for a fresh start)."""
        if not self.path.is_file():
            return
        keep: list[str] = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                if step > 0 and int(json.loads(line).get("step", -1)) <= step:
                    keep.append(line)
            except (json.JSONDecodeError, ValueError, AttributeError):
                continue  # a line torn by a kill mid-write
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(x + "\n" for x in keep), encoding="utf-8")
        tmp.replace(self.path)

    def print(self, msg: str) -> None:
        """One line as it is: no markup, and folded by the terminal only, so that paths and
        commands in it stay copyable."""
        if self.cfg.console:
            self.console.print(msg, soft_wrap=True, markup=False, highlight=False)
        log.info(msg)

    def log(self, step: int, metrics: dict[str, Any], status: str = "") -> None:
        """One row of metrics.jsonl, W&B's numbers, and the console line: the CONSOLE_KEYS then
        `status` (a short note such as "replay waits: acc 0.12 < 0.35")."""
        values = {k: _plain(v) for k, v in metrics.items()}
        row = json.dumps({"step": step, **{k: _jsonable(v) for k, v in values.items()}}) + "\n"
        try:
            self._fh.write(row)
            self._fh.flush()
        except OSError as err:  # a full disk, a quota: one line, as the checkpoint writer says it
            raise MetricsWriteError(
                f"writing {self.path} failed at step {step} ({err.strerror or err}); the checkpoints "
                f"in {self.path.parent / 'checkpoints'} are intact: free space, then rerun the same "
                "command to resume from the last one"
            ) from None
        if self.wandb_run is not None:  # numbers only, NaN and inf included
            self.wandb_run.log({k: v for k, v in values.items() if isinstance(v, int | float)}, step=step)
        parts = [
            lbl + " " + fmt.format(values[k])
            for k, lbl, fmt in CONSOLE_KEYS
            if isinstance(values.get(k), int | float) and math.isfinite(values[k])
        ]
        line = "  ".join([*parts, status] if status else parts)
        if self._progress is not None and self._task is not None:  # set together in __init__
            self._progress.update(self._task, completed=step, line=line)
        elif self.cfg.console:
            self.console.print(
                f"step {step}/{self.total_steps}  {line}", highlight=False, markup=False, soft_wrap=True
            )

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        if self.wandb_run is not None:
            run, where = self.wandb_run, self.wandb_dir
            self.wandb_run = None
            t = time.monotonic()
            try:
                run.finish()  # bounded by finish_timeout
            except Exception as err:  # the metrics are in metrics.jsonl; the run must still end
                self.print(f"W&B could not finish the run ({err}): sync its data with `wandb sync {where}`")
            else:
                if self.wandb_online and time.monotonic() - t >= FINISH_TIMEOUT_S:
                    self.print(f"W&B did not upload everything in time: `wandb sync {where}` sends the rest")
        if not self._fh.closed:
            try:
                self._fh.close()
            except OSError as err:  # the rows a full disk refused (said by `log` already)
                log.warning("closing %s: %s", self.path, err)
