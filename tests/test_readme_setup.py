"""README's set-up as a newcomer follows it: `make run` ends by printing the next commands, which are
the ones README shows, and they work: the venv's activate script puts `exgrpo` on the PATH."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from conftest import REPO, cli_env, run_captured

NEXT = ["source .venv/bin/activate", "exgrpo train replay.ratio=0"]


def _run_recipe_echoes() -> list[str]:
    makefile = (REPO / "Makefile").read_text()
    recipe = makefile[makefile.index("\nrun: ") :].split("\n\n", 1)[0]
    return [m.strip() for m in re.findall(r'@echo "(.*)"', recipe)]


def test_make_run_ends_with_the_next_commands_readme_shows():
    echoed = _run_recipe_echoes()
    assert echoed[-2:] == NEXT
    readme = (REPO / "README.md").read_text()
    setup = readme[readme.index("## Set-up") : readme.index("## The four commands")]
    shown = [re.sub(r"\s+#.*$", "", line).strip() for line in setup.splitlines()]
    assert all(cmd in shown for cmd in NEXT)
    assert "Python 3.11" in setup and "TORCH_INDEX=https://download.pytorch.org/whl/cpu" in setup


def test_python_version_stated_matches_pyproject():
    import tomllib

    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    assert requires == ">=3.11" and "Python 3.11 or newer" in (REPO / "README.md").read_text()


@pytest.mark.skipif(
    not (Path(sys.prefix) / "bin" / "exgrpo").is_file(), reason="exgrpo is not installed here"
)
def test_the_activated_venv_has_exgrpo_on_the_path(tmp_path: Path):
    """What README's `source .venv/bin/activate` then `exgrpo ...` does, with this interpreter's venv
    (the checkout's .venv under make)."""
    activate = Path(sys.prefix) / "bin" / "activate"
    env = {k: v for k, v in cli_env().items() if k != "VIRTUAL_ENV"} | {"PATH": "/usr/bin:/bin"}
    cmd = ["bash", "-c", f"source {activate} && exgrpo train replay.ratio=0 --cfg job"]
    res = run_captured(cmd, tmp_path, env, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "ratio: 0" in res.stdout and list(tmp_path.iterdir()) == []
