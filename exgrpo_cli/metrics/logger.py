"""MetricLogger: one call per step fans the metrics out to every sink.

- `<output_dir>/metrics.jsonl`: one JSON object per line, `step` plus the namespaced metrics;
- the console: a rich progress bar with a live line of the key metrics (a plain line per step
  when the output is not a terminal, e.g. CI logs);
- W&B: `logger.wandb.mode` online | offline | disabled, or auto = online when logged in, else
  offline with one line saying how to sync. The run id is kept so a resumed run continues it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

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

from exgrpo_cli.config import LoggerConfig

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


def wandb_mode(requested: str) -> str:
    if requested != "auto":
        return requested
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    netrc = Path.home() / ".netrc"
    if netrc.is_file() and "api.wandb.ai" in netrc.read_text(errors="ignore"):
        return "online"
    return "offline"


def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v


class MetricLogger:
    def __init__(
        self,
        output_dir: str,
        cfg: LoggerConfig,
        run_config: dict[str, Any],
        total_steps: int,
        start_step: int = 0,
        wandb_id: str | None = None,
        job_type: str = "train",
    ) -> None:
        self.path = Path(output_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._drop_rows_after(start_step)
        self._fh = self.path.open("a", encoding="utf-8")
        self.console = Console(stderr=True)
        self.cfg = cfg
        self.live = cfg.console and self.console.is_terminal
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self.total_steps = total_steps
        self._t0 = time.time()
        if cfg.console and self.live:
            self._progress = Progress(
                TextColumn("[bold]exgrpo[/]"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("eta"),
                TimeRemainingColumn(),
                TextColumn("{task.fields[line]}"),
                console=self.console,
                transient=False,
            )
            self._progress.start()
            self._task = self._progress.add_task("train", total=total_steps, completed=start_step, line="")
        self.wandb_run: Run | None = None
        self.wandb_id = wandb_id
        mode = wandb_mode(cfg.wandb.mode)
        if mode != "disabled":
            self._start_wandb(mode, output_dir, run_config, job_type)

    def _start_wandb(self, mode: str, output_dir: str, run_config: dict[str, Any], job_type: str) -> None:
        import wandb

        w = self.cfg.wandb
        # the config's modes, or WANDB_MODE as it is: wandb.init checks the value itself
        init_mode = cast(Literal["online", "offline", "disabled", "shared"], mode)
        self.wandb_run = wandb.init(
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
        )
        self.wandb_id = self.wandb_run.id
        if mode == "offline":
            self.print(
                f"W&B is offline (not logged in): sync later with `wandb sync {output_dir}/wandb/"
                f"offline-run-*`, or set logger.wandb.mode=disabled"
            )

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
        if self.cfg.console:
            self.console.print(msg)
        log.info(msg)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        record = {"step": step, **{k: _jsonable(v) for k, v in metrics.items()}}
        self._fh.write(json.dumps(record) + "\n")
        self._fh.flush()
        if self.wandb_run is not None:
            self.wandb_run.log({k: v for k, v in metrics.items() if isinstance(v, (int, float))}, step=step)
        line = "  ".join(
            lbl + " " + fmt.format(metrics[k])
            for k, lbl, fmt in CONSOLE_KEYS
            if isinstance(metrics.get(k), (int, float)) and math.isfinite(metrics[k])
        )
        if self._progress is not None and self._task is not None:  # set together in __init__
            self._progress.update(self._task, completed=step, line=line)
        elif self.cfg.console:
            self.console.print(f"step {step}/{self.total_steps}  {line}", highlight=False, soft_wrap=True)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        if self.wandb_run is not None:
            self.wandb_run.finish()
            self.wandb_run = None
        self._fh.close()
