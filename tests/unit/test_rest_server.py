"""The REST backend server of one operation (storage/rest_server.py, started as a child
process by storage/rest_process.py, here on this machine's loopback): object names,
the operation's policy, credentials, and nothing answered once the operation is over.
A tenant who somehow reached it (another operation's credential, names with ``..``,
planted symlinks) gets refusals and no file outside the repository."""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import os
import re
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuyard.storage.lock_journal import remove_orphaned_locks
from gpuyard.storage.rest_objects import Mode, Policy, Refused, Target, object_path, parse_path
from gpuyard.storage.rest_process import RestServer
from gpuyard.storage.rest_server import RepositoryState

KEY = b'{"kdf":"scrypt","only":"this operation"}'
KEY_NAME = hashlib.sha256(KEY).hexdigest()


def name_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    for kind in ("keys", "locks", "snapshots", "index"):
        (root / kind).mkdir(parents=True)
    for i in range(256):
        (root / "data" / f"{i:02x}").mkdir(parents=True)
    (root / "config").write_bytes(b"config-bytes")
    (root / "keys" / ("a" * 64)).write_bytes(b"the repository's own key")
    blob = b"pack contents"
    (root / "data" / name_of(blob)[:2] / name_of(blob)).write_bytes(blob)
    (tmp_path / "outside").write_bytes(b"not the repository's")
    return root


def started(root: Path, mode: Mode) -> RestServer:
    server = RestServer(root, mode, {KEY_NAME: KEY})
    server.start()
    server.listen(None)  # this machine's loopback
    return server


@pytest.fixture
def backup(repo: Path) -> Iterator[RestServer]:
    server = started(repo, Mode.BACKUP)
    yield server
    server.close()


def request(
    server: RestServer,
    method: str,
    path: str,
    body: bytes | None = None,
    *,
    user: str | None = None,
    password: str | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, bytes]:
    assert server.port is not None
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    credential = f"{user or server.user}:{password or server.password}".encode()
    sent = {"Authorization": "Basic " + base64.b64encode(credential).decode(), **(headers or {})}
    conn.request(method, path, body=body, headers=sent)
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response.status, data


# -- names and paths (pure) ----------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        "/data/../config",
        "/data/..%2fconfig",
        "/keys/" + "A" * 64,
        "/keys/" + "a" * 63,
        "/keys/" + "a" * 65,
        "/snapshots/" + "g" * 64,
        "/index/.." + "a" * 62,
        "/locks/" + "a" * 64 + "/x",
        "/data/ab/" + "a" * 64,
        "//etc/passwd",
        "/etc/passwd",
        "/config/../../etc/passwd",
        "/data/" + "a" * 64 + "?x=1",
        "/../repo/config",
        "/keys",
        "",
    ],
)
def test_paths_that_are_not_objects_are_refused(raw: str) -> None:
    with pytest.raises(Refused) as caught:
        parse_path(raw)
    assert caught.value.status in (400, 404)


def test_object_paths_stay_under_the_root(tmp_path: Path) -> None:
    name = "0f" + "1" * 62
    assert object_path(tmp_path, parse_path(f"/data/{name}")) == tmp_path / "data" / "0f" / name
    assert object_path(tmp_path, parse_path(f"/locks/{name}")) == tmp_path / "locks" / name
    assert object_path(tmp_path, parse_path("/config")) == tmp_path / "config"
    with pytest.raises(Refused):
        object_path(tmp_path, Target("data", "../x"))
    assert parse_path("/data/").is_listing


@pytest.mark.parametrize(
    ("mode", "method", "path", "allowed"),
    [
        (Mode.BACKUP, "POST", "/data/" + "a" * 64, True),
        (Mode.BACKUP, "POST", "/config", False),
        (Mode.BACKUP, "POST", "/keys/" + "a" * 64, False),
        (Mode.BACKUP, "DELETE", "/keys/" + "a" * 64, False),
        (Mode.BACKUP, "DELETE", "/data/" + "a" * 64, False),
        (Mode.BACKUP, "DELETE", "/snapshots/" + "a" * 64, False),
        (Mode.BACKUP, "DELETE", "/index/" + "a" * 64, False),
        (Mode.BACKUP, "POST", "/?create=true", False),
        (Mode.BACKUP, "POST", "/data/", False),
        (Mode.RESTORE, "POST", "/data/" + "a" * 64, False),
        (Mode.RESTORE, "POST", "/snapshots/" + "a" * 64, False),
        (Mode.RESTORE, "POST", "/locks/" + "a" * 64, True),
        (Mode.RESTORE, "GET", "/data/" + "a" * 64, True),
        (Mode.RESTORE, "PUT", "/data/" + "a" * 64, False),
    ],
)
def test_the_policy_of_each_operation(mode: Mode, method: str, path: str, allowed: bool) -> None:
    policy = Policy(mode)
    if allowed:
        policy.check(method, parse_path(path))
    else:
        with pytest.raises(Refused) as caught:
            policy.check(method, parse_path(path))
        assert caught.value.status in (403, 405)


