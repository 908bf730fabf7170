"""inspect-buffer takes no trust, model or data source from the run it inspects (issue 30, item 1):
a run whose saved config says `model.trust_remote_code: true` and whose checkpoint's tokenizer
names a Python file in `auto_map` runs nothing; the data source the run named is shown, the
questions are looked up in this command's `data.*`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from exgrpo_cli.config.schema import COMMAND_ONLY, ExgrpoConfig, with_own_command_only
from exgrpo_cli.inspection.show import show_question
from exgrpo_cli.replay.buffer import ExperienceBuffer


def crafted_model(folder: Path, tiny: Path, marker: Path) -> None:
    """The tiny model's folder with a tokenizer whose auto_map names a file that writes `marker`."""
    shutil.copytree(tiny, folder)
    (folder / "evil_tok.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n"
        "from transformers import PreTrainedTokenizerFast as EvilTokenizer\n"
    )
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["auto_map"] = {"AutoTokenizer": [None, "evil_tok.EvilTokenizer"]}
    cfg["tokenizer_class"] = "EvilTokenizer"
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))


def test_show_runs_no_code_and_reads_no_data_the_run_names(tmp_path: Path, tiny_model: Path) -> None:
    run, marker = tmp_path / "run", tmp_path / "ran"
    ckpt = run / "checkpoints" / "step_1"
    crafted_model(ckpt / "model", tiny_model, marker)
    secret = tmp_path / "elsewhere.jsonl"
    secret.write_text(json.dumps({"prompt": "secret question", "ground_truth": "1"}) + "\n")
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text(
        "model:\n  trust_remote_code: true\n"
        f"data:\n  source: jsonl\n  path: {secret}\n  val_size: 0\n"
        "rollout:\n  temperature: 0.7\ntrainer:\n  output_dir: ${hydra:runtime.output_dir}\n"
    )
    buf = ExperienceBuffer(4, None, 0)
    own = ExgrpoConfig()
    uid = "syn-03479"  # a question of this command's own data (the default synthetic pool)
    buf.observe_group(uid, 2, [(np.array([5, 6, 7], np.int32), np.zeros(3, np.float32))], 1, True)
    try:
        info = show_question(ckpt, buf, uid, own, score=False)
    except Exception as err:  # transformers may refuse the tokenizer outright: also no code ran
        info = {"refused": str(err)}
    assert not marker.exists(), "the run's auto_map code ran"
    if "refused" not in info:
        assert "secret question" not in json.dumps(info)
        assert f"data.path={secret}" in info["note"]  # the source the run named is said
        assert info["question"] is not None  # found in this command's data


def test_command_only_keys_exist_and_are_taken_from_the_command() -> None:
    import dataclasses

    run = ExgrpoConfig()
    run = dataclasses.replace(
        run,
        model=dataclasses.replace(run.model, trust_remote_code=True, path="evil/model"),
        data=dataclasses.replace(run.data, source="hf", path="evil/data"),
        rollout=dataclasses.replace(run.rollout, temperature=0.7),
    )
    merged = with_own_command_only(run, ExgrpoConfig())
    assert merged.model.trust_remote_code is False and merged.model.path == ExgrpoConfig().model.path
    assert merged.data == ExgrpoConfig().data
    assert merged.rollout.temperature == 0.7  # settings that name no code stay the run's
    for key in COMMAND_ONLY:  # each entry names a key or section of the schema
        obj: object = ExgrpoConfig()
        for part in key.split("."):
            assert dataclasses.is_dataclass(obj) and part in {f.name for f in dataclasses.fields(obj)}, key
            obj = getattr(obj, part)


@pytest.mark.slow
def test_inspect_buffer_takes_any_path(tmp_path: Path) -> None:
    """A path with `=`, spaces and brackets reaches the command as written (it was taken for a
    Hydra override, or failed to parse as one)."""
    from conftest import run_cli

    for name in ("a=b", "run (1)", "x,y[z]"):
        odd = tmp_path / name
        odd.mkdir()
        res = run_cli(["inspect-buffer", str(odd), f"hydra.run.dir={tmp_path / 'hydra'}"], cwd=tmp_path)
        assert res.returncode == 1 and f"{odd} is neither a run dir" in res.stderr, res.stderr[-2000:]
