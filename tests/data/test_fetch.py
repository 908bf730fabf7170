"""data/fetch.py against a loopback mirror: a pinned file is downloaded once, verified, and every
failure (a changed byte, a truncated body, a hung server, no server, an offline machine, a bad file
already there) is one line that names the file and leaves nothing in the folder."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import pytest

from exgrpo_cli.data import fetch
from exgrpo_cli.data.pinned import PINNED, PinnedFile, benchmark_cache_dir, resolve_data_dir

from conftest import SHARED_DATA, loopback_mirror

BODY = bytes(range(256)) * 400  # 100 kB: more than one read chunk
PIN = PinnedFile("f.parquet", "x/f.parquet", len(BODY), hashlib.sha256(BODY).hexdigest())


def _left(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_fetched_once_verified_and_renamed_into_place(tmp_path: Path):
    with loopback_mirror({PIN.name: BODY}) as m:
        got = fetch.ensure(PIN, tmp_path / "cache", m.url, timeout_s=10)
        assert got.read_bytes() == BODY and _left(tmp_path / "cache") == [PIN.name]
        fetch.ensure(PIN, tmp_path / "cache", m.url, timeout_s=10)
        assert m.hits == {PIN.name: 1}  # the second call reads the verified copy


def test_one_changed_byte_is_refused_and_deleted(tmp_path: Path):
    bad = bytearray(BODY)
    bad[1000] ^= 1
    with loopback_mirror({PIN.name: bytes(bad)}) as m, pytest.raises(fetch.FetchError) as err:
        fetch.ensure(PIN, tmp_path, m.url, timeout_s=10)
    msg = str(err.value)
    assert "\n" not in msg and "fails its checksum" in msg and PIN.sha256 in msg
    assert hashlib.sha256(bad).hexdigest() in msg and f"{m.url}/{PIN.name}" in msg
    assert _left(tmp_path) == []


@pytest.mark.parametrize("mode", ["truncate", "hang"])
def test_a_truncated_or_hung_download_leaves_nothing(tmp_path: Path, mode: str):
    with loopback_mirror({PIN.name: BODY}) as m:
        m.mode = mode
        with pytest.raises(fetch.FetchError) as err:
            fetch.ensure(PIN, tmp_path, m.url, timeout_s=1)
    msg = str(err.value)
    assert "\n" not in msg and PIN.name in msg and str(tmp_path) in msg
    assert ("no data for 1 s" in msg) if mode == "hang" else ("bytes" in msg)
    assert _left(tmp_path) == []


def test_no_server_says_where_to_put_the_file_by_hand(tmp_path: Path):
    with loopback_mirror({}) as m:
        url = m.url
    with pytest.raises(fetch.FetchError) as err:  # the server is gone: connection refused
        fetch.ensure(PIN, tmp_path / "cache", url, timeout_s=5)
    msg = str(err.value)
    assert "\n" not in msg and f"{url}/{PIN.name}" in msg and f"put it in {tmp_path / 'cache'}" in msg
    assert _left(tmp_path / "cache") == []


def test_offline_machine_never_tries_the_internet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(fetch.urllib.request, "urlopen", lambda *a, **k: pytest.fail("network tried"))
    pinned = PINNED["test.id.parquet"]
    with pytest.raises(fetch.FetchError) as err:
        fetch.ensure(pinned, tmp_path, timeout_s=5)
    msg = str(err.value)
    assert "HF_HUB_OFFLINE" in msg and pinned.url in msg and str(tmp_path) in msg
    assert pinned.url.startswith("https://raw.githubusercontent.com/ElliottYan/LUFFY/01f4ae0")


def test_a_bad_file_already_there_is_never_used(tmp_path: Path):
    (tmp_path / PIN.name).write_bytes(BODY[:-1] + b"x")
    with loopback_mirror({PIN.name: BODY}) as m, pytest.raises(fetch.FetchError) as err:
        fetch.ensure(PIN, tmp_path, m.url, timeout_s=10)
    assert f"{tmp_path / PIN.name} is not the official" in str(err.value) and "delete it" in str(err.value)
    assert m.hits == {}  # not replaced behind the user's back


def test_concurrent_fetches_download_once(tmp_path: Path):
    errors: list[BaseException] = []
    with loopback_mirror({PIN.name: BODY}) as m:

        def one() -> None:
            try:
                assert fetch.ensure(PIN, tmp_path, m.url, timeout_s=10).read_bytes() == BODY
            except BaseException as err:  # noqa: BLE001 (reported below)
                errors.append(err)

        threads = [threading.Thread(target=one) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert not errors and m.hits == {PIN.name: 1} and _left(tmp_path) == [PIN.name]


def test_the_pins_match_the_shared_copies():
    folder = SHARED_DATA / "benchmarks"
    if not folder.is_dir():
        pytest.skip("../shared/data is absent")
    for pinned in PINNED.values():
        assert fetch.mismatch(folder / pinned.name, pinned) is None, pinned.name


def test_the_default_folder_is_the_per_user_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert benchmark_cache_dir() == tmp_path / "exgrpo" / "benchmarks"
    monkeypatch.setenv("XDG_CACHE_HOME", "")
    assert benchmark_cache_dir() == Path("~/.cache/exgrpo/benchmarks").expanduser()
    assert resolve_data_dir("${oc.env:XDG_CACHE_HOME,'~/.cache'}/exgrpo/benchmarks") == str(
        benchmark_cache_dir()
    )
    assert resolve_data_dir("") == ""


def test_a_mirror_without_the_file_and_an_unwritable_cache_are_one_line(tmp_path: Path):
    with loopback_mirror({}) as m, pytest.raises(fetch.FetchError, match=r"HTTP 404") as err:
        fetch.ensure(PIN, tmp_path / "a", m.url, timeout_s=5)
    assert "\n" not in str(err.value) and _left(tmp_path / "a") == []
    (tmp_path / "file").write_text("")  # a file where the cache folder should be
    with pytest.raises(fetch.FetchError, match=r"cannot fetch f.parquet into .*file/sub"):
        fetch.ensure(PIN, tmp_path / "file" / "sub", "http://127.0.0.1:9", timeout_s=5)
