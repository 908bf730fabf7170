"""What the docs show: the shell commands of README.md and docs/*.md and the code spans of their
prose. Pure text parsing for the docs tests (tests/test_docs.py, tests/test_docs_run.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from conftest import REPO

# Programs whose command lines a page shows inline (`...`) as something to type.
PROGRAMS = ("exgrpo", "make", "python", "python3", "pip", "sbatch", "torchrun", "scripts/", ".venv")
SHELL_FENCES = ("bash", "sh", "console", "shell")


@dataclass(frozen=True)
class DocCommand:
    page: str  # path relative to the repo root
    text: str  # the command as printed: continuations joined, comment dropped


def doc_pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def _strip_comment(line: str) -> str:
    # a shell comment: '#' at the start of a word, outside quotes (none of the docs quote a '#')
    return re.sub(r"(^|\s)#.*$", "", line).strip()


def _logical_lines(lines: list[str]) -> list[str]:
    out: list[str] = []
    buf = ""
    for raw in lines:
        line = raw.rstrip()
        if buf:
            line = buf + " " + line.strip()
        if line.endswith("\\"):
            buf = line[:-1].rstrip()
            continue
        buf = ""
        out.append(line)
    return out


def fenced_blocks(text: str) -> list[tuple[str, list[str]]]:
    """(info string, lines) of every fenced block."""
    blocks, info, body = [], None, []
    for line in text.splitlines():
        if line.startswith("```"):
            if info is None:
                info, body = line[3:].strip(), []
            else:
                blocks.append((info, body))
                info = None
            continue
        if info is not None:
            body.append(line)
    return blocks


def _outside_fences(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def inline_spans(text: str) -> list[str]:
    """The `code spans` of the prose (they may run across a line break)."""
    prose = _outside_fences(text).replace("\n", " ")
    return [re.sub(r"\s+", " ", s).strip() for s in re.findall(r"`([^`]+)`", prose)]


def _is_command(span: str) -> bool:
    parts = span.split()
    first = parts[0]
    known = any(
        first == p or first.startswith(p + "/") or (p.endswith("/") and first.startswith(p)) for p in PROGRAMS
    )
    if len(parts) < 2 or not known:
        return False
    if first == "exgrpo":  # `exgrpo train` alone names the command; `exgrpo train: ...` is output
        return len(parts) > 2 and parts[1] in ("train", "eval", "ablate", "inspect-buffer")
    return True


def page_commands(path: Path) -> list[DocCommand]:
    text = path.read_text()
    page = str(path.relative_to(REPO))
    found: list[str] = []
    for info, body in fenced_blocks(text):
        for line in _logical_lines(body):
            if info in SHELL_FENCES:
                stripped = line.strip()
                if stripped.startswith("#"):  # comments, #SBATCH, the shebang
                    continue
                if info == "console" and not stripped.startswith("$ "):
                    continue
                cmd = _strip_comment(stripped.removeprefix("$ ").removeprefix("exec "))
            elif line.startswith("$ "):  # a sample output block: its command lines
                cmd = _strip_comment(line[2:])
            else:
                continue
            if cmd:
                found.append(cmd)
    found += [s for s in inline_spans(text) if _is_command(s)]
    return [DocCommand(page, c) for c in dict.fromkeys(found)]


def all_commands() -> list[DocCommand]:
    return [c for p in doc_pages() for c in page_commands(p)]
