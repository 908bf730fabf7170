"""The docs (README.md, docs/*.md) against the code: every command they show is classified in
tests/doc_checks.py and composes as printed; every config key and preset they name exists; every
relative link and #anchor resolves; `exgrpo --help` and each command's help name the command's
page. The commands that run on a CPU are executed by tests/test_docs_run.py (slow)."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from doc_checks import (
    COMMANDS,
    ELSEWHERE,
    FRAGMENT,
    GROUPS,
    INSTALL,
    MAKE,
    SBATCH,
    SCRIPT,
    TEMPLATE,
    TOP_KEYS,
    TORCHRUN,
    command_argv,
    compose_command,
    makefile_targets,
    preset_exists,
    schema_has,
    sweep_points,
)
from doc_commands import all_commands, doc_pages, fenced_blocks, inline_spans

from conftest import REPO, SHARED_DATA

# What a placeholder stands for when a command is only composed (no file is read then).
PLACEHOLDERS = {
    "<run>": "outputs/train/RUN",
    "<partition>": "gpu",
    "<account>": "acct",
    "<that checkpoint>": "ckpt/model",
    "<reward model folder>": "org/reward-model",  # composed as a hub id: nothing is read
    "<overrides>": "",
    "$MASTER_ADDR": "node0",
}
# Files documented commands name that validation requires to exist (eval.path, eval.regrade).
FILES_READ_AT_VALIDATION = ("my_test.parquet", "outputs/eval/outputs/train/RUN/generations.jsonl")
COMMAND_PAGES = {  # exgrpo <command> -> the page its --help names
    "train": "docs/training-and-configs.md",
    "eval": "docs/evaluation.md",
    "ablate": "docs/ablations-and-results.md",
    "inspect-buffer": "docs/replay-buffer.md",
}


def _rel(p: Path) -> str:
    return str(p.relative_to(REPO))


# ---------------------------------------------------------------- every command classified


def test_every_documented_command_is_classified():
    found = {c.text: c.page for c in all_commands()}
    unclassified = {t: p for t, p in found.items() if t not in COMMANDS}
    assert not unclassified, (
        "commands shown in the docs that tests/doc_checks.py COMMANDS does not classify "
        f"(say how each is checked): {unclassified}"
    )
    stale = [t for t in COMMANDS if t not in found]
    assert not stale, f"COMMANDS entries no page shows any more (remove them): {stale}"


def _exgrpo_invocations() -> list[tuple[str, str, list[str]]]:
    """(documented text, command, overrides) of every exgrpo invocation a command implies."""
    out = []
    for text, check in COMMANDS.items():
        if check.mode in (MAKE, INSTALL, SCRIPT, FRAGMENT):
            continue
        if check.mode == ELSEWHERE and "--config-dir DIR" in text:  # the named test makes the folder
            continue
        if check.mode == SBATCH:
            argv = command_argv(text, PLACEHOLDERS)
            script = next(a for a in argv if a.endswith(".sbatch"))
            overrides = argv[argv.index(script) + 1 :]
            out.append((text, "train", overrides))
            continue
        argv = command_argv(text, PLACEHOLDERS)
        if check.mode == TORCHRUN or "exgrpo_cli" in argv:  # torchrun ... -m exgrpo_cli <command>
            i = argv.index("exgrpo_cli")
            out.append((text, argv[i + 1], argv[i + 2 :]))
            continue
        if check.mode == TEMPLATE:
            out += _template_invocations(text)
            continue
        if argv[0].endswith("/exgrpo"):  # .venv-vllm/bin/exgrpo
            argv = argv[1:]
        elif argv[0] not in ("train", "eval", "ablate", "inspect-buffer"):  # another program
            continue
        for point in sweep_points(argv[1:]):
            out.append((text, argv[0], point))
    unique: dict[tuple[str, tuple[str, ...]], tuple[str, str, list[str]]] = {}
    for text, command, overrides in out:  # one composition per distinct invocation
        unique.setdefault((command, tuple(overrides)), (text, command, overrides))
    return list(unique.values())


def _template_invocations(text: str) -> list[tuple[str, str, list[str]]]:
    argv = text.split()
    key, _, pattern = argv[2].partition("=")
    if "|" in pattern:
        names = pattern.split("|")
    else:  # experiment=<name>, experiment=paper-<backbone>: every preset the placeholder covers
        prefix = pattern.split("<")[0]
        names = sorted(p.stem for p in (REPO / "conf" / key).glob(f"{prefix}*.yaml"))
    assert names, f"{text}: no preset in conf/{key}/ matches"
    return [(text, argv[1], [f"{key}={n}"]) for n in names]


INVOCATIONS = _exgrpo_invocations()


@pytest.mark.parametrize(
    ("text", "command", "overrides"),
    INVOCATIONS,
    ids=[f"{c} {' '.join(o)}"[:90] for _, c, o in INVOCATIONS],
)
def test_documented_command_composes(
    text: str, command: str, overrides: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """As `exgrpo <command> ... --cfg job`: known keys and presets, values in range, known variants."""
    named = [n for n in FILES_READ_AT_VALIDATION if n in " ".join(overrides)]
    if named:  # validation checks that the file exists (not its content): give it one
        for name in named:
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name).touch()
        monkeypatch.chdir(tmp_path)
    else:  # relative paths in the docs are relative to the repo root (data=deepmath: ../shared/data)
        monkeypatch.chdir(REPO)
    if "data=deepmath" in overrides and not (SHARED_DATA / "train" / "deepmath_5k.jsonl").is_file():
        pytest.skip(f"data=deepmath reads {SHARED_DATA}/train/deepmath_5k.jsonl, absent here")
    try:
        compose_command(command, overrides)
    except Exception as err:  # name the documented line, not only the composed overrides
        pytest.fail(f"documented command `{text}` does not compose: {type(err).__name__}: {err}")


def test_make_targets_exist():
    targets = makefile_targets()
    missing = [t for t, c in COMMANDS.items() if c.mode == MAKE and t.split()[1] not in targets]
    assert not missing, f"documented make targets the Makefile lacks: {missing}"


def test_install_lines_match_the_project():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = set(project["optional-dependencies"])
    makefile = (REPO / "Makefile").read_text()
    for text, check in COMMANDS.items():
        if check.mode != INSTALL:
            continue
        for group in re.findall(r"\.\[([\w,]+)\]", text):
            unknown = set(group.split(",")) - extras
            assert not unknown, f"`{text}`: pyproject.toml has no extra {sorted(unknown)}"
        for pin in re.findall(r"[\w-]+==[\w.]+", text):
            assert pin in makefile, f"`{text}`: the Makefile installs another version than {pin}"


def documented_scripts() -> list[tuple[str, Path]]:
    out = []
    for text, check in COMMANDS.items():
        if check.mode in (SCRIPT, SBATCH):
            script = next(a for a in text.split() if a.endswith((".sh", ".py", ".sbatch")))
            out.append((text, REPO / script))
    return out


def test_documented_scripts_parse():
    """Shell scripts: `bash -n`. Python scripts: they compile and declare every option the docs
    pass (their `--help` runs in tests/test_docs_run.py: some import torch first)."""
    for text, path in documented_scripts():
        assert path.is_file(), f"`{text}`: no {path.relative_to(REPO)}"
        if path.suffix == ".py":
            source = path.read_text()
            compile(source, str(path), "exec")
            missing = [o for o in re.findall(r"(?<!\S)(--[a-z][\w-]*)", text) if f'"{o}"' not in source]
            assert not missing, f"`{text}`: {path.name} declares no option {missing}"
            continue
        proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, f"`{text}`: bash -n {path.name} failed:\n{proc.stderr[-2000:]}"


@pytest.mark.parametrize("page", doc_pages(), ids=_rel)
def test_shell_blocks_parse(page: Path, tmp_path: Path):
    """Every ```bash block (the job script of scaling-up.md included) is valid shell: `bash -n`,
    with each <placeholder> read as a word."""
    for n, (info, body) in enumerate(fenced_blocks(page.read_text())):
        if info not in ("bash", "sh"):
            continue
        script = tmp_path / f"block{n}.sh"
        script.write_text(re.sub(r"<[^<>\n]+>", "PLACEHOLDER", "\n".join(body)) + "\n")
        proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, f"{_rel(page)}: a ```{info} block is not valid shell: {proc.stderr}"


