"""Each variant against its reference over seeds: the differences and the rule that judges them.

Place: after summary.summarize in `exgrpo ablate` (ablation/report.py summarize_dir), on the same
RunResults. A variant's reference is `ablation.compare_to[variant]`, else the sweep's baseline; a
stability sweep pairs each method with the other method at the same learning rate.

The rule (stated in docs/ablations-and-results.md, "Where replay pays", before its final runs):
- a difference is the difference of the two variants' seed means;
- its standard error is Welch's, sqrt(s_a^2 / n_a + s_b^2 / n_b), with the sample std (ddof=1) of
  each variant over its seeds (undefined below two seeds each);
- z = difference / SE; |z| >= 2 reads "higher" or "lower", anything less "within 2 SE".
Three differences per pair: the final validation accuracy, the same at equal fresh rollouts (each
run's validation curve, linear in cumulative fresh rollouts, read at the smallest final rollout
count of the two variants' runs: a replaying variant draws fewer fresh rollouts in the same steps),
and each variant's own gain (final minus step-0 validation accuracy) against zero.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from exgrpo_cli.ablation.summary import NAN, RunResult, fmt, mean_std, write_table

Z_RULE = 2.0  # |difference| >= 2 standard errors counts as a difference


@dataclass(frozen=True)
class Estimate:
    value: float  # a difference of means (or a mean, for a gain)
    se: float  # its standard error (NaN when a side has fewer than two seeds)

    @property
    def z(self) -> float:
        if math.isnan(self.value) or math.isnan(self.se):
            return NAN
        if self.se == 0.0:
            return 0.0 if self.value == 0.0 else math.copysign(math.inf, self.value)
        return self.value / self.se

    @property
    def verdict(self) -> str:
        z = self.z
        if math.isnan(z):
            return "-"
        if abs(z) < Z_RULE:
            return "within 2 SE"
        return "higher" if z > 0 else "lower"

    def cell(self) -> str:
        if math.isnan(self.value):
            return "-"
        se = "" if math.isnan(self.se) else f" ± {fmt(self.se)}"
        z = self.z
        return fmt(self.value, signed=True) + se + ("" if math.isnan(z) else f" (z {z:+.1f})")


@dataclass
class Comparison:
    variant: str
    reference: str
    final: Estimate  # mean final(variant) - mean final(reference)
    at_rollouts: float  # the fresh-rollout count the next difference is read at
    equal_rollouts: Estimate  # the same difference at equal fresh rollouts
    gain: Estimate  # the variant's mean gain over its step-0 validation accuracy
    reference_gain: Estimate


def difference(a: list[float], b: list[float]) -> Estimate:
    """Mean(a) - mean(b) with Welch's standard error, over the finite values of each side."""
    a, b = [x for x in a if math.isfinite(x)], [x for x in b if math.isfinite(x)]
    if not a or not b:
        return Estimate(NAN, NAN)
    ma, sa = mean_std(a)
    mb, sb = mean_std(b)
    return Estimate(ma - mb, math.sqrt(sa**2 / len(a) + sb**2 / len(b)))


def gain(runs: list[RunResult]) -> Estimate:
    """Mean over seeds of final minus the step-0 validation accuracy, with its standard error."""
    gains = [r.final - r.curve[0][2] for r in runs if r.curve and r.curve[0][0] == 0]
    m, s = mean_std(gains)
    return Estimate(m, s / math.sqrt(len(gains)) if gains else NAN)


def accuracy_at(run: RunResult, rollouts: float) -> float:
    """The run's validation accuracy at a cumulative fresh-rollout count, linear between its
    validation points; NaN outside the range its curve covers."""
    pts = run.curve
    for (_, x0, y0), (_, x1, y1) in zip(pts, pts[1:]):
        if x0 <= rollouts <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (rollouts - x0) / (x1 - x0)
    return pts[-1][2] if pts and pts[-1][1] == rollouts else NAN


def compare(
    groups: list[tuple[str, list[RunResult]]], baseline: str, compare_to: dict[str, str]
) -> list[Comparison]:
    """One Comparison per variant with runs whose reference (its compare_to entry, else the
    baseline) is another variant with runs, in the order of `groups`."""
    runs_of = dict(groups)
    out = []
    for name, runs in groups:
        ref = compare_to.get(name, baseline)
        ref_runs = runs_of.get(ref, [])
        if ref == name or not runs or not ref_runs:
            continue
        at = min(r.rollouts for r in runs + ref_runs)
        out.append(
            Comparison(
                name,
                ref,
                difference([r.final for r in runs], [r.final for r in ref_runs]),
                at,
                difference([accuracy_at(r, at) for r in runs], [accuracy_at(r, at) for r in ref_runs]),
                gain(runs),
                gain(ref_runs),
            )
        )
    return out


def check_compare_to(compare_to: dict[str, str], names: list[str]) -> None:
    """Every key and value of ablation.compare_to must name a variant of the sweep."""
    for k, v in compare_to.items():
        for what, name in ((f"ablation.compare_to key {k!r}", k), (f"ablation.compare_to.{k}", v)):
            if name not in names:
                raise ValueError(f"invalid {what}={name!r}: allowed one of {', '.join(names)}")


# ----------------------------------------------------------------------------- writers

COLUMNS = (
    "variant",
    "reference",
    "delta_final",
    "delta_final_se",
    "delta_final_verdict",
    "at_rollouts",
    "delta_equal_rollouts",
    "delta_equal_rollouts_se",
    "delta_equal_rollouts_verdict",
    "gain",
    "gain_se",
    "reference_gain",
    "reference_gain_se",
)


def write_csv(rows: list[Comparison], path: Path) -> None:
    fields = [
        (
            c.variant,
            c.reference,
            c.final.value,
            c.final.se,
            c.final.verdict,
            c.at_rollouts,
            c.equal_rollouts.value,
            c.equal_rollouts.se,
            c.equal_rollouts.verdict,
            c.gain.value,
            c.gain.se,
            c.reference_gain.value,
            c.reference_gain.se,
        )
        for c in rows
    ]
    write_table(path, COLUMNS, fields)


def to_markdown(rows: list[Comparison]) -> str:
    """The comparisons as a markdown section (empty when there are none)."""
    if not rows:
        return ""
    lines = [
        "## Each variant against its reference",
        "",
        "| variant | vs | Δ final ± SE (z) | verdict | Δ at equal fresh rollouts ± SE (z) | verdict "
        "| gain ± SE (z) | reference gain ± SE (z) |",
        "|---|---|---:|---|---:|---|---:|---:|",
    ]
    for c in rows:
        cells = [
            c.variant,
            c.reference,
            c.final.cell(),
            c.final.verdict,
            f"{c.equal_rollouts.cell()} at {c.at_rollouts:.0f}",
            c.equal_rollouts.verdict,
            c.gain.cell(),
            c.reference_gain.cell(),
        ]
        lines.append("| " + " | ".join(x.replace("|", "/") for x in cells) + " |")
    lines += [
        "",
        "Δ: difference of seed means; SE: Welch's, sqrt(s_a²/n_a + s_b²/n_b) (sample std over seeds); "
        f"|z| >= {Z_RULE:g} reads higher/lower. Equal fresh rollouts: each run's validation curve, "
        "linear in cumulative fresh rollouts, read at the count given. Gain: final minus step-0 "
        "validation accuracy, mean over seeds with its standard error.",
        "",
    ]
    return "\n".join(lines)
