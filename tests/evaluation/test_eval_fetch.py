"""`exgrpo eval` with a fresh cache and a loopback mirror (eval.data_url) of the official files:
the files are fetched, verified and evaluated without anything placed by hand, fetched once, and
shown beside the paper's figures; a changed byte, a stopped server or a hung one is one line, exit
2, before any model loads, with nothing left in the cache and no run folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import SHARED_DATA, loopback_mirror, run_cli

BENCH = SHARED_DATA / "benchmarks"
FILES = ("test.id.parquet", "valid.arc_c.parquet", "valid.gpqa.parquet")
SMOKE = ["model.path=builtin:tiny", "eval.limit=1", "eval.n=1", "eval.max_new_tokens=8", "trainer.threads=1"]


@pytest.fixture
def served() -> dict[str, bytes]:
    if not all((BENCH / f).is_file() for f in FILES):
        pytest.skip("../shared/data/benchmarks is absent")
    return {f: (BENCH / f).read_bytes() for f in FILES}


def _eval(tmp_path: Path, run: str | None, *args: str) -> tuple[int, str, str]:
    """`exgrpo eval` in tmp_path, into tmp_path/<run> (None: Hydra's own outputs/ folder)."""
    res = run_cli(
        ["eval", *([f"hydra.run.dir={tmp_path / run}"] if run else []), *args],
        cwd=tmp_path,
        env_extra={"XDG_CACHE_HOME": str(tmp_path / "cache")},
    )
    return res.returncode, res.stdout, res.stderr


def _cached(tmp_path: Path) -> list[str]:
    folder = tmp_path / "cache" / "exgrpo" / "benchmarks"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


@pytest.mark.long  # two tiny-model evals end to end (~14 s here, more under load)
def test_a_fresh_cache_is_filled_once_and_the_paper_is_beside(tmp_path: Path, served: dict[str, bytes]):
    with loopback_mirror(served) as m:
        rc, out, err = _eval(tmp_path, "id", "eval=id", f"eval.data_url={m.url}", *SMOKE)
        assert rc == 0, err[-3000:]
        assert _cached(tmp_path) == ["test.id.parquet"] and m.hits == {"test.id.parquet": 1}
        paper = "[aime24,aime25,amc,math500,minerva,olympiad,arc_c,gpqa]"  # MMLU-Pro is the hub's
        rc, out, err = _eval(
            tmp_path,
            "paper",
            "eval=paper",
            f"eval.benchmarks={paper}",
            f"eval.data_url={m.url}",
            "eval.published=qwen2.5-math-7b/exgrpo",
            *SMOKE,
        )
        assert rc == 0, err[-3000:]
        assert m.hits == dict.fromkeys(FILES, 1)  # test.id.parquet came from the cache this time
    assert _cached(tmp_path) == sorted(FILES)
    (model,) = json.loads((tmp_path / "paper" / "results.json").read_text())["models"]
    pub = model["published"]
    assert pub["row"] == "qwen2.5-math-7b/exgrpo" and pub["benchmarks"]["aime24"] == 31.6
    assert pub["difference"]["aime24"] == pytest.approx(100 * model["benchmarks"]["aime24"]["score"] - 31.6)
    assert "paper: qwen2.5-math-7b/exgrpo" in out and "yours - paper" in out
    first = json.loads((tmp_path / "id" / "results.json").read_text())["models"][0]
    assert first["published"] is None  # the tiny model has no figures: none shown, none made up


@pytest.mark.slow  # three CLI starts that stop before any model loads (~4 s each)
def test_bad_checksum_no_network_and_a_hung_server_are_one_line_each(
    tmp_path: Path, served: dict[str, bytes]
):
    changed = bytearray(served["test.id.parquet"])
    changed[12345] ^= 0xFF
    cases = []
    with loopback_mirror(served | {"test.id.parquet": bytes(changed)}) as m:
        url = m.url
        rc, _, err = _eval(tmp_path, None, "eval=id", f"eval.data_url={m.url}", *SMOKE)
        cases.append((rc, err, "fails its checksum (sha256 "))
    rc, _, err = _eval(tmp_path, None, "eval=id", f"eval.data_url={url}", *SMOKE)  # the server is gone
    cases.append((rc, err, f"cannot fetch test.id.parquet from {url}/test.id.parquet"))
    with loopback_mirror(served) as m:
        m.mode = "hang"
        rc, _, err = _eval(
            tmp_path, None, "eval=id", f"eval.data_url={m.url}", "eval.fetch_timeout_s=1", *SMOKE
        )
        cases.append((rc, err, "no data for 1 s (the server hangs)"))
    for rc, err, said in cases:
        # the refusal is one line, the last; before it at most the fetch's own progress line
        lines = err.splitlines()
        assert rc == 2 and said in lines[-1] and lines[-1].startswith("exgrpo eval: "), err[-2000:]
        assert len(lines) <= 2 and all(x.startswith("fetching ") for x in lines[:-1]), err[-2000:]
    assert _cached(tmp_path) == []  # nothing half-fetched or unverified stays
    assert not (tmp_path / "outputs").exists()  # no run folder of a run that never started
