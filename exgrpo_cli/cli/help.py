"""`exgrpo <command> --help`: the command's usage, its config groups with their presets, and the
keys it reads with their one-line meanings (config/schema.py's `metadata["help"]`), grouped by section.

The page stays short (at most PAGE_LINES lines): sections are shown in full in the command's order
of importance while they fit, the rest as one line each; `--help-all` lists every key. The values
shown are the composed ones (presets and the user's overrides applied), so that `exgrpo train
model=qwen2.5-math-7b --help` shows what that run would use.
"""

from __future__ import annotations

from typing import Any

from exgrpo_cli.config import keys as schema_keys

PAGE_LINES = 118  # the short page's budget (the "at most ~120 lines")

# The sections each command reads, most important first, and the config groups that matter to it.
SECTIONS = {
    "train": ["replay", "algo", "trainer", "model", "rollout", "data", "logger"],
    "eval": ["eval", "model", "rollout", "trainer"],
    "ablate": ["ablation", "replay", "algo", "trainer", "model", "rollout", "data", "logger"],
    "inspect-buffer": ["inspect"],
}
GROUPS = {
    "train": ["experiment", "model", "data", "rollout", "algo", "replay", "logger"],
    "eval": ["eval", "model", "rollout"],
    "ablate": ["ablation", "experiment", "model", "data", "rollout", "replay"],
    "inspect-buffer": [],
}
USAGE = {
    "train": "exgrpo train [group=preset ...] [key=value ...] [-m] [--cfg job] [--help-all]",
    "eval": "exgrpo eval [eval=<suite>] [model=<preset> model.path=<checkpoint>] [key=value ...]",
    "ablate": "exgrpo ablate ablation=<name> [experiment=<recipe>] [key=value ...]",
    "inspect-buffer": "exgrpo inspect-buffer <path> [--json] [key=value ...]",
}
ARGUMENTS = {
    "inspect-buffer": [
        ("<path>", "a run dir (its latest complete checkpoint) or a checkpoint dir; = inspect.target"),
        ("--json", "one JSON object on stdout, nothing else there; = inspect.format=json"),
        ("plots", "inspect.plot=true writes buffer.png to inspect.out_dir (default: this command's"),
        ("", "own run dir under outputs/inspect_buffer/); nothing is written into the run it reads"),
    ],
    "eval": [
        ("model", "model=<preset> model.path=<folder or hub id>: a foreign checkpoint with its preset"),
        ("", "(template, dtype, engine); a checkpoint of an exgrpo run needs no preset"),
        ("eval.data_dir", "the paper's benchmark files: docs/evaluation.md#benchmark-data"),
    ],
    "ablate": [
        ("ablation", "a preset of conf/ablation/, or DIR/ablation/<name>.yaml with --config-dir DIR"),
        (
            "experiment",
            "experiment=<recipe>: every run at the recipe's scale (docs/ablations-and-results.md)",
        ),
    ],
}
FOOTER = """Print the composed config: --cfg job. Sweep: -m, e.g. -m replay.ratio=0,0.5 trainer.seed=0,1,2
Every key with its type, default and meaning: --help-all, or docs/configuration.md.
Docs: {page} (in the exgrpo repository; docs/README.md lists every page)"""


def _show(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return repr(value) if value == "" or " " in value else value
    return str(value).replace(" ", "")


def _lookup(composed: dict[str, Any] | None, dotted: str, default: Any) -> Any:
    node: Any = composed
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def _key_lines(section: str, composed: dict[str, Any] | None, full: bool) -> list[str]:
    rows = [k for k in schema_keys.keys() if k.name.startswith(section + ".")]
    lines: list[str] = []
    for sub, meaning, _ in schema_keys.sections():
        if not full and sub.startswith(section + "."):  # a subsection: one line on the short page
            n = sum(1 for k in rows if k.name.startswith(sub + "."))
            rows = [k for k in rows if not k.name.startswith(sub + ".")]
            lines.append(f"  {sub + '.*':<38}  {meaning} ({n} keys: --help-all)")
    for k in rows:
        left = f"{k.name}={_show(_lookup(composed, k.name, k.default))}"
        if len(left) > 38:  # a long value (a path, a list) gets its own line
            lines += [f"  {left}", f"  {'':38}  {k.help}"]
        else:
            lines.append(f"  {left:<38}  {k.help}")
    return lines


def _section_title(section: str) -> str:
    meaning = {name: h for name, h, _ in schema_keys.sections()}[section]
    return f"{section}: {meaning}"


def _group_lines(command: str, conf_dir: str, choices: dict[str, str]) -> list[str]:
    available = schema_keys.presets(conf_dir)
    out = []
    for group in GROUPS[command]:
        chosen = choices.get(group, "null")
        names = [f"{p}*" if p == chosen else p for p in available.get(group, [])]
        out += _wrap(f"  {group:<11} ", names)
    if command == "eval":  # the suites and what each one runs
        out += ["", "Suites (eval=<suite>; benchmark files in eval.data_dir):"] + _suite_lines(conf_dir)
    return out


def _wrap(lead: str, words: list[str], width: int = 100) -> list[str]:
    lines, line = [], lead
    for i, w in enumerate(words):
        piece = w + ("," if i < len(words) - 1 else "")
        if len(line) + len(piece) + 1 > width and line.strip():
            lines.append(line.rstrip())
            line = " " * len(lead)
        line += piece + " "
    return lines + [line.rstrip()]


def _suite_lines(conf_dir: str) -> list[str]:
    from omegaconf import OmegaConf

    out = []
    for name in schema_keys.presets(conf_dir).get("eval", []):
        node = OmegaConf.to_container(OmegaConf.load(f"{conf_dir}/eval/{name}.yaml"))
        benches = list(node.get("benchmarks") or []) if isinstance(node, dict) else []
        what = ", ".join(benches) if benches else "eval.path=<file> (parquet or jsonl)"
        out.append(f"  {name:<11} {what}")
    return out


def render(
    command: str,
    summary: str,
    page: str,
    conf_dir: str,
    composed: dict[str, Any] | None,
    choices: dict[str, str],
    full: bool = False,
) -> str:
    """The help page of `command`; `full`: every section of the schema, every key."""
    head = [f"usage: {USAGE[command]}", "", summary]
    if command in ARGUMENTS:
        head += ["", "Arguments:"] + [f"  {a:<14} {h}" for a, h in ARGUMENTS[command]]
    if GROUPS[command]:
        head += ["", "Config groups (group=preset; * the default):"]
        head += _group_lines(command, conf_dir, choices)
    foot = ["", *FOOTER.format(page=page).splitlines()]
    order = [s for s, _, _ in schema_keys.sections() if "." not in s] if full else SECTIONS[command]
    body = ["", "Settings (key=value; the value this command would use):"]
    for i, section in enumerate(order):
        full_lines = [_section_title(section)] + _key_lines(section, composed, full)
        rest = len(order) - i - 1  # each later section needs at least its one line
        if full or len(head) + len(body) + len(full_lines) + rest + len(foot) <= PAGE_LINES:
            body += full_lines
        else:
            n = sum(1 for k in schema_keys.keys() if k.name.startswith(section + "."))
            body.append(f"{section}.*: {n} keys ({_section_title(section).split(': ', 1)[1]}): --help-all")
    return "\n".join(head + body + foot)
