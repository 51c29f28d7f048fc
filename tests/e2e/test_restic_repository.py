"""ResticRepository against real restic: a local directory repository and an S3 one
(moto's server on loopback). Streams round-trip byte for byte, de-duplication works,
and neither a failing source nor a restic killed mid-backup leaves a snapshot or a
repository that does not check clean."""

from __future__ import annotations

import hashlib
import io
import json
import os
import secrets
import signal
import stat
import subprocess
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuyard.storage.restic import INSTALL_HINT, ResticError, ResticRepository
from gpuyard.storage.restic_keys import FAST_PARAMS
from gpuyard.storage.tar_stats import TarCounter, counted
from tests.moto_s3 import S3_ENV, make_bucket, moto_s3, moto_server_path
from tests.required_parts import need, needs_tools

pytestmark = [
    pytest.mark.e2e,
    needs_tools("restic", how="apt-get install restic"),
]

FILES = 96
FILE_SIZE = 512 * 1024  # a 48 MiB stream; one file is 1% of it
CHUNK = 256 * 1024


def make_tar(files: list[bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        root = tarfile.TarInfo(".")
        root.type = tarfile.DIRTYPE
        tar.addfile(root)
        for i, data in enumerate(files):
            info = tarfile.TarInfo(f"./data/file-{i:03d}.bin")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def chunks_of(data: bytes, size: int = CHUNK) -> Iterator[bytes]:
    for pos in range(0, len(data), size):
        yield data[pos : pos + size]


def sha256_of(chunks: Iterator[bytes]) -> tuple[str, int]:
    digest, total = hashlib.sha256(), 0
    for chunk in chunks:
        digest.update(chunk)
        total += len(chunk)
    return digest.hexdigest(), total


def local_repository(tmp_path: Path) -> ResticRepository:
    return ResticRepository(
        str(tmp_path / "repo"), tmp_path / "secrets" / "snapshot.password", tmp_path / "cache"
    )


@pytest.fixture
def repo(tmp_path: Path) -> ResticRepository:
    return local_repository(tmp_path)


@pytest.fixture(scope="module")
def volume_files() -> list[bytes]:
    return [os.urandom(FILE_SIZE) for _ in range(FILES)]


def test_ensure_makes_a_private_password_and_the_repository_once(tmp_path: Path) -> None:
    # Two repositories (two "processes") race on a fresh installation.
    a, b = local_repository(tmp_path), local_repository(tmp_path)
    errors: list[BaseException] = []

    def run(r: ResticRepository) -> None:
        try:
            r.ensure()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(r,)) for r in (a, b, a)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    password = tmp_path / "secrets" / "snapshot.password"
    assert stat.S_IMODE(password.stat().st_mode) == 0o600
    assert stat.S_IMODE(password.parent.stat().st_mode) == 0o700
    assert [p.name for p in password.parent.iterdir()] == ["snapshot.password"]
    assert len(password.read_text().strip()) >= 43
    assert (tmp_path / "repo" / "config").is_file()
    assert a.exists() and b.exists()
    assert not (tmp_path / ".cache").exists()
    a.ensure()  # cheap and idempotent
    assert a.find_by_tag("nothing") == []

    # Never initialised over: the same repository with another password is refused,
    # and neither password shows in the error.
    other_password = tmp_path / "other.password"
    other_password.write_text("not the password\n")
    other = ResticRepository(str(tmp_path / "repo"), other_password, tmp_path / "cache")
    with pytest.raises(ResticError, match="wrong password") as caught:
        other.ensure()
    text = f"{caught.value.message} {caught.value.details}"
    assert password.read_text().strip() not in text and "not the password" not in text

    missing = ResticRepository(
        str(tmp_path / "repo2"), tmp_path / "p", tmp_path / "cache", binary="restic-not-here"
    )
    with pytest.raises(ResticError, match="apt-get install restic") as caught:
        missing.ensure()
    assert caught.value.message == INSTALL_HINT


def _keys(root: Path) -> dict[str, dict[str, object]]:
    return {p.name: json.loads(p.read_bytes()) for p in (root / "keys").iterdir()}


def _restic(root: Path, password: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = ["restic", "-r", str(root), "--password-file", str(password), "--no-cache", *args]
    return subprocess.run(argv, capture_output=True, text=True, check=True)


def test_a_local_repository_is_made_with_one_cheap_key_restic_opens(tmp_path: Path) -> None:
    repo = local_repository(tmp_path)
    repo.ensure()
    root, password = tmp_path / "repo", tmp_path / "secrets" / "snapshot.password"
    keys = _keys(root)
    # Made here (storage/restic_init.py), not by restic init: its only key is the cheap one.
    [(fast, doc)] = keys.items()
    assert (doc["N"], doc["r"], doc["p"]) == FAST_PARAMS
    # restic opens it when hinted and without the hint (it tries every key).
    for hint in (["--key-hint", fast], []):
        listed = json.loads(_restic(root, password, *hint, "key", "list", "--json").stdout)
        assert [k["id"] for k in listed if k["current"]] == [fast[:8]]
    assert _restic(root, password, "check").returncode == 0
    # Another process on the same repository finds that key; it makes none of its own.
    again = local_repository(tmp_path)
    again.ensure()
    result = again.backup_stream([b"x" * 1000], filename="v.tar", tags=["t"], host="h")
    with again.dump_stream(result.restic_id, "v.tar") as chunks:
        assert b"".join(chunks) == b"x" * 1000
    assert _keys(root).keys() == keys.keys()


def test_a_repository_restic_made_gets_a_fast_key_beside_its_own(tmp_path: Path) -> None:
    # As earlier versions made them: restic init, with restic's calibrated key.
    root, password = tmp_path / "repo", tmp_path / "secrets" / "snapshot.password"
    password.parent.mkdir(mode=0o700)
    password.write_text(secrets.token_urlsafe(32))
    password.chmod(0o600)
    _restic(root, password, "init", "--repository-version", "2")
    [own] = _keys(root)
    repo = local_repository(tmp_path)
    repo.ensure()
    keys = _keys(root)
    fast = [name for name, doc in keys.items() if (doc["N"], doc["r"], doc["p"]) == FAST_PARAMS]
    assert len(fast) == 1 and set(keys) == {own, fast[0]}
    # Either key opens it (nothing but the hint changes for an operator's restic).
    for key in (fast[0], own):
        listed = json.loads(
            _restic(root, password, "--key-hint", key, "key", "list", "--json").stdout
        )
        assert [k["id"] for k in listed if k["current"]] == [key[:8]]
    assert repo.find_by_tag("nothing") == []


def test_a_persons_password_keeps_only_restics_stretched_key(tmp_path: Path) -> None:
    password = tmp_path / "chosen.password"
    password.write_text("correct horse battery staple\n")
    repo = ResticRepository(str(tmp_path / "repo"), password, tmp_path / "cache")
    repo.ensure()
    assert repo.find_by_tag("nothing") == []
    [doc] = _keys(tmp_path / "repo").values()
    assert (doc["N"], doc["r"], doc["p"]) != FAST_PARAMS


def test_exists_creates_nothing(tmp_path: Path) -> None:
    repo = local_repository(tmp_path)
    assert not repo.exists()
    assert not (tmp_path / "repo").exists() and not (tmp_path / "secrets").exists()


def test_round_trip_dedup_and_forget(repo: ResticRepository, volume_files: list[bytes]) -> None:
    first = make_tar(volume_files)
    counter = TarCounter()
    result = repo.backup_stream(
        counted(chunks_of(first), counter), filename="volume.tar", tags=["snap:a"], host="gy1"
    )
    assert len(result.restic_id) == 64 and result.restic_id.startswith(result.short_id)
    assert result.total_bytes == len(first)
    assert result.data_added > len(first) // 2  # random data: no compression to speak of
    assert (counter.file_count, counter.content_bytes) == (FILES, FILES * FILE_SIZE)

    with repo.dump_stream(result.restic_id, "volume.tar") as chunks:
        assert sha256_of(chunks) == (hashlib.sha256(first).hexdigest(), len(first))

    # The last file changes: restic's content-defined chunks before the one it starts
    # in stay the same, and no chunk exceeds 8 MiB, so at most 8.5 MiB are new whatever
    # chunk boundaries this repository's random polynomial gives.
    changed = list(volume_files)
    changed[-1] = os.urandom(FILE_SIZE)
    second = repo.backup_stream(
        chunks_of(make_tar(changed), 100_000), filename="volume.tar", tags=["snap:b"], host="gy1"
    )
    assert second.data_added < 0.2 * result.data_added, (second, result)

    [found] = repo.find_by_tag("snap:a")
    assert (found.restic_id, found.short_id, found.tags) == (
        result.restic_id,
        result.short_id,
        ("snap:a",),
    )
    assert repo.stats_raw_size() >= result.data_added

    # A failed dump raises after its last chunk, so no consumer takes it for whole.
    with (
        pytest.raises(ResticError, match="dump failed"),
        repo.dump_stream(result.restic_id, "other.tar") as chunks,
    ):
        list(chunks)
    with (
        pytest.raises(ResticError, match="dump failed"),
        repo.dump_stream("0" * 64, "volume.tar") as chunks,
    ):
        list(chunks)
    # Leaving a dump early stops restic, which leaves no lock behind.
    with repo.dump_stream(second.restic_id, "volume.tar", chunk_size=1000) as chunks:
        assert len(next(chunks)) == 1000
    assert not any((Path(repo.location) / "locks").iterdir())

    gone = "f" * 64  # forgetting what is not there is no error
    repo.forget([result.restic_id, second.restic_id, gone], prune=True)
    assert repo.find_by_tag("snap:a") == []
    assert repo.stats_raw_size() < FILE_SIZE
    assert repo.check().ok


def test_a_failing_source_commits_nothing(repo: ResticRepository) -> None:
    def source() -> Iterator[bytes]:
        for _ in range(32):  # 8 MiB, half a pack: restic is killed before writing one
            yield os.urandom(CHUNK)
        raise RuntimeError("the engine's stream broke")

    with pytest.raises(RuntimeError, match="stream broke"):
        repo.backup_stream(source(), filename="volume.tar", tags=["snap:x"], host="gy1")
    assert repo.find_by_tag("snap:x") == []
    result = repo.recover_after_crash()
    assert result.ok and result.unreferenced_packs == 0, result.output


def test_restic_killed_mid_backup_is_recovered(repo: ResticRepository, tmp_path: Path) -> None:
    fed, release = threading.Event(), threading.Event()
    pids: list[int] = []
    failures: list[BaseException] = []

    def source() -> Iterator[bytes]:
        for _ in range(160):  # 40 MiB (restic 0.14 writes 16 MiB packs), then a stall
            yield os.urandom(CHUNK)
        fed.set()
        release.wait(30)
        yield os.urandom(CHUNK)

    def backup() -> None:
        try:
            repo.backup_stream(
                source(), filename="volume.tar", tags=["snap:k"], host="gy1", on_started=pids.append
            )
        except BaseException as exc:
            failures.append(exc)

    worker = threading.Thread(target=backup)
    worker.start()
    try:
        assert fed.wait(30)
        packs = tmp_path / "repo" / "data"
        deadline = time.monotonic() + 15
        while not any(packs.rglob("*")) or not any(p.is_file() for p in packs.rglob("*")):
            assert time.monotonic() < deadline, "restic wrote no pack"
            time.sleep(0.05)
        os.kill(pids[0], signal.SIGKILL)
    finally:
        release.set()
        worker.join(30)
    [failure] = failures
    assert isinstance(failure, ResticError) and "killed by signal 9" in failure.message

    assert any((tmp_path / "repo" / "locks").iterdir()), "the killed backup's lock stays"
    assert repo.find_by_tag("snap:k") == []
    before = repo.check()  # removes the stale lock to run; names the stray packs
    assert before.unreferenced_packs > 0, before.output

    result = repo.recover_after_crash()
    assert result.ok and result.unreferenced_packs == 0, result.output
    assert "not referenced" not in result.output


def test_tags_restic_would_split_are_refused(repo: ResticRepository) -> None:
    with pytest.raises(ValueError, match="commas"):
        repo.backup_stream([b""], filename="f", tags=["a,b"], host="h")
    with pytest.raises(ValueError, match="snapshot id"):
        repo.forget(["--remove-all"])


# -- S3 (moto) -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    need(
        "moto_server",
        None if moto_server_path() else "moto_server is not installed",
        how="pip install 'moto[server]' (make venv)",
    )
    with moto_s3(tmp_path_factory.mktemp("moto")) as endpoint:
        yield endpoint


def test_s3_round_trip(s3_endpoint: str, tmp_path: Path, volume_files: list[bytes]) -> None:
    make_bucket(s3_endpoint, "gpuyard-snapshots")
    env = {"PATH": os.environ.get("PATH", os.defpath), **S3_ENV}
    repo = ResticRepository(
        f"s3:{s3_endpoint}/gpuyard-snapshots/repo",
        tmp_path / "snapshot.password",
        tmp_path / "cache",
        env=env,
    )
    assert not repo.exists()
    repo.ensure()
    assert repo.exists()
    archive = make_tar(volume_files[:6])
    result = repo.backup_stream(chunks_of(archive), filename="volume.tar", tags=["s3"], host="gy")
    assert result.total_bytes == len(archive)
    with repo.dump_stream(result.restic_id, "volume.tar") as chunks:
        assert sha256_of(chunks) == (hashlib.sha256(archive).hexdigest(), len(archive))
    assert [s.restic_id for s in repo.find_by_tag("s3")] == [result.restic_id]
    assert repo.check(read_data=True).ok