def test_sbatch_script_runs_exgrpo_train():
    body = (REPO / "scripts" / "slurm" / "train.sbatch").read_text()
    assert re.search(r"-m exgrpo_cli train\b", body) and '"$@"' in body, (
        "scripts/slurm/train.sbatch should pass its arguments to `torchrun ... -m exgrpo_cli train`"
    )


def test_elsewhere_commands_are_run_by_the_named_test():
    for text, check in COMMANDS.items():
        if check.mode == ELSEWHERE:
            path = REPO / check.note
            assert path.is_file(), f"`{text}`: {check.note} does not exist"
            assert check.needle in path.read_text(), f"`{text}`: {check.note} does not run {check.needle}"


# ---------------------------------------------------------------- keys and presets in the text

_KEY = r"(?:" + "|".join(TOP_KEYS) + r")(?:\.[A-Za-z_]\w*)+"
_ASSIGNED = re.compile(r"(?<![\w/.$-])(" + _KEY + r")=")
_SPAN_KEY = re.compile(r"^(" + _KEY + r")(\.\*)?$")
_PRESET = re.compile(r"(?<![\w/.$+-])(" + "|".join(GROUPS) + r")=([A-Za-z][\w.-]*)(?![\w.<-])")
_FILE_SUFFIX = re.compile(r"\.(sh|py|json|jsonl|parquet|yaml|md|safetensors)$")  # `eval.sh` is a file
_HYDRA_KEY = re.compile(r"(?<![\w/.$-])(hydra(?:\.\w+)+)=?")


