"""One restic repository per account, each with its own password.

Every account's snapshots live in their own repository, ``<location>/accounts/<id>``
(a sub-directory of a local repository location, a sub-prefix of an S3 one), whose
password is derived from the installation's snapshot secret (the file that was the
password of the installation-wide repository of earlier versions):
``HMAC-SHA256(secret, "gpuyard snapshot repository of account <id>")``, base64url. A
password that leaks opens one account's repository and no other; none can be derived
from another. Each derived password is written to its own file (0600, ``<keys>/
account-<id>.password``) only because restic reads passwords from files; the secret
itself is never given to restic for an account's repository.

The installation-wide repository (``shared``) is kept for what earlier versions stored
in it: reconciler/clusters/snapshot_migration.py moves those snapshots into their accounts'
repositories, then nothing new is written there.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import threading
from collections.abc import Mapping
from pathlib import Path

from gpuyard.storage.restic import ResticError, ResticRepository
from gpuyard.storage.secret_files import SecretFileError, ensure_secret_file, write_secret_file

# Where the accounts' repositories are, under the configured location.
ACCOUNTS_DIR = "accounts"


def account_password(secret: str, account_id: int) -> str:
    """The password of account ``account_id``'s repository, derived from the
    installation's snapshot ``secret``; a pure function."""
    message = f"gpuyard snapshot repository of account {int(account_id)}".encode()
    digest = hmac.new(secret.encode(), message, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


class SnapshotRepositories:
    """The accounts' repositories and the installation-wide one, made on demand.
    Thread-safe; each account's :class:`ResticRepository` is made once."""

    def __init__(
        self,
        location: str,
        secret_file: Path,
        cache_dir: Path,
        keys_dir: Path,
        env: Mapping[str, str] | None = None,
        binary: str = "restic",
    ) -> None:
        self._location = location.rstrip("/") or location
        self._secret_file = Path(secret_file)
        self._cache_dir = Path(cache_dir)
        self._keys_dir = Path(keys_dir)
        self._env = dict(env) if env is not None else None
        self._binary = binary
        self._lock = threading.Lock()
        self._accounts: dict[int, ResticRepository] = {}
        # Every account's snapshots of earlier versions: a helper's one-time key to it
        # would open them all, so its snapshots are read here and streamed.
        self.shared = ResticRepository(
            location, self._secret_file, self._cache_dir, env=env, binary=binary, helpers=False
        )

    def location_of(self, account_id: int) -> str:
        """Where account ``account_id``'s repository is."""
        return f"{self._location}/{ACCOUNTS_DIR}/{int(account_id)}"

    def password_file_of(self, account_id: int) -> Path:
        return self._keys_dir / f"account-{int(account_id)}.password"

    def for_account(self, account_id: int) -> ResticRepository:
        """Account ``account_id``'s repository (made by its first use). Writes its
        password file when missing or not what the secret derives. Raises ResticError
        when the secret file is empty."""
        account_id = int(account_id)
        with self._lock:
            known = self._accounts.get(account_id)
            if known is not None:
                return known
            try:
                secret = ensure_secret_file(self._secret_file)
            except SecretFileError as exc:
                raise ResticError(str(exc)) from exc
            password = account_password(secret, account_id)
            path = self.password_file_of(account_id)
            self._keys_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            try:
                current = path.read_text().strip()
            except FileNotFoundError:
                current = None
            if current != password:
                write_secret_file(path, password, replace=True)
            repository = ResticRepository(
                self.location_of(account_id),
                path,
                self._cache_dir,
                env=self._env,
                binary=self._binary,
            )
            self._accounts[account_id] = repository
            return repository
