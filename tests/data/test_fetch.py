"""data/fetch.py against a loopback mirror: a pinned file is downloaded once, verified, readable
by the other users of a shared folder, and every failure (a changed byte, a truncated body, a hung
server, no server, a reply that is not HTTP, an offline machine, a bad or unreadable file already
there) is one line that names the file and leaves nothing in the folder; the fetch lock is a file
opened for writing, and a file system without locks fetches unlocked, with a warning."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import stat
import threading
from pathlib import Path
from typing import NoReturn

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


@pytest.mark.parametrize("mode", ["truncate", "hang", "chunked-cut", "not-http"])
def test_a_truncated_or_hung_download_leaves_nothing(tmp_path: Path, mode: str):
    with loopback_mirror({PIN.name: BODY}) as m:
        m.mode = mode
        with pytest.raises(fetch.FetchError) as err:
            fetch.ensure(PIN, tmp_path, m.url, timeout_s=1)
    msg = str(err.value)
    assert "\n" not in msg and PIN.name in msg and str(tmp_path) in msg
    expect = {"hang": "no data for 1 s", "chunked-cut": "IncompleteRead", "not-http": "not an HTTP reply"}
    assert expect.get(mode, "bytes") in msg and f"{m.url}/{PIN.name}" in msg
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


@pytest.mark.parametrize("umask", [0o022, 0o002], ids=["umask-022", "umask-002"])
def test_the_fetched_file_has_the_mode_of_any_new_file(tmp_path: Path, umask: int):
    old = os.umask(umask)
    try:
        with loopback_mirror({PIN.name: BODY}) as m:
            got = fetch.ensure(PIN, tmp_path, m.url, timeout_s=10)
    finally:
        os.umask(old)
    assert stat.S_IMODE(got.stat().st_mode) == 0o666 & ~umask  # not mkstemp's 0600


def test_an_unreadable_file_already_there_is_one_line(tmp_path: Path):
    class Unreadable(type(tmp_path)):  # type: ignore[misc]  (root reads any file: refuse by hand)
        def open(self, *args: object, **kwargs: object) -> NoReturn:  # type: ignore[override]
            raise PermissionError(errno.EACCES, "Permission denied", str(self))

    (tmp_path / PIN.name).write_bytes(BODY)
    with pytest.raises(fetch.FetchError) as err:
        fetch.ensure(PIN, Unreadable(tmp_path), "http://127.0.0.1:9", timeout_s=5)
    msg = str(err.value)
    assert "\n" not in msg and f"cannot read {tmp_path / PIN.name}" in msg and "Permission denied" in msg


def test_the_lock_is_a_file_opened_for_writing_and_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    locked: list[tuple[int, int]] = []  # (file type, access mode) of each locked fd
    real = fcntl.flock

    def flock(fd: int, op: int) -> None:
        if op == fcntl.LOCK_EX:  # NFSv4 grants an exclusive lock only to a writable fd of a file
            locked.append((stat.S_IFMT(os.fstat(fd).st_mode), fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE))
        real(fd, op)

    monkeypatch.setattr(fetch.fcntl, "flock", flock)
    with loopback_mirror({PIN.name: BODY}) as m:
        fetch.ensure(PIN, tmp_path, m.url, timeout_s=10)
    assert locked == [(stat.S_IFREG, os.O_RDWR)] and _left(tmp_path) == [PIN.name]


@pytest.mark.parametrize("code", [errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP], ids=errno.errorcode.get)
def test_a_file_system_without_locks_fetches_unlocked_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], code: int
):
    def flock(fd: int, op: int) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(fetch.fcntl, "flock", flock)
    with loopback_mirror({PIN.name: BODY}) as m:
        assert fetch.ensure(PIN, tmp_path, m.url, timeout_s=10).read_bytes() == BODY
    err = capsys.readouterr().err
    assert f"cannot lock {tmp_path / fetch.LOCK_FILE} ({os.strerror(code)})" in err and "no file locks" in err
    assert _left(tmp_path) == [PIN.name]


def test_a_lock_that_fails_otherwise_stops_the_fetch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    def flock(fd: int, op: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(fetch.fcntl, "flock", flock)
    with pytest.raises(fetch.FetchError, match=r"cannot fetch f.parquet into .* \(Input/output error\)"):
        fetch.ensure(PIN, tmp_path, "http://127.0.0.1:9", timeout_s=5)