# -- the server ----------------------------------------------------------------------


def test_restic_requests_are_served(backup: RestServer, repo: Path) -> None:
    assert request(backup, "GET", "/config") == (200, b"config-bytes")
    status, _ = request(backup, "HEAD", "/config")
    assert status == 200
    # Only the operation's key exists for the client; the repository's own is hidden.
    status, body = request(
        backup, "GET", "/keys/", headers={"Accept": "application/vnd.x.restic.rest.v2"}
    )
    assert status == 200 and json.loads(body) == [{"name": KEY_NAME, "size": len(KEY)}]
    assert request(backup, "GET", f"/keys/{KEY_NAME}") == (200, KEY)
    assert request(backup, "GET", "/keys/" + "a" * 64)[0] == 404
    blob = b"pack contents"
    assert request(backup, "GET", "/data/")[1] == json.dumps([name_of(blob)]).encode()
    assert request(backup, "GET", f"/data/{name_of(blob)}", headers={"Range": "bytes=5-8"}) == (
        206,
        b"cont",
    )
    new = os.urandom(3000)
    assert request(backup, "POST", f"/index/{name_of(new)}", new)[0] == 200
    assert (repo / "index" / name_of(new)).read_bytes() == new
    # The same object again changes nothing; one whose content is not its name is refused.
    assert request(backup, "POST", f"/index/{name_of(new)}", new)[0] == 200
    assert request(backup, "POST", "/index/" + "b" * 64, new)[0] == 400
    assert not (repo / "index" / ("b" * 64)).exists()
    assert sorted(p.name for p in repo.iterdir() if p.name.startswith(".gy-upload-")) == []


def test_another_operations_credential_is_refused(backup: RestServer, repo: Path) -> None:
    other = started(repo, Mode.BACKUP)
    try:
        assert request(backup, "GET", "/config", user=other.user, password=other.password)[0] == 401
        assert request(backup, "GET", "/config", password="guess")[0] == 401
        assert request(other, "GET", "/config")[0] == 200
    finally:
        other.close()


def test_names_with_traversal_never_reach_a_file(backup: RestServer, repo: Path) -> None:
    for path in ("/data/../config", "/keys/../../outside", "/locks/..%2F..%2Foutside"):
        status, body = request(backup, "GET", path)
        assert status in (400, 404) and b"not the repository" not in body
    assert request(backup, "POST", "/snapshots/../../outside", b"x")[0] in (400, 404)
    assert (repo.parent / "outside").read_bytes() == b"not the repository's"


def test_a_planted_symlink_in_the_repository_is_not_followed(
    backup: RestServer, repo: Path
) -> None:
    name = "c" * 64
    os.symlink(repo.parent / "outside", repo / "snapshots" / name)
    status, body = request(backup, "GET", f"/snapshots/{name}")
    assert status == 404 and b"not the repository" not in body


def planted_data_link(repo: Path, prefix: str, holding: str | None = None) -> Path:
    """Replace ``data/<prefix>`` with a link to a directory outside the repository
    (holding a file named ``holding``, if given); that directory."""
    elsewhere = repo.parent / "elsewhere"
    elsewhere.mkdir()
    if holding is not None:
        (elsewhere / holding).write_bytes(b"not the repository's")
    os.rmdir(repo / "data" / prefix)
    os.symlink(elsewhere, repo / "data" / prefix)
    return elsewhere


def test_a_planted_symlink_for_a_directory_is_not_followed(backup: RestServer, repo: Path) -> None:
    # data/ab -> a directory outside, holding a file of the name asked for.
    name = "ab" + "d" * 62
    planted_data_link(repo, "ab", holding=name)
    status, body = request(backup, "GET", f"/data/{name}")
    assert status == 404 and b"not the repository" not in body


def test_an_upload_into_a_planted_directory_link_lands_nowhere(
    backup: RestServer, repo: Path
) -> None:
    # data/xx -> a directory outside: the object must not be written there.
    data = b"any content: its name is checked against it"
    name = name_of(data)
    elsewhere = planted_data_link(repo, name[:2])
    assert request(backup, "POST", f"/data/{name}", data)[0] == 404
    assert os.listdir(elsewhere) == []
    assert not [n for n in os.listdir(repo) if n.startswith(".gy-upload-")]


