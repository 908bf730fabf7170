"""docs/configuration.md, generated from the schema: every key with its type, default and meaning
(config/schema.py's `metadata["help"]`), and every config group with its presets.

`python -m exgrpo_cli.config.reference --write` rewrites the page; tests/test_cli_help.py
fails when the page is stale or a key has no meaning. Outside the train step: documentation only.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from exgrpo_cli.config import keys as schema_keys
from exgrpo_cli.config.paths import config_dir

PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"

INTRO = """# Configuration reference

Every key `exgrpo` reads, generated from the one schema, `exgrpo_cli/config/schema.py` (each field's
`metadata["help"]`); do not edit this page by hand: `python -m exgrpo_cli.config.reference --write`
rewrites it, and a test fails when it is stale. The default is the schema's; a preset (`model=...`,
`experiment=...`) may set another, and `exgrpo <command> ... --cfg job` prints the composed values.
`exgrpo <command> --help` shows the keys a command reads, `--help-all` all of them. A key that
names a variant lists the names its registry holds (generated from the registries into
`exgrpo_cli/config/variant_names.py` by `python -m exgrpo_cli.commands.variants --write`).

Set a key with `key=value`. A key the schema does not declare is refused (exit 2, with the nearest
declared keys), also with `+key=value`; the free dicts `ablation.variants` and
`ablation.compare_to` take any name, `reward.components` any reward kind (added one at a time:
`+reward.components.math=1.0`), `hydra.*` is Hydra's own.
"""


def _cell(value: Any) -> str:
    if value is None:
        text = "null"
    elif isinstance(value, bool):
        text = str(value).lower()
    elif value == "":
        text = '""'
    else:
        text = str(value)
    return "`" + text.replace("|", "\\|") + "`"


def render() -> str:
    lines = [INTRO, "## Config groups", "", "| group | presets (the default in bold) |", "|---|---|"]
    defaults = schema_keys.default_presets(config_dir())
    for group, names in schema_keys.presets(config_dir()).items():
        shown = [f"**{n}**" if n == defaults.get(group) else n for n in names]
        lines.append(f"| `{group}` | {', '.join(shown)} |")
    by_section: dict[str, list[schema_keys.Key]] = {}
    for k in schema_keys.keys():
        by_section.setdefault(k.name.rsplit(".", 1)[0], []).append(k)
    for name, meaning, _ in schema_keys.sections():
        if name not in by_section:
            continue
        lines += [
            "",
            f"## `{name}`: {meaning}",
            "",
            "| key | type | default | meaning |",
            "|---|---|---|---|",
        ]
        for k in by_section[name]:
            meaning_cell = k.help.replace("|", "\\|")
            lines.append(f"| `{k.name}` | `{k.type}` | {_cell(k.default)} | {meaning_cell} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if argv == ["--write"]:
        PAGE.write_text(render())
        print(f"wrote {PAGE}")
        return 0
    if argv:
        print("usage: python -m exgrpo_cli.config.reference [--write]", file=sys.stderr)
        return 2
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
