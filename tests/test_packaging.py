"""The wheel a user gets from `pip install .` holds every subpackage, the configs and the tiny model."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from conftest import REPO, cli_env, run_captured


def test_explicit_package_list_matches_the_folders():
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    subpackages = (REPO / "exgrpo_cli").glob("*/__init__.py")
    found = {"exgrpo_cli"} | {f"exgrpo_cli.{p.parent.name}" for p in subpackages}
    # the data folders are declared too, or setuptools warns "Package ... is absent" for each
    groups = {f"exgrpo_cli.conf.{d.name}" for d in (REPO / "conf").iterdir() if any(d.glob("*.yaml"))}
    assets = {f"exgrpo_cli.assets.{d.name}" for d in (REPO / "exgrpo_cli/assets").iterdir() if d.is_dir()}
    assert listed == found | {"exgrpo_cli.conf"} | groups | assets


def test_pyproject_gives_setuptools_nothing_to_warn_about():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert project["project"]["license"] == "Apache-2.0"  # an SPDX string, not the deprecated table
    assert "setuptools>=77" in project["build-system"]["requires"]  # the first to read that string


@pytest.mark.slow  # builds and installs a wheel
def test_non_editable_install_finds_its_configs(tmp_path: Path):
    wheels = tmp_path / "wheels"
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(REPO),
            "--no-deps",
            "--no-build-isolation",
            "-v",  # the backend's own output: setuptools' warnings about pyproject.toml show here
            "-w",
            str(wheels),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "BuildBackendWarning" not in built.stdout + built.stderr
    wheel = next(wheels.glob("exgrpo-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "exgrpo_cli/conf/config.yaml" in names and "exgrpo_cli/conf/model/tiny.yaml" in names
    if (REPO / "exgrpo_cli/assets/tiny/config.json").is_file():
        assert "exgrpo_cli/assets/tiny/model.safetensors" in names
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    env = cli_env() | {"PYTHONPATH": str(site)}
    probe = "import exgrpo_cli.config.paths as c; print(c.__file__); print(c.config_dir())"
    res = run_captured([sys.executable, "-c", probe], tmp_path, env, timeout=60)
    where, conf = res.stdout.split()
    assert where.startswith(str(site)) and conf == str(site / "exgrpo_cli" / "conf")
    cfg_job = [sys.executable, "-m", "exgrpo_cli", "train", "model=qwen2.5-math-7b", "--cfg", "job"]
    res = run_captured(cfg_job, tmp_path, env, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "Elliott/Qwen2.5-Math-7B-16k-think" in res.stdout
