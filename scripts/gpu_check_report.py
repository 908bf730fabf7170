"""The GPU acceptance check's report (scripts/gpu_check.py): the verdict's fields, the JSON file,
written whole after every section, and the table with its one-line verdict, also for a report a
cut-off run left behind (`--render`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpu_check_context import gib

SECTIONS = ("update", "pinned", "generate", "pytest", "vllm")


def conclude(report: dict[str, Any], done: bool) -> None:
    """The verdict's fields. Passed: nothing failed, timed out or left out; what could not run here
    (vLLM absent) is listed as not proven, never counted as passed. Until every section has run
    (`done` false) the report is partial: `complete` says so, and `ok` stays false."""
    sections = report["sections"].values()
    report["complete"] = done
    report["ok"] = done and all(r["status"] in ("ok", "not proven") for r in sections)
    report["not_proven"] = [n for n, r in report["sections"].items() if r["status"] == "not proven"]


def write_report(out: Path, report: dict[str, Any]) -> None:
    """The JSON report, replaced whole (never a half-written file)."""
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(report, indent=1))
    tmp.replace(out)


def render_file(path: Path) -> int:
    """--render: the table and the verdict of a report on disk, complete or cut short (the sections
    a cut left out are named, with the measured numbers of one cut mid-way from its partial file)."""
    report = json.loads(path.read_text())
    for partial in sorted(path.parent.glob(f"{path.stem}.*.partial.json")):
        name = partial.name.removeprefix(f"{path.stem}.").removesuffix(".partial.json")
        if name not in report["sections"]:
            try:
                got = json.loads(partial.read_text() or "{}")
            except ValueError:
                got = {}
            stage = got.get("stage", "?")
            report["sections"][name] = {**got, "status": "cut off", "reason": f"cut off at stage {stage}"}
    if not report.get("complete"):
        conclude(report, done=False)
        missing = [n for n in report.get("planned", SECTIONS) if n not in report["sections"]]
        print(
            f"{path}: the check was cut short" + (f"; never started: {', '.join(missing)}" if missing else "")
        )
    print(render(report))
    print(verdict(report))
    return 0 if report.get("ok") else 1


def verdict(report: dict[str, Any]) -> str:
    """One line: PASSED or FAILED, what was proven (the sections that passed) and what not."""
    sections = report["sections"]
    proven = [n for n, r in sections.items() if r["status"] == "ok"]
    tail = f" (proven: {', '.join(proven) or 'nothing'})"
    if not report.get("complete", True):
        bad = [f"{n} {r['status']}" for n, r in sections.items() if r["status"] not in ("ok", "not proven")]
        return "INCOMPLETE: the check did not finish" + (f"; {', '.join(bad)}" if bad else "") + tail
    if not report["ok"]:
        bad = [f"{n} {r['status']}" for n, r in sections.items() if r["status"] not in ("ok", "not proven")]
        return f"FAILED: {', '.join(bad)}{tail}"
    missing = report["not_proven"]
    if not missing:
        return "PASSED" + tail
    why = "; ".join(f"{n}: {sections[n].get('reason', '')}" for n in missing)
    return f"PASSED, but NOT PROVEN: {', '.join(missing)} ({why}){tail}"


def summary(name: str, r: dict[str, Any]) -> str:
    """One line of a section's figures for the table."""
    if r.get("status") in ("not run", "not proven"):
        return str(r.get("reason", ""))
    if r.get("error"):
        return "error: " + str(r["error"]).strip().splitlines()[-1]
    parts: list[str] = []
    if name == "update" and "updates" in r:
        last = r["updates"][-1]
        parts.append(f"{r.get('gpu_run_layers', '?')} of 7B's 28 layers, offload={r.get('offload')}")
        if r.get("host_bytes"):
            parts.append(f"host {gib(r['host_bytes'])} ({r.get('host_source')})")
        if r.get("plan_update_bytes"):
            ratio = r["peak_bytes"] / r["plan_update_bytes"]
            parts.append(
                f"peak {gib(r['peak_bytes'])} vs plan {gib(r['plan_update_bytes'])} ({ratio:.2f} of it)"
            )
        parts.append(f"{last['tokens_per_s']:,.0f} tokens/s ({last['seconds']:.3g} s/update)")
    elif name == "pinned" and "rounded" in r:
        parts.append(
            f"default rounds pinned blocks: {r['rounded'].get('default')}; "
            f"{r.get('pinned_option')} gives exact blocks: {r.get('option_gives_exact_blocks')}"
        )
    elif name == "generate" and "tokens_per_s" in r:
        parts.append(f"{r['tokens']} tokens, {r['tokens_per_s']:,.1f} tokens/s")
    elif name == "pytest":
        parts.append(r.get("summary", ""))
    elif name == "vllm" and "diff_synced" in r:
        parts.append(
            f"mean abs log-prob diff: synced {r['diff_synced']:.4f}, "
            f"stale {r.get('diff_stale', float('nan')):.4f}, "
            f"fresh {r.get('diff_fresh', float('nan')):.4f}"
        )
        if r.get("freed_bytes") is not None:
            parts.append(f"sleep freed {gib(r['freed_bytes'])} (KV share {gib(r['kv_share_bytes'])})")
        if "vllm_tokens_per_s" in r:
            parts.append(f"{r['vllm_tokens_per_s']:,.0f} vs HF {r.get('hf_tokens_per_s', 0):,.0f} tokens/s")
    failed = [k for k, ok in r.get("checks", {}).items() if not ok]
    if failed:
        parts.append("FAILED: " + ", ".join(failed))
    if r.get("reason") and r.get("status") != "ok":
        parts.append(r["reason"])
    return "; ".join(parts)


def render(report: dict[str, Any]) -> str:
    rows = ["| section | status | s | result |", "|---|---|---|---|"]
    for name, r in report["sections"].items():
        rows.append(f"| {name} | {r['status']} | {r.get('seconds', 0):.0f} | {summary(name, r)} |")
    head = f"gpu_check ({report['mode']})"
    first = next(iter(report["sections"].values()), {})
    if first.get("device"):
        head += f" on {first['device']}"
    return head + "\n" + "\n".join(rows)
