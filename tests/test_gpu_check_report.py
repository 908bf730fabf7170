"""scripts/gpu_check.py's report and its parts that need no GPU (issue #45 points 2, 6, 7, 8, 9):
the JSON is written after every section, so a check cut at its time limit leaves what it measured
and `--render` still prints a table and a verdict; the host size a GPU run is sized for (--host-gib
honoured, MemTotal and MemAvailable recorded); only the wheels of missing modules are unpacked; the
pinned-memory probe against a stand-in torch whose caching host allocator rounds as torch's does."""

from __future__ import annotations

import argparse
import json
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from conftest import REPO, cli_env, run_captured

GiB = 2**30


@pytest.fixture
def scripts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO / "scripts"))


def _args(tmp_path: Path, **kw: Any) -> argparse.Namespace:
    base = dict(dry_run=True, budget_s=None, limit=None, out=tmp_path / "r.json", only=None, offload="auto")
    return argparse.Namespace(**{**base, **kw})


def test_the_report_is_written_after_every_section(
    scripts: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The second section is cut (the lease ends: the process is killed mid-way): the first's
    result is on disk, the second's numbers so far in its partial file, and --render names both."""
    import gpu_check
    from gpu_check_report import render_file

    def run_section(name: str, args: argparse.Namespace, limit: float, out: Path) -> dict[str, Any]:
        if name == "update":
            return {"status": "ok", "checks": {"a": True}}
        out.with_name(f"{out.stem}.{name}.partial.json").write_text(json.dumps({"stage": "probe", "x": 1}))
        raise KeyboardInterrupt  # the kill, as far as this process goes

    monkeypatch.setattr(gpu_check, "run_section", run_section)
    out = tmp_path / "r.json"
    with pytest.raises(KeyboardInterrupt):
        gpu_check.orchestrate(_args(tmp_path))
    report = json.loads(out.read_text())
    assert list(report["sections"]) == ["update"] and report["complete"] is False and not report["ok"]
    assert render_file(out) == 1
    shown = capsys.readouterr().out
    assert "the check was cut short; never started: generate, pytest, vllm" in shown
    assert "| pinned | cut off |" in shown and "INCOMPLETE: the check did not finish" in shown
    assert "(proven: update)" in shown


def test_a_gpu_run_is_sized_for_host_gib_and_records_the_hosts_memory(scripts: None) -> None:
    from gpu_check_sections import host_size

    from exgrpo_cli.host import MEMINFO, proc_bytes

    def ctx(dry: bool, host_gib: float | None) -> Any:
        got: dict[str, Any] = {}
        return SimpleNamespace(
            dry=dry, args=SimpleNamespace(host_gib=host_gib), record=got.update, result=got
        )

    given = ctx(False, 128.0)
    assert host_size(given) == 128 * GiB and given.result["host_source"] == "--host-gib"
    assert given.result["host_mem_total_bytes"] == proc_bytes(MEMINFO, "MemTotal") > 0
    assert given.result["host_mem_available_bytes"] > 0
    measured = ctx(False, None)
    assert host_size(measured) > 0 and measured.result["host_source"] == "MemAvailable"
    assert host_size(ctx(True, None)) == 128 * GiB


def _wheel(folder: Path, name: str, package: str) -> Path:
    path = folder / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{package}/__init__.py", "")
        z.writestr(f"{name}-1.0.dist-info/METADATA", "Name: x\n")
    return path


def test_only_the_wheels_of_missing_modules_are_unpacked(
    scripts: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """peft and accelerate come with some GPU images: unpacked first on PYTHONPATH they would
    shadow the image's own, and the check needs neither."""
    import gpu_check

    for name, package in (("hydra_core", "hydra"), ("peft", "peft"), ("accelerate", "accelerate")):
        _wheel(tmp_path, name, package)
    assert gpu_check.wheel_modules(tmp_path / "peft-1.0-py3-none-any.whl") == {"peft"}
    monkeypatch.setattr(gpu_check, "missing_modules", lambda: ["hydra"])
    monkeypatch.delenv("EXGRPO_GPU_CHECK_SITE", raising=False)
    seen: dict[str, str] = {}
    monkeypatch.setattr(gpu_check.subprocess, "call", lambda cmd, env: seen.update(env) or 0)
    assert gpu_check.with_wheels(argparse.Namespace(wheels=tmp_path)) == 0
    site = Path(seen["EXGRPO_GPU_CHECK_SITE"])
    assert sorted(p.name for p in site.iterdir() if not p.name.endswith(".dist-info")) == ["hydra"]
    monkeypatch.setattr(gpu_check, "missing_modules", lambda: [])
    assert gpu_check.with_wheels(argparse.Namespace(wheels=tmp_path)) is None


# torch's caching host allocator as torch 2.13 documents it (docs/notes/cuda.rst, CUDA allocator
# options): every pinned block rounded up to a power of two, except, with pinned_max_cached_size_mb
# set, a block above that size, taken at its exact size; the option string is parsed once at start
# and an unknown key refused
FAKE_TORCH = """
import os

uint8 = "uint8"
_held = 0
_limit = None
for item in filter(None, os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "").split(",")):
    key, _, value = item.partition(":")
    if key != "pinned_max_cached_size_mb":
        raise RuntimeError("Unrecognized key '" + key + "' in CUDA allocator config.")
    _limit = int(value) << 20


class _Block:
    def __init__(self, n):
        global _held
        self.size = n if _limit is not None and n > _limit else 1 << (n - 1).bit_length()
        _held += self.size


def empty(n, dtype=None, pin_memory=False):
    assert pin_memory and dtype == uint8
    return _Block(n)


class cuda:
    @staticmethod
    def host_memory_stats():
        return {"allocated_bytes.current": _held, "allocations.current": 1}
"""


def test_the_pinned_probe_reads_the_allocators_rounding(
    scripts: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gpu_check_pinned as pinned

    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(FAKE_TORCH)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    runs = {"default": pinned.probe(None), pinned.OPTION: pinned.probe(pinned.OPTION)}
    assert all("error" not in r for r in runs.values()), runs
    found = pinned.evaluate(runs)
    gate_up = pinned.SIZES["gate_up_proj (bf16)"]  # 259 MiB: a 512 MiB block by default
    assert found["block_bytes"]["default"]["gate_up_proj (bf16)"] == 512 << 20
    assert found["block_bytes"][pinned.OPTION]["gate_up_proj (bf16)"] == gate_up
    assert found["rounded"] == {"default": True, pinned.OPTION: False}
    assert found["option_gives_exact_blocks"] is True
    bad = pinned.probe("pinned_max_cached_size:256")  # an option this torch does not know
    assert "Unrecognized key" in bad["error"][0]


@pytest.mark.slow
def test_the_lent_machine_script_writes_its_report_and_a_verdict(tmp_path: Path) -> None:
    """scripts/gpu_check_lent.sh at toy sizes on this CPU (--dry-run): the report, the log and the
    verdict table in the folder it is given."""
    env = {"PYTHON": sys.executable, "EXGRPO_GPU_CHECK_LIMIT_S": "200"}
    cmd = [
        "bash",
        str(REPO / "scripts" / "gpu_check_lent.sh"),
        str(tmp_path),
        "--dry-run",
        "--only",
        "pinned",
    ]
    res = run_captured(cmd, REPO, cli_env() | env, timeout=240)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert json.loads((tmp_path / "gpu_check.json").read_text())["complete"]
    assert "| pinned | not proven |" in (tmp_path / "verdict.txt").read_text()
    assert "# gpu_check (dry-run)" in (tmp_path / "gpu_check.log").read_text()