def test_a_listing_does_not_follow_a_planted_directory_link(backup: RestServer, repo: Path) -> None:
    name = "ab" + "e" * 62
    planted_data_link(repo, "ab", holding=name)
    status, body = request(backup, "GET", "/data/")
    assert status == 200 and name.encode() not in body


def test_a_lock_delete_through_a_planted_link_removes_nothing(repo: Path) -> None:
    server = started(repo, Mode.RESTORE)
    try:
        mine = b"my lock"
        assert request(server, "POST", f"/locks/{name_of(mine)}", mine)[0] == 200
        # locks/ swapped for a link to a directory holding a file of the same name.
        elsewhere = repo.parent / "elsewhere"
        elsewhere.mkdir()
        (elsewhere / name_of(mine)).write_bytes(b"not the repository's")
        os.rename(repo / "locks", repo.parent / "locks-moved")
        os.symlink(elsewhere, repo / "locks")
        assert request(server, "DELETE", f"/locks/{name_of(mine)}")[0] == 404
        assert (elsewhere / name_of(mine)).exists()
    finally:
        os.unlink(repo / "locks")
        os.rename(repo.parent / "locks-moved", repo / "locks")
        server.close()


def test_only_its_own_locks_are_deleted_and_leftovers_go_at_the_end(repo: Path) -> None:
    server = started(repo, Mode.RESTORE)
    mine, theirs = b"my lock", b"someone else's lock"
    (repo / "locks" / name_of(theirs)).write_bytes(theirs)
    assert request(server, "POST", f"/locks/{name_of(mine)}", mine)[0] == 200
    assert request(server, "DELETE", f"/locks/{name_of(theirs)}")[0] == 403
    assert request(server, "DELETE", f"/locks/{name_of(mine)}")[0] == 200
    left = b"a lock the helper never removed"
    assert request(server, "POST", f"/locks/{name_of(left)}", left)[0] == 200
    server.close()
    assert server.locks_removed == [name_of(left)]
    assert sorted(os.listdir(repo / "locks")) == [name_of(theirs)]


def test_nothing_is_answered_once_the_operation_is_over(repo: Path) -> None:
    server = started(repo, Mode.BACKUP)
    assert request(server, "GET", "/config")[0] == 200
    server.close()
    with pytest.raises(OSError):
        request(server, "GET", "/config")


def test_a_server_never_told_where_to_listen_listens_nowhere(repo: Path) -> None:
    # The helper was never made (its creation failed): the operation ends before
    # listen(). The child must not fall back to this machine's own namespace.
    server = RestServer(repo, Mode.BACKUP, {KEY_NAME: KEY})
    server.start()
    server.close()
    assert server.exit_code == 1
    assert server.port is None


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/keys/" + "b" * 64),  # a backup adds no key: 403
        ("POST", "/data/../config"),  # not an object name: 404
        ("PUT", "/config"),  # 405
    ],
)
def test_a_refused_body_is_never_read_as_the_next_request(
    backup: RestServer, method: str, path: str
) -> None:
    assert backup.port is not None
    credential = base64.b64encode(f"{backup.user}:{backup.password}".encode()).decode()
    auth = f"Authorization: Basic {credential}\r\n"
    # The refused request's body is itself a request: read as the next one, it would
    # be answered (a listing) before the GET that follows.
    smuggled = f"GET /snapshots/ HTTP/1.1\r\n{auth}\r\n".encode()
    refused = (
        f"{method} {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: {len(smuggled)}\r\n\r\n"
    )
    then = f"GET /config HTTP/1.1\r\nHost: x\r\n{auth}\r\n"
    with socket.create_connection(("127.0.0.1", backup.port), timeout=10) as conn:
        conn.sendall(refused.encode() + smuggled + then.encode())
        got = b""
        while not got.endswith(b"config-bytes"):
            chunk = conn.recv(65536)
            if not chunk:
                break
            got += chunk
    statuses = re.findall(rb"HTTP/1\.1 (\d{3}) ", got)
    assert statuses[0] in (b"403", b"404", b"405")
    assert statuses[1:] == [b"200"] and got.endswith(b"config-bytes"), got


