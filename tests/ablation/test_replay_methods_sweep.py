"""The replay-methods sweeps (conf/ablation/replay-methods.yaml and its weak-start twin): every
variant names a registered method, every registered method has a variant, no variant touches the
fresh-rollout budget, and the sweep runs end to end with its replay figures in the summary."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from exgrpo_cli.ablation import sweep as sw
from exgrpo_cli.config.paths import config_dir
from exgrpo_cli.replay.method_registry import REPLAY_METHODS

from conftest import run_cli

PRESETS = ("replay-methods", "replay-methods-weak")
# what "the same fresh-rollout budget" holds fixed (docs/ablations-and-results.md, "Replay methods")
BUDGET_KEYS = ("algo.questions_per_step", "rollout.n", "trainer.steps", "trainer.seed")


def composed(preset: str) -> dict[str, Any]:
    """`ablation` as `exgrpo ablate ablation=<preset>` composes it (inherited variants included)."""
    from hydra import compose, initialize_config_dir

    from exgrpo_cli.config.schema import register_configs

    register_configs()
    with initialize_config_dir(config_dir=config_dir(), version_base=None):
        cfg = compose(config_name="config", overrides=[f"ablation={preset}"])
    out = OmegaConf.to_container(cfg.ablation, resolve=False)
    assert isinstance(out, dict)
    return out


def methods_named(variants: dict[str, list[str]]) -> dict[str, str]:
    """variant -> the replay.method it runs ('exgrpo', the default, when it sets none)."""
    named = {}
    for name, overrides in variants.items():
        values = [o.split("=", 1)[1] for o in overrides if sw.override_key(o) == "replay.method"]
        named[name] = values[-1] if values else "exgrpo"
    return named


def unregistered(variants: dict[str, list[str]]) -> list[str]:
    return [f"{v}: replay.method={m}" for v, m in methods_named(variants).items() if m not in REPLAY_METHODS]


@pytest.mark.parametrize("preset", PRESETS)
def test_every_variant_names_a_registered_method(preset: str) -> None:
    variants = composed(preset)["variants"]
    assert len(variants) >= 3
    assert not unregistered(variants), f"{preset} names methods the registry lacks: {unregistered(variants)}"


def test_the_check_catches_a_method_the_registry_lacks() -> None:
    """The test above is not vacuous: a line for a method nobody registered is reported."""
    variants = {**composed("replay-methods")["variants"], "nope": ["replay.method=nope"]}
    assert unregistered(variants) == ["nope: replay.method=nope"]


def test_every_registered_method_has_a_variant() -> None:
    """A method added to REPLAY_METHODS is compared: its line goes into replay-methods.yaml."""
    named = set(methods_named(composed("replay-methods")["variants"]).values())
    missing = sorted(set(REPLAY_METHODS) - named)
    assert not missing, (
        f"add `<name>: [replay.method=<name>]` to conf/ablation/replay-methods.yaml: {missing}"
    )


@pytest.mark.parametrize("preset", PRESETS)
def test_variants_leave_the_budget_alone(preset: str) -> None:
    """A variant sets what its method is, never how many fresh rollouts a run may draw; the
    on-policy baseline is the one variant without replay."""
    a = composed(preset)
    for name, overrides in a["variants"].items():
        touched = [o for o in overrides if sw.override_key(o) in BUDGET_KEYS or o.startswith("data")]
        assert not touched, f"{preset} variant {name!r} changes the budget: {touched}"
    ratio_zero = [n for n, ov in a["variants"].items() if "replay.ratio=0" in ov]
    assert ratio_zero == ["on-policy"] and a["baseline"] == "on-policy"
    keys = {sw.override_key(o) for o in a["base"]}
    assert {"algo.questions_per_step", "rollout.n", "trainer.steps"} <= keys


def test_the_weak_start_runs_the_same_variants_and_budget_on_the_weak_task() -> None:
    default, weak = composed("replay-methods"), composed("replay-methods-weak")
    assert weak["variants"] == default["variants"]  # inherited: a method added once runs on both
    assert weak["seeds"] == default["seeds"] and weak["baseline"] == default["baseline"]
    extra = sorted(set(weak["base"]) - set(default["base"]))
    assert extra == ["algo.lr=3e-4", "data.synthetic.max_digits=3"]
    assert not set(default["base"]) - set(weak["base"])


@pytest.mark.long  # three training runs (~40 s on the shared CPU): make test-all only
def test_the_sweep_runs_and_its_summary_has_each_methods_replay_figures(tiny_model: Path, tmp_path: Path):
    sweep = tmp_path / "sweep"
    res = run_cli(
        [
            "ablate",
            "ablation=replay-methods",
            "ablation.seeds=1",
            f"ablation.sweep_dir={sweep}",
            "trainer.steps=3",
            "trainer.eval_every=3",
            "trainer.val_questions=8",
            "algo.questions_per_step=4",
            "rollout.n=4",
            f"hydra.run.dir={tmp_path / 'hydra'}",
        ],
        timeout=900,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    rows = {r["variant"]: r for r in csv.DictReader((sweep / "replay_figures.csv").open())}
    assert set(rows) == set(composed("replay-methods")["variants"])
    assert rows["on-policy"]["age_mean"] == "" and float(rows["on-policy"]["replayed_per_step"]) == 0
    # 4 questions x K=4 a step; exgrpo's replayed questions hold 1 stored row each, prompt's none
    assert float(rows["prompt"]["fresh_per_step"]) == 16.0
    assert float(rows["exgrpo"]["replayed_per_step"]) > 0
    assert float(rows["exgrpo"]["fresh_per_step"]) < 16.0
    assert float(rows["exgrpo"]["age_mean"]) >= 1
    assert rows["prompt"]["age_mean"] == ""  # it replays no stored row: no age, no staleness
    summary = (sweep / "summary.md").read_text()
    assert "## What each variant replayed, and how far off-policy" in summary