def _mentioned_keys(text: str) -> set[str]:
    keys = set(_ASSIGNED.findall(text))
    for span in inline_spans(text):
        m = _SPAN_KEY.match(span)
        if m and not _FILE_SUFFIX.search(span):
            keys.add(m.group(1) + (m.group(2) or ""))
    return keys


@pytest.mark.parametrize("page", doc_pages(), ids=_rel)
def test_documented_keys_exist_in_the_schema(page: Path):
    unknown = sorted(k for k in _mentioned_keys(page.read_text()) if not schema_has(k))
    assert not unknown, f"{_rel(page)} names keys exgrpo_cli/config/schema.py does not declare: {unknown}"


@pytest.mark.parametrize("page", doc_pages(), ids=_rel)
def test_documented_presets_exist(page: Path):
    missing = sorted(
        f"{g}={n}"
        for g, n in set(_PRESET.findall(page.read_text()))
        if n != "null" and not preset_exists(g, n)
    )
    assert not missing, f"{_rel(page)} names presets conf/ does not have: {missing}"


def test_documented_hydra_keys_exist():
    """hydra.* keys of the prose (launcher keys with the SLURM launcher chosen)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from exgrpo_cli.config.paths import config_dir
    from exgrpo_cli.config.schema import register_configs
    from exgrpo_cli.host import register_run_name_resolver

    register_configs()
    register_run_name_resolver()  # as compose_command does: this test may run first (pytest-xdist, -k)
    with initialize_config_dir(config_dir=config_dir(), version_base=None):
        cfg = compose("config", overrides=["hydra/launcher=submitit_slurm"], return_hydra_config=True)
    keys = {k for p in doc_pages() for k in _HYDRA_KEY.findall(p.read_text())}
    missing = sorted(k for k in keys if OmegaConf.select(cfg, k, default="<absent>") == "<absent>")
    assert not missing, f"hydra keys the docs name that Hydra does not have: {missing}"


# ---------------------------------------------------------------- links


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`([^`]*)`", r"\1", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
        slug = _slug(heading)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


@pytest.mark.parametrize("page", doc_pages(), ids=_rel)
def test_relative_links_and_anchors_resolve(page: Path):
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    text = re.sub(r"`[^`]*`", "", text)  # code spans are not links
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):  # http(s):, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target} (no {dest.relative_to(REPO) if dest.is_relative_to(REPO) else dest})")
        elif anchor and (dest.suffix != ".md" or anchor not in _anchors(dest)):
            broken.append(f"{target} (no heading #{anchor} in {dest.name})")
    assert not broken, f"{_rel(page)}: broken links {broken}"


def test_every_docs_page_is_linked_from_the_index():
    index = (REPO / "docs" / "README.md").read_text()
    unlinked = [
        p.name for p in (REPO / "docs").glob("*.md") if p.name != "README.md" and f"]({p.name})" not in index
    ]
    assert not unlinked, f"docs/README.md does not link {unlinked}"


# ---------------------------------------------------------------- --help names the page


# `exgrpo --help`, then `exgrpo <command> --help` for each command, in one process (each exits).
_HELPS = """
import sys
from exgrpo_cli.cli.main import main
for args in [["--help"]] + [[c, "--help"] for c in sys.argv[1:]]:
    print("=== exgrpo", *args, flush=True)
    try:
        main(args)
    except SystemExit as exit:
        print("=== exit", exit.code, flush=True)
"""


@pytest.fixture(scope="module")
def helps() -> dict[str, str]:
    proc = subprocess.run(
        [sys.executable, "-c", _HELPS, *COMMAND_PAGES], capture_output=True, text=True, timeout=300, cwd=REPO
    )
    out = {}
    for block in proc.stdout.split("=== exgrpo ")[1:]:
        args, _, rest = block.partition("\n")
        body, _, code = rest.rpartition("=== exit ")
        assert code.strip() == "0", f"`exgrpo {args}` exited {code.strip()}: {proc.stderr[-2000:]}"
        out[args] = body
    return out


def test_top_level_help_names_the_docs(helps: dict[str, str]):
    out = helps["--help"]
    # the repo's README as a word of its own (not only the tail of docs/README.md)
    assert re.search(r"(?<![/\w])README\.md", out), "`exgrpo --help` does not name README.md"
    for page in ["README.md", "docs/README.md", *COMMAND_PAGES.values()]:
        assert page in out, f"`exgrpo --help` does not name {page}"
        assert (REPO / page).is_file()


@pytest.mark.parametrize("command", sorted(COMMAND_PAGES))
def test_command_help_names_its_page(command: str, helps: dict[str, str]):
    page = COMMAND_PAGES[command]
    assert f"Docs: {page}" in helps[f"{command} --help"], f"`exgrpo {command} --help` does not name {page}"
    assert (REPO / page).is_file()