def test_uploads_cut_off_by_a_killed_server_are_swept_at_the_next_start(repo: Path) -> None:
    old, fresh = repo / ".gy-upload-0123456789abcdef", repo / ".gy-upload-fedcba9876543210"
    old.write_bytes(b"half a pack")
    fresh.write_bytes(b"another operation's upload, right now")
    os.utime(old, (time.time() - 2 * 3600, time.time() - 2 * 3600))
    server = started(repo, Mode.BACKUP)
    try:
        assert not old.exists()
        assert fresh.exists()
    finally:
        server.close()


def test_a_lock_written_as_the_operation_ends_does_not_outlive_it(repo: Path) -> None:
    state = RepositoryState(repo, "u", "p", Mode.BACKUP, {})
    (repo / "locks").mkdir(exist_ok=True)
    first, late = repo / "locks" / ("a" * 64), repo / "locks" / ("b" * 64)
    assert state.place_lock(first.name, first.touch)
    assert state.close() == [first.name]
    assert not first.exists()
    assert not state.place_lock(late.name, late.touch)
    assert not late.exists()  # never placed


def test_a_lock_being_placed_as_the_server_closes_is_deleted(repo: Path) -> None:
    """close() from another thread while a lock is being linked into place waits for
    it and deletes it: no instant lets a placed lock escape the server's notice."""
    state = RepositoryState(repo, "u", "p", Mode.BACKUP, {})
    (repo / "locks").mkdir(exist_ok=True)
    lock = repo / "locks" / ("c" * 64)
    placing, go_on = threading.Event(), threading.Event()

    def place() -> None:
        placing.set()
        go_on.wait(5)
        lock.touch()

    placer = threading.Thread(target=state.place_lock, args=(lock.name, place))
    placer.start()
    assert placing.wait(5)
    closed: list[list[str]] = []
    closer = threading.Thread(target=lambda: closed.append(state.close()))
    closer.start()
    closer.join(0.1)
    assert closer.is_alive()  # waits for the placing to end
    go_on.set()
    placer.join(5)
    closer.join(5)
    assert closed == [[lock.name]]
    assert not lock.exists()


def test_locks_of_a_server_killed_with_sigkill_go_while_a_live_ones_stay(repo: Path) -> None:
    """A server killed with SIGKILL cannot delete restic's locks; its journal names
    them, so the next server on the repository (or gpuyard's unlock) removes them,
    while the locks of a server still running are left alone."""
    killed, live = started(repo, Mode.BACKUP), started(repo, Mode.BACKUP)
    theirs, ours = b"a killed operation's lock", b"a live operation's lock"
    try:
        assert request(killed, "POST", f"/locks/{name_of(theirs)}", theirs)[0] == 200
        assert request(live, "POST", f"/locks/{name_of(ours)}", ours)[0] == 200
        assert killed.pid is not None
        os.kill(killed.pid, signal.SIGKILL)
        killed.close()
        assert (repo / "locks" / name_of(theirs)).exists()  # nothing deleted it yet
        assert remove_orphaned_locks(repo) == [name_of(theirs)]
        assert not (repo / "locks" / name_of(theirs)).exists()
        assert (repo / "locks" / name_of(ours)).exists()
        assert remove_orphaned_locks(repo) == []
    finally:
        live.close()
    assert not (repo / "locks" / name_of(ours)).exists()  # deleted by its server
    assert not [p for p in repo.iterdir() if p.name.startswith(".gy-")]  # no journal left


def test_the_next_server_removes_what_a_killed_one_left(repo: Path) -> None:
    killed = started(repo, Mode.BACKUP)
    lock = b"left by a killed server"
    assert request(killed, "POST", f"/locks/{name_of(lock)}", lock)[0] == 200
    assert killed.pid is not None
    os.kill(killed.pid, signal.SIGKILL)
    killed.close()
    server = started(repo, Mode.RESTORE)
    try:
        assert not (repo / "locks" / name_of(lock)).exists()
    finally:
        server.close()


def test_sigterm_with_the_end_of_stdin_ends_the_server_and_its_locks(repo: Path) -> None:
    """The parent's death sends SIGTERM and ends the child's stdin at the same
    moment; either way the child deletes its locks and exits, however the two meet."""
    for attempt in range(10):
        server = started(repo, Mode.BACKUP)
        lock = f"lock {attempt}".encode()
        assert request(server, "POST", f"/locks/{name_of(lock)}", lock)[0] == 200
        pid = server.pid
        assert pid is not None
        os.kill(pid, signal.SIGTERM)
        server.close()  # ends its stdin; waits for it (killed after a few seconds)
        assert server.exit_code == 0, attempt
        assert server.locks_removed == [name_of(lock)]
        assert not (repo / "locks" / name_of(lock)).exists()
