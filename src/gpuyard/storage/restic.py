"""The snapshot repository: restic, run as a subprocess. The only module that runs restic.

A repository is any restic repository string: a local directory or
``s3:http(s)://host[:port]/bucket/prefix`` (credentials from the environment given to
:class:`ResticRepository`: ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_DEFAULT_REGION``, ...). Its password lives in a file of ours (0600), made on
first use; it is passed to restic as ``--password-file`` only, never on a command line,
in the environment, in a log line or in an error. The cache is ``--cache-dir`` of
ours, never ``~/.cache``. Repository locks are always taken (no ``--no-lock``): a
prune must never run beside a backup.

Streams are never buffered whole: a backup writes the chunks it is given to restic's
stdin while threads drain restic's stdout and stderr, and a dump yields restic's
stdout chunk by chunk. A backup whose chunks fail to come is killed with SIGKILL rather
than ended with EOF, since an EOF makes restic commit the truncated stream as a
snapshot. restic is started with a parent-death signal (SIGKILL, Linux), so it dies
with the server. (The kernel closes a dying process's pipes a moment before it sends
that signal; restic needs far longer than that moment to seal a snapshot after EOF.)

What a crash leaves, measured with restic 0.14.0 (Debian 12) on a local repository:

* ``restic backup --stdin`` killed with SIGKILL after reading about 300 MB of random
  data leaves no snapshot, its stale lock in ``locks/`` and the pack files it had
  written (16 packs, 277 MiB), which no index references. ``restic check`` then
  refuses to start (exit status 1)::

      unable to create lock in backend: repository is already locked by PID 3518 on vm
      by root (UID 0, GID 0)
      lock was created at ... (7.2s ago)
      storage ID 551f2bc9
      the `unlock` command can be used to remove stale locks

  ``forget`` and ``prune`` (exclusive locks too) refuse the same way; ``backup``,
  ``snapshots`` and ``stats`` (shared locks) still work beside a stale shared lock.
  Once the lock is removed (``restic unlock`` removes only stale locks: those of a dead
  process on this host, or older than 30 minutes), ``restic check`` exits 0 and says
  ``no errors were found``, but lists each leftover pack first::

      pack fa410ef7...: not referenced in any index
      ... (one line per pack)
      16 additional files were found in the repo, which likely contain duplicate data.
      This is non-critical, you can run `restic prune` to correct this.

  ``restic prune`` deletes them ("deleting unreferenced packs ... 16 / 16 files
  deleted"), after which ``check`` prints nothing but ``no errors were found``.
* A backup killed before it wrote a pack leaves only the stale lock.
* Not reproduced here (it needs a backup of tens of GB or ten minutes): a backup
  killed after restic saved an intermediate index leaves indexed but unused blobs,
  which ``check`` does not report; the next ``prune`` (every
  :meth:`ResticRepository.forget` runs one) reclaims them.

:meth:`ResticRepository.recover_after_crash` therefore unlocks, checks, and prunes when
the check is not clean or names unreferenced packs, then checks again. Every command
that takes the exclusive lock (``forget``, ``prune``, ``check``) also removes stale
locks and tries once more when it finds the repository locked, so one killed process
cannot wedge the repository; a lock held by a live process raises
:class:`ResticLocked`. restic in a helper container names the helper's host name and
PID in its lock, so restic cannot tell that one is stale: the REST backend servers
journal the locks they place, and :meth:`ResticRepository.unlock` also removes those
whose server is gone (storage/lock_journal.py).

restic 0.14 exits with status 1 for every failure, so failures are told apart by
their messages (a missing repository says ``unable to open config file``). restic
derives the key from the password with scrypt, calibrated at ``init`` to take about
half a second on the machine, before every command; a local repository gets a second
key with a cheap KDF that restic is told to try first (storage/restic_keys.py: the
passwords are random, stretching them buys nothing), which takes a restic command from
0.7-0.9 s to about 0.25 s here, and a new one for such a password is written in
restic's format with that key alone (storage/restic_init.py), not by ``restic init``.
Two ``init`` runs racing on one repository both succeed and leave it unreadable, so
:meth:`ResticRepository.ensure` serialises them with a lock on the password file.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from gpuyard.core.errors import RuntimeFailure
from gpuyard.storage.child_process import (
    TAIL_LINES,
    Drain,
    die_with_parent,
    interrupt,
    kill,
    write_all,
)
from gpuyard.storage.json_stream import StreamError, json_array_items
from gpuyard.storage.lock_journal import remove_orphaned_locks
from gpuyard.storage.restic_init import init_repository
from gpuyard.storage.restic_keys import OperationKey, ensure_fast_key, operation_key
from gpuyard.storage.secret_files import SecretFileError, ensure_secret_file

log = logging.getLogger(__name__)

INSTALL_HINT: Final = "restic is not installed; apt-get install restic"

# Other ways to name the password or repository: ours are the only ones restic sees.
_ENV_DROPPED: Final = (
    "RESTIC_PASSWORD",
    "RESTIC_PASSWORD_FILE",
    "RESTIC_PASSWORD_COMMAND",
    "RESTIC_REPOSITORY",
    "RESTIC_REPOSITORY_FILE",
    "RESTIC_CACHE_DIR",
    "RESTIC_FROM_REPOSITORY",
    "RESTIC_FROM_REPOSITORY_FILE",
    "RESTIC_FROM_PASSWORD",
    "RESTIC_FROM_PASSWORD_FILE",
    "RESTIC_FROM_PASSWORD_COMMAND",
)
# Backends restic knows by a "scheme:" prefix; anything else is a local path.
_REMOTE_SCHEMES: Final = ("sftp:", "rest:", "s3:", "azure:", "gs:", "swift:", "b2:", "rclone:")
_SNAPSHOT_ID: Final = re.compile(r"[0-9a-f]{8,64}")
_LOCKED: Final = re.compile(r"repository is already locked|unable to create lock")
_NO_CONFIG: Final = "unable to open config file"
_USERINFO: Final = re.compile(r"(://)[^/@\s]+@")
# How long a finished backup waits for a live exclusive lock (a prune) to go before
# it can look its snapshot's full id up.
_ID_LOOKUP_PATIENCE_S: Final = 120.0
_FORGET_BATCH: Final = 200


def refused_for_lock(stderr: str) -> bool:
    """Whether restic's ``stderr`` says another process's lock refused the command."""
    return _LOCKED.search(stderr) is not None


class ResticError(RuntimeFailure):
    """restic failed or cannot be run. ``details`` holds ``command`` (the restic
    subcommand), ``exit_status`` and ``stderr`` (its last lines); never the password."""


class ResticLocked(ResticError):
    """A live restic process holds a lock that conflicts with the command (a prune
    beside a backup, say): nothing was done; try again later."""


@dataclass(frozen=True)
class BackupResult:
    """A snapshot that restic committed.

    ``total_bytes`` is the length of the stream; ``data_added`` what the repository
    grew by (after de-duplication and compression); ``seconds`` the backup's wall time.
    """

    restic_id: str
    short_id: str
    total_bytes: int
    data_added: int
    seconds: float


@dataclass(frozen=True)
class SnapshotInfo:
    restic_id: str
    short_id: str
    tags: tuple[str, ...]
    time: str


@dataclass(frozen=True)
class CheckResult:
    """``ok``: ``restic check`` exited 0 and printed no error. ``output``: what it
    printed (stdout, then stderr)."""

    ok: bool
    output: str

    @property
    def unreferenced_packs(self) -> int:
        """Pack files no index references (left by a killed backup; ``prune`` drops
        them). Not an error for restic, so ``ok`` may be true beside them."""
        summary = re.search(r"(\d+) additional files were found", self.output)
        if summary:
            return int(summary.group(1))
        return self.output.count("not referenced in any index")


class ResticRepository:
    """One restic repository, reached through the restic binary.

    Every method may raise :class:`ResticError` (restic missing, the repository
    unreachable, a wrong password, a failed command) and :class:`ResticLocked`. Methods
    that touch the repository call :meth:`ensure` first, so a fresh installation needs
    no set-up step. Thread-safe: each call runs its own restic process.
    """

    def __init__(
        self,
        location: str,
        password_file: Path,
        cache_dir: Path,
        env: Mapping[str, str] | None = None,
        binary: str = "restic",
        *,
        helpers: bool = True,
    ) -> None:
        self._location = location
        self._helpers = helpers
        self._password_file = Path(password_file)
        self._cache_dir = Path(cache_dir)
        self._env = dict(env) if env is not None else None
        self._binary = binary
        self._lock = threading.Lock()
        self._ready = False
        self._secret: str | None = None
        self._key_hint: str | None = None

    @property
    def location(self) -> str:
        """The repository string, with any user:password@ of a URL masked."""
        return _USERINFO.sub(r"\1***@", self._location)

    @property
    def is_local(self) -> bool:
        return not self._location.startswith(_REMOTE_SCHEMES)

    # -- set-up --------------------------------------------------------------------

    def ensure(self, *, chunker_from: ResticRepository | None = None) -> None:
        """Make the password file (first use only) and the repository (when it does
        not exist yet; with ``chunker_from``'s chunker parameters when given).
        Idempotent and thread-safe; after its first success it returns at once. Never
        initialises over an existing repository: one that exists with another password
        raises ResticError (``wrong password or no key found``)."""
        with self._lock:
            if self._ready:
                return
            self._secret = self._ensure_password()
            self._cache_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            # Two restic inits racing on one repository both succeed and leave it
            # unreadable (each writes its own key and config; measured with 0.14), so
            # processes sharing the password file take turns on it. (Hosts that share
            # only an S3 repository cannot be serialised this way; they share the
            # password file's contents, and one of them should make the repository.)
            with self._password_file.open("rb") as held:
                fcntl.flock(held.fileno(), fcntl.LOCK_EX)
                self._use_fast_key()
                if not self._config_exists() and not self._init_here(chunker_from):
                    copied = (
                        ["--copy-chunker-params", *chunker_from._from_options()]
                        if chunker_from is not None
                        else []
                    )
                    result = self._run("init", "--repository-version", "2", *copied, check=False)
                    # A host beside us may have won the race; its repository is ours.
                    if result.returncode != 0 and not self._config_exists():
                        raise self._failure("init", result.returncode, result.stderr)
                    if result.returncode == 0:
                        log.info("created restic repository at %s", self.location)
                    self._use_fast_key()
            self._ready = True

    def _init_here(self, chunker_from: ResticRepository | None) -> bool:
        """Make a new local repository in Python (storage/restic_init.py: restic's
        format without the 2 s of CPU of its scrypt calibration) for one of our random
        passwords when no chunker parameters are copied. False leaves it to ``restic
        init``. Runs under the password file's lock."""
        if not self.is_local or chunker_from is not None or self._secret is None:
            return False
        self._executable()  # a missing restic says how to install it, as its init would
        if not init_repository(Path(self._local_path()), self._secret):
            return False
        log.info("created restic repository at %s", self.location)
        self._use_fast_key()
        return True

    def _use_fast_key(self) -> None:
        """Find or add the key with a cheap KDF (storage/restic_keys.py) of a local
        repository that exists, and have restic try it first. Runs under the
        password file's lock."""
        if not self.is_local or self._key_hint is not None or self._secret is None:
            return
        root = Path(self._local_path())
        if not (root / "config").is_file() or not (root / "keys").is_dir():
            return
        try:
            self._key_hint = ensure_fast_key(root, self._secret)
        except OSError as exc:  # a read-only repository, say: restic's own key still works
            log.warning("no fast key for restic repository %s: %s", self.location, exc)

    def helper_access(self) -> tuple[Path, OperationKey] | None:
        """For restic run elsewhere through a REST backend server of ours
        (storage/volume_restic.py): the local repository's directory and a key made for
        one operation. None for a repository that is not local, or whose password needs
        stretching (a person's: storage/restic_keys.py), or made ``helpers=False``.
        Makes the repository first."""
        if not self.is_local or not self._helpers:
            return None
        self.ensure()
        if self._secret is None or self._key_hint is None:
            return None  # no cheap key: the password is not one of ours
        root = Path(self._local_path())
        key = operation_key(root, self._secret)
        return None if key is None else (root, key)

    def binary(self) -> str:
        """The restic binary this repository runs (ResticError when it is missing)."""
        return self._executable()

    def exists(self) -> bool:
        """Whether the repository exists; creates nothing. A repository whose password
        file is missing counts as absent: nothing of ours can be in it."""
        if self.is_local:
            return (Path(self._local_path()) / "config").is_file()
        if not self._password_file.is_file():
            return False
        with self._lock:
            self._secret = self._password_file.read_text().strip()
            return self._config_exists()

    def _local_path(self) -> str:
        return self._location.removeprefix("local:")

    def _ensure_password(self) -> str:
        try:
            return ensure_secret_file(self._password_file)
        except SecretFileError as exc:
            raise ResticError(str(exc)) from exc

    def _config_exists(self) -> bool:
        if self.is_local:
            root = Path(self._local_path())
            if not root.is_dir() or not any(root.iterdir()):
                return False
        result = self._run("cat", "config", check=False)
        if result.returncode == 0:
            return True
        if _NO_CONFIG in result.stderr:
            return False
        raise self._failure("cat config", result.returncode, result.stderr)

    # -- streams -------------------------------------------------------------------

    def backup_stream(
        self,
        chunks: Iterable[bytes | bytearray | memoryview],
        *,
        filename: str,
        tags: Sequence[str],
        host: str,
        on_started: Callable[[int], None] | None = None,
    ) -> BackupResult:
        """Store the stream ``chunks`` as a snapshot holding one file, ``/filename``,
        with ``tags`` and ``host``. ``on_started`` gets restic's pid once it runs.

        Commits a snapshot only when the stream ends normally. When iterating
        ``chunks`` raises, restic is killed (no snapshot; a stale lock and stray packs
        that :meth:`recover_after_crash` or the next prune removes) and that exception
        propagates. Raises ResticError when restic fails, ValueError for a tag restic
        would split (commas) or an empty one.
        """
        _check_tags(tags)
        self.ensure()
        args = ["backup", "--stdin", "--stdin-filename", filename, "--host", host, "--json"]
        for tag in tags:
            args += ["--tag", tag]
        began = time.monotonic()
        proc = self._spawn(args, stdin=subprocess.PIPE)
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        out = Drain(proc.stdout, want="summary")
        err = Drain(proc.stderr)
        try:
            if on_started is not None:
                on_started(proc.pid)
            write_all(proc.stdin, chunks)
        except BaseException:
            # Killed before stdin is closed: restic must not see an EOF it would take
            # for the end of the stream.
            kill(proc)
            with contextlib.suppress(OSError):
                proc.stdin.close()
            out.join()
            err.join()
            raise
        status = proc.wait()
        out.join()
        stderr = err.text()
        seconds = time.monotonic() - began
        if status != 0:
            raise self._failure("backup", status, stderr)
        summary = out.found
        if summary is None or not isinstance(summary.get("snapshot_id"), str):
            raise self._failure("backup", status, stderr or "restic printed no summary")
        short_id: str = summary["snapshot_id"]
        return BackupResult(
            # A local repository's id is read from its directory: no second restic run.
            restic_id=self.resolve_id(
                short_id, host=host, tags=tags, path="/" + filename.lstrip("/")
            ),
            short_id=short_id,
            total_bytes=int(summary.get("total_bytes_processed", 0)),
            data_added=int(summary.get("data_added", 0)),
            seconds=seconds,
        )

    @contextlib.contextmanager
    def dump_stream(
        self, restic_id: str, filename: str, *, chunk_size: int = 1 << 20
    ) -> Iterator[Iterator[bytes]]:
        """The file ``/filename`` of snapshot ``restic_id``, as chunks of at most
        ``chunk_size`` bytes. After the last chunk the iterator raises ResticError if
        restic failed (a missing snapshot or file, a damaged pack), so a consumer
        never takes a truncated stream for a whole one. Leaving the context early
        stops restic (interrupted, so that it removes its lock; killed if it lingers)."""
        check_id(restic_id)
        self.ensure()
        proc = self._spawn(["dump", restic_id, "/" + filename.lstrip("/")])
        assert proc.stdout is not None and proc.stderr is not None
        stdout = proc.stdout
        err = Drain(proc.stderr)

        def chunks() -> Iterator[bytes]:
            while data := stdout.read(chunk_size):
                yield data
            status = proc.wait()
            if status != 0:
                raise self._failure("dump", status, err.text())

        try:
            yield chunks()
        finally:
            if proc.poll() is None:
                interrupt(proc)
            stdout.close()
            err.join()

    # -- queries and upkeep --------------------------------------------------------

    def forget(self, restic_ids: Sequence[str], *, prune: bool = True) -> None:
        """Forget the snapshots ``restic_ids``, then (``prune``) delete the data no
        other snapshot uses. Idempotent: ids the repository no longer holds are
        skipped. Takes the exclusive lock, so a backup in progress makes it raise
        ResticLocked."""
        ids = list(dict.fromkeys(restic_ids))
        for restic_id in ids:
            check_id(restic_id)
        if not ids:
            return
        self.ensure()
        for start in range(0, len(ids), _FORGET_BATCH):
            self._run("forget", *ids[start : start + _FORGET_BATCH])
        if prune:
            self._run("prune")

    def snapshots(self) -> list[SnapshotInfo]:
        """Every snapshot (oldest first)."""
        self.ensure()
        return self._snapshots()

    def find_by_tag(self, tag: str) -> list[SnapshotInfo]:
        """The snapshots carrying ``tag`` (oldest first)."""
        _check_tags([tag])
        self.ensure()
        return self._snapshots("--tag", tag)

    def stats_raw_size(self) -> int:
        """Bytes the repository holds for its snapshots' data, after de-duplication
        and compression."""
        self.ensure()
        result = self._run("stats", "--mode", "raw-data", "--json")
        return int(_json(result.stdout, "stats")["total_size"])

    def check(self, read_data: bool = False) -> CheckResult:
        """``restic check`` (``read_data``: also read and verify every pack). Stale
        locks are removed first if they block it; a live lock raises ResticLocked."""
        self.ensure()
        args = ["check", "--read-data"] if read_data else ["check"]
        result = self._run(*args, check=False)
        output = self._scrub(result.stdout + result.stderr)
        return CheckResult(
            ok=result.returncode == 0 and not _mentions_errors(output), output=output
        )

    def unlock(self) -> None:
        """Remove stale locks: those of processes on this host that are gone (a
        server killed with -9), those our REST backend servers placed for helpers
        and could not delete (storage/lock_journal.py), and any older than 30
        minutes. Live locks stay."""
        self.ensure()
        self._remove_orphaned_locks()
        self._run("unlock")

    def _remove_orphaned_locks(self) -> None:
        """Delete the locks of helpers whose REST backend server is gone (a local
        repository's journals); restic cannot tell those are stale."""
        if not self.is_local:
            return
        removed = remove_orphaned_locks(Path(self._local_path()))
        if removed:
            log.info("removed %d locks of ended operations on %s", len(removed), self.location)

    def recover_after_crash(self) -> CheckResult:
        """Make the repository check clean after a crash: remove stale locks, and
        prune the packs a killed backup left when the check names them (or fails),
        then check again. Idempotent. Returns the last check's result: ``ok`` false
        means damage a prune cannot mend (its output, and the failed prune's, say
        what). Raises ResticLocked while a live process holds the repository."""
        self.unlock()
        result = self.check()
        if result.ok and not result.unreferenced_packs:
            return result
        log.warning(
            "snapshot repository needs a prune (%d unreferenced packs, check ok: %s)",
            result.unreferenced_packs,
            result.ok,
        )
        try:
            self._run("prune")
        except ResticLocked:
            raise
        except ResticError as exc:
            stderr = exc.details.get("stderr", "")
            return CheckResult(ok=False, output=f"{result.output}\n{exc.message}\n{stderr}")
        return self.check()

    # -- moving snapshots between repositories -------------------------------------

    def copy_from(self, source: ResticRepository, restic_ids: Sequence[str]) -> None:
        """Copy the snapshots ``restic_ids`` of ``source`` into this repository
        (``restic copy``; each gets a new id here, found by its tags). Idempotent: a
        snapshot copied before is skipped. Made first when missing, with ``source``'s
        chunker parameters, so what is copied and what is backed up later share
        chunks. Raises ResticError (an id ``source`` lacks, either repository
        unreadable)."""
        ids = list(dict.fromkeys(restic_ids))
        for restic_id in ids:
            check_id(restic_id)
        if not ids:
            return
        self.ensure(chunker_from=source)
        self._run("copy", *source._from_options(), *ids)

    def _from_options(self) -> list[str]:
        """This repository as the source of another's ``copy`` or ``init``."""
        hint = ["--from-key-hint", self._key_hint] if self._key_hint is not None else []
        return [
            "--from-repo",
            self._location,
            "--from-password-file",
            str(self._password_file),
            *hint,
        ]

    def resolve_id(self, short_id: str, *, host: str, tags: Sequence[str], path: str) -> str:
        """The full id of the snapshot a backup just reported by its short id (restic
        0.14's summary gives only that); ``host``, ``tags`` and the snapshot's one
        ``path`` tell colliding short ids apart. Waits for a prune's lock to go. A local
        repository's id is read from its ``snapshots`` directory."""
        _check_tags(tags)
        self.ensure()
        if self.is_local and _SNAPSHOT_ID.fullmatch(short_id):
            # A local repository names each snapshot's file by its full id: no restic
            # run (half a second) is needed unless two of them share the short id.
            with contextlib.suppress(OSError):
                names = os.listdir(Path(self._local_path()) / "snapshots")
                found = [n for n in names if n.startswith(short_id) and _SNAPSHOT_ID.fullmatch(n)]
                if len(found) == 1:
                    return found[0]
        return self._full_id(short_id, host=host, tags=tags, path=path)

    def cat_json(self, kind: Literal["snapshot", "blob"], object_id: str) -> Any:
        """``restic cat snapshot|blob ID``, parsed: a snapshot's record (``tree``,
        ``paths``, ``hostname``...) or a tree blob (``{"nodes": [...]}``, each node with
        ``name``, ``type``, ``inode``, ``device_id``, ``links``, ``subtree``...)."""
        check_id(object_id)
        self.ensure()
        return _json(self._run("cat", kind, object_id).stdout, f"cat {kind}")

    def restore_size(self, restic_id: str) -> tuple[int, int]:
        """What restoring snapshot ``restic_id`` writes: (bytes of file contents, each
        hard-linked file once; entries of every kind), from ``stats --mode
        restore-size``."""
        check_id(restic_id)
        self.ensure()
        result = self._run("stats", "--json", "--mode", "restore-size", restic_id)
        stats = _json(result.stdout, "stats")
        return int(stats.get("total_size", 0)), int(stats.get("total_file_count", 0))

    @contextlib.contextmanager
    def find_nodes(self, restic_id: str) -> Iterator[Iterator[dict[str, Any]]]:
        """Every node of snapshot ``restic_id``, as ``restic find --long --json`` lists
        them (``path``, ``type``, ``mode``, ``uid``, ``gid``, ``mtime``, ``size``,
        ``links``, ``device_id``...; no inode numbers), parsed as restic prints them:
        its output is one JSON document, never held whole. After the last node the
        iterator raises ResticError if restic failed. Leaving early stops restic."""
        check_id(restic_id)
        self.ensure()
        proc = self._spawn(["find", "--json", "--long", "--snapshot", restic_id, "*"])
        assert proc.stdout is not None and proc.stderr is not None
        stdout = proc.stdout
        err = Drain(proc.stderr)

        def nodes() -> Iterator[dict[str, Any]]:
            try:
                yield from json_array_items(iter(lambda: stdout.read(1 << 16), b""), "matches")
            except StreamError as exc:
                raise ResticError(exc.message, exc.details) from None
            status = proc.wait()
            if status != 0:
                raise self._failure("find", status, err.text())

        try:
            yield nodes()
        finally:
            if proc.poll() is None:
                interrupt(proc)
            stdout.close()
            err.join()

    # -- running restic ------------------------------------------------------------

    def _snapshots(self, *args: str) -> list[SnapshotInfo]:
        result = self._run("snapshots", "--json", *args)
        found = _json(result.stdout, "snapshots") or []
        return [
            SnapshotInfo(
                restic_id=s["id"],
                short_id=s.get("short_id", s["id"][:8]),
                tags=tuple(s.get("tags") or ()),
                time=s.get("time", ""),
            )
            for s in found
        ]

    def _full_id(self, short_id: str, *, host: str, tags: Sequence[str], path: str) -> str:
        """The full id of the snapshot a backup just reported by its short id."""
        deadline = time.monotonic() + _ID_LOOKUP_PATIENCE_S
        delay = 0.5
        while True:
            try:
                listed = self._run("list", "snapshots").stdout.split()
                break
            except ResticLocked:
                # The snapshot is committed; only a prune's lock keeps us from its id.
                if time.monotonic() > deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 10.0)
        matches = [i for i in listed if i.startswith(short_id)]
        if len(matches) == 1:
            return matches[0]
        if matches:  # 32-bit short ids can collide: tell them apart by what we wrote
            result = self._run("snapshots", "--json", *matches)
            for s in sorted(_json(result.stdout, "snapshots") or [], key=lambda s: s["time"]):
                if (
                    s.get("hostname") == host
                    and s.get("paths") == [path]
                    and sorted(s.get("tags") or ()) == sorted(tags)
                ):
                    matches = [s["id"]]
            if len(matches) == 1:
                return matches[0]
        raise ResticError(
            f"restic reported snapshot {short_id}, which the repository does not list",
            {"command": "list snapshots", "short_id": short_id},
        )

    def _executable(self) -> str:
        path = (self._env if self._env is not None else os.environ).get("PATH")
        found = shutil.which(self._binary, path=path or os.defpath)
        if found is None:
            raise ResticError(INSTALL_HINT, {"binary": self._binary})
        return found

    def _argv(self, args: Sequence[str]) -> list[str]:
        return [
            self._executable(),
            "--repo",
            self._location,
            "--password-file",
            str(self._password_file),
            "--cache-dir",
            str(self._cache_dir),
            *(["--key-hint", self._key_hint] if self._key_hint is not None else []),
            *args,
        ]

    def _environment(self) -> dict[str, str]:
        env = dict(self._env if self._env is not None else os.environ)
        for name in _ENV_DROPPED:
            env.pop(name, None)
        return env

    def _spawn(
        self, args: Sequence[str], *, stdin: int = subprocess.DEVNULL
    ) -> subprocess.Popen[bytes]:
        argv = self._argv(args)
        log.debug("restic %s", " ".join(args[:1]))
        try:
            return subprocess.Popen(
                argv,
                stdin=stdin,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=self._environment(),
                preexec_fn=die_with_parent(),
            )
        except FileNotFoundError as exc:
            raise ResticError(INSTALL_HINT, {"binary": self._binary}) from exc

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run restic to its end. A command refused for a lock gets one more try after
        stale locks are removed; still locked, it raises ResticLocked (even when not
        ``check``). ``check``: raise ResticError on a non-zero exit status."""
        result = self._run_once(args)
        if result.returncode != 0 and _LOCKED.search(result.stderr) and args[0] != "unlock":
            self._remove_orphaned_locks()
            self._run_once(("unlock",))
            result = self._run_once(args)
            if result.returncode != 0 and _LOCKED.search(result.stderr):
                raise self._failure(args[0], result.returncode, result.stderr)
        if check and result.returncode != 0:
            raise self._failure(args[0], result.returncode, result.stderr)
        return result

    def _run_once(self, args: Sequence[str]) -> subprocess.CompletedProcess[str]:
        proc = self._spawn(args)
        try:
            stdout, stderr = proc.communicate()
        except BaseException:
            kill(proc)  # interrupted (KeyboardInterrupt, ...): never leave it behind
            raise
        return subprocess.CompletedProcess(
            proc.args,
            proc.returncode,
            stdout.decode("utf-8", "replace"),
            stderr.decode("utf-8", "replace"),
        )

    def _scrub(self, text: str) -> str:
        if self._secret:
            text = text.replace(self._secret, "***")
        return _USERINFO.sub(r"\1***@", text)

    def _failure(self, command: str, status: int, stderr: str) -> ResticError:
        """The error for a failed command: ResticLocked when a lock refused it."""
        lines = [line for line in self._scrub(stderr).splitlines() if line.strip()]
        tail = lines[-TAIL_LINES:]
        how = f"killed by signal {-status}" if status < 0 else f"exit status {status}"
        locked = _LOCKED.search(stderr)
        # restic's last line for a lock is advice (run unlock); the first says who holds it.
        last = lines[0] if locked and lines else tail[-1] if tail else "no message"
        kind = ResticLocked if locked else ResticError
        return kind(
            f"restic {command} failed ({how}): {last}",
            {"command": command, "exit_status": status, "stderr": "\n".join(tail)},
        )


def _check_tags(tags: Sequence[str]) -> None:
    for tag in tags:
        # restic splits a --tag value at commas; an empty tag matches nothing.
        if not tag or "," in tag:
            raise ValueError(f"invalid restic tag {tag!r}: must be non-empty, without commas")


def check_id(restic_id: str) -> None:
    """ValueError unless ``restic_id`` looks like a restic snapshot id (which also
    keeps an id from being read as an option)."""
    if not _SNAPSHOT_ID.fullmatch(restic_id):
        raise ValueError(f"invalid restic snapshot id {restic_id!r}")


def _json(text: str, command: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ResticError(
            f"restic {command} printed no JSON", {"command": command, "stdout": text[-500:]}
        ) from exc


def _mentions_errors(output: str) -> bool:
    for line in output.splitlines():
        lowered = line.strip().lower()
        if "error" in lowered and not lowered.startswith("no errors were found"):
            return True
    return False
