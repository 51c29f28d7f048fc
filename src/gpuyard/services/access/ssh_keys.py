"""SSH public keys of an account: OpenSSH public-key parsing, storage and look-up.

A key belongs to the user who registered it (``user_id``) and, when registered with an
API key restricted to a project, to that project (``project_id``): it opens a cluster
only while that user may write to the cluster's project (services/tenancy/cluster_access.py).
A caller limited to some projects sees and manages its own keys and those of its
projects; removing another user's key takes ``manage_members``.

A key is accepted only if it is a well-formed OpenSSH public key: a supported type,
a base64 blob that decodes, whose embedded type string equals the declared type and
that asyncssh imports as a public key of that type (its numbers and curve points
checked by ``cryptography``), of at least :data:`MIN_RSA_BITS` bits for RSA and with
an application for a security key. A refused key is answered with what is wrong with
it (a field truncated, of the wrong size, ...). It is stored normalised as
``"type base64 comment"`` with the fingerprint ``ssh-keygen -lf`` prints
(``SHA256:`` + unpadded base64 of the blob's SHA-256, asyncssh's).
"""

from __future__ import annotations

import base64
import binascii
import re

import asyncssh
from asyncssh.packet import PacketDecodeError, SSHPacket
from sqlalchemy import select
from sqlalchemy.orm import Session

from gpuyard.core.errors import NotFound, ValidationFailed
from gpuyard.services.access.resource_util import id_list, in_id_range, iso
from gpuyard.services.tenancy.auth import Principal
from gpuyard.services.tenancy.cluster_access import AccessIndex, Need
from gpuyard.store.schema import ApiKey, SshKey

FIELD = "public_key"
# An RSA key of 16384 bits is ~2.8 KB of base64; anything far larger is not a key.
MAX_KEY_CHARS = 16 * 1024
MIN_RSA_BITS = 1024
MAX_NAME_CHARS = 200

# The curve each ECDSA type names inside its blob, and its uncompressed point size:
# only to say why asyncssh refused one.
_EC_POINT_BYTES = {"nistp256": 65, "nistp384": 97, "nistp521": 133}
_ED25519_BYTES = 32

SK_ECDSA = "sk-ecdsa-sha2-nistp256@openssh.com"
SK_ED25519 = "sk-ssh-ed25519@openssh.com"
KEY_TYPES = (
    "ssh-ed25519",
    "ssh-rsa",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    SK_ECDSA,
    SK_ED25519,
)
_BASE64 = re.compile(r"[A-Za-z0-9+/]+={0,2}")


class SshKeyNotFound(NotFound):
    code = "SSH_KEY_NOT_FOUND"


def _reject_non_public(text: str) -> None:
    """Explain the usual mistakes instead of a bare 'invalid key'."""
    if "PRIVATE KEY" in text:
        raise ValidationFailed(
            FIELD,
            "this is a PRIVATE key; never share it. Send the public key instead: the "
            "contents of the .pub file (or the output of `ssh-keygen -y -f KEYFILE`)",
        )
    if "BEGIN SSH2 PUBLIC KEY" in text:
        raise ValidationFailed(
            FIELD,
            "this is an RFC 4716 (SSH2/PuTTY) public key; convert it to OpenSSH format "
            "with `ssh-keygen -i -f KEYFILE`",
        )
    if "\n" in text or "\r" in text:
        raise ValidationFailed(FIELD, "must be a single OpenSSH public key on one line")


def _strings(blob: bytes) -> tuple[list[bytes], bool]:
    """The blob's SSH wire strings (RFC 4251), read with asyncssh's packet reader, and
    whether they fill it exactly (False: the last one is cut short)."""
    packet = SSHPacket(blob)
    fields: list[bytes] = []
    while packet:
        try:
            fields.append(packet.get_string())
        except PacketDecodeError:
            return fields, False
    return fields, True


def _embedded_type(blob: bytes) -> bytes:
    try:
        return SSHPacket(blob).get_string()
    except PacketDecodeError as exc:
        raise ValidationFailed(FIELD, "the key data is truncated (reading the key type)") from exc


def _why_refused(key_type: str, blob: bytes) -> str:
    """What is wrong with a blob of ``key_type`` that asyncssh refused to import,
    field by field, in the words users have been told so far."""
    read, whole = _strings(blob)
    fields = read[1:]
    if key_type == "ssh-rsa":
        wanted = ["public exponent", "modulus"]
    elif key_type in ("ssh-ed25519", SK_ED25519):
        wanted = ["the Ed25519 key"]
    else:
        wanted = ["the curve name", "the curve point"]
    if key_type.startswith("sk-"):
        wanted.append("the security-key application")
    if not whole or len(fields) < len(wanted):
        return f"the key data is truncated (reading {wanted[min(len(fields), len(wanted) - 1)]})"
    if key_type == "ssh-rsa":
        for what, raw in zip(wanted, fields, strict=False):
            if not raw or raw[0] & 0x80:
                return f"the key's {what} is not a positive integer"
    elif key_type in ("ssh-ed25519", SK_ED25519):
        if len(fields[0]) != _ED25519_BYTES:
            return "the Ed25519 key is not 32 bytes"
    else:
        curve = key_type.removeprefix("sk-").removeprefix("ecdsa-sha2-").split("@")[0]
        if fields[0] != curve.encode():
            return f"the key data does not name the curve {curve!r}"
        point = fields[1]
        if len(point) != _EC_POINT_BYTES[curve] or point[0] != 0x04:
            return f"the {curve} curve point is malformed"
    if len(fields) > len(wanted):
        return "the key data has trailing bytes"
    if "ecdsa" in key_type:
        return "the key's curve point is not on its curve"
    return f"the key data is not a valid {key_type} key"


def _import(key_type: str, blob: bytes) -> asyncssh.SSHKey:
    """The public key of ``blob`` as asyncssh reads it, held to the rules asyncssh does
    not apply itself (RSA size, a security key's application). Raises ValidationFailed
    saying what is wrong."""
    embedded = _embedded_type(blob)
    if embedded != key_type.encode():
        shown = embedded.decode("ascii", "replace")[:60]
        raise ValidationFailed(
            FIELD, f"the key data is a {shown!r} key but the line declares {key_type!r}"
        )
    line = f"{key_type} {base64.b64encode(blob).decode()}"
    try:
        key = asyncssh.import_public_key(line)
    # asyncssh raises KeyImportError, and ValueError or OverflowError from the
    # cryptography checks of numbers and points.
    except (asyncssh.KeyImportError, ValueError, OverflowError) as exc:
        raise ValidationFailed(FIELD, _why_refused(key_type, blob)) from exc
    if key_type == "ssh-rsa":
        bits = _rsa_bits(key)
        if bits < MIN_RSA_BITS:
            raise ValidationFailed(
                FIELD, f"RSA keys must have at least {MIN_RSA_BITS} bits (this one has {bits})"
            )
    if key_type.startswith("sk-") and not _strings(blob)[0][-1]:
        raise ValidationFailed(FIELD, "the security-key application is empty")
    return key


def _rsa_bits(key: asyncssh.SSHKey) -> int:
    """The modulus size of an RSA key asyncssh imported (its cryptography key's)."""
    return int(getattr(key.pyca_key, "key_size", 0))


def parse_public_key(text: object) -> tuple[str, str]:
    """Validate an OpenSSH public key line (``type base64 [comment]``).

    Returns ``(normalised, fingerprint)``: the line with single spaces between type,
    data and the (stripped) comment, and the SHA256 fingerprint. Raises
    ValidationFailed("public_key", ...) saying what is wrong, with a hint for private
    keys and RFC 4716 keys.
    """
    if not isinstance(text, str):
        raise ValidationFailed(FIELD, "must be a string holding an OpenSSH public key")
    text = text.strip()
    if not text:
        raise ValidationFailed(FIELD, "is empty; paste the contents of your .pub file")
    if len(text) > MAX_KEY_CHARS:
        raise ValidationFailed(FIELD, f"is longer than {MAX_KEY_CHARS} characters")
    _reject_non_public(text)
    parts = text.split(None, 2)
    key_type = parts[0]
    if key_type not in KEY_TYPES:
        raise ValidationFailed(
            FIELD,
            f"unsupported key type {key_type[:60]!r}; expected one of {', '.join(KEY_TYPES)}"
            " (authorized_keys options before the type are not accepted)",
            {"allowed": list(KEY_TYPES)},
        )
    if len(parts) < 2:
        raise ValidationFailed(FIELD, "the base64 key data after the key type is missing")
    data = parts[1]
    if not _BASE64.fullmatch(data):
        raise ValidationFailed(FIELD, "the key data is not valid base64")
    try:
        blob = base64.b64decode(data, validate=True)
    except binascii.Error as exc:
        raise ValidationFailed(FIELD, "the key data is not valid base64") from exc
    key = _import(key_type, blob)
    comment = parts[2].strip() if len(parts) == 3 else ""
    if any(ord(c) < 32 or ord(c) == 127 for c in comment):
        raise ValidationFailed(FIELD, "the comment contains control characters")
    normalised = f"{key_type} {base64.b64encode(blob).decode()}"
    fp = key.get_fingerprint("sha256")
    return (f"{normalised} {comment}" if comment else normalised), fp


def _name(name: object) -> str:
    if not isinstance(name, str) or not name.strip() or len(name.strip()) > MAX_NAME_CHARS:
        raise ValidationFailed("name", f"must be 1 to {MAX_NAME_CHARS} characters")
    return name.strip()


def add_key(
    session: Session,
    account_id: int,
    name: object,
    public_key: object,
    *,
    user_id: int | None = None,
    project_id: int | None = None,
) -> SshKey:
    """Store a validated key for ``account_id``, owned by ``user_id`` (None: nobody,
    so it opens no cluster; training clusters name keys by id whoever owns them) and
    limited to ``project_id`` when given. Raises ValidationFailed("name" |
    "public_key"). The same key may be stored twice (under two names)."""
    clean_name = _name(name)
    normalised, fp = parse_public_key(public_key)
    row = SshKey(
        account_id=account_id,
        name=clean_name,
        public_key=normalised,
        fingerprint=fp,
        user_id=user_id,
        project_id=project_id,
    )
    session.add(row)
    session.flush()
    return row


def keys_by_ids(
    session: Session, account_id: int, ids: object, field: str = "ssh_key_ids"
) -> list[SshKey]:
    """The keys named by ``ids`` (a non-empty JSON list of integer ids of
    ``account_id``'s keys), in the given order, duplicates dropped. Raises
    ValidationFailed(field, ...) for anything else; another account's key reads as
    unknown."""
    wanted = id_list(ids, field, "SSH key")
    rows = {
        r.id: r
        for r in session.scalars(
            select(SshKey).where(
                SshKey.account_id == account_id,
                SshKey.id.in_([i for i in wanted if in_id_range(i)]),
            )
        )
    }
    missing = [i for i in wanted if i not in rows]
    if missing:
        raise ValidationFailed(field, f"SSH key {missing[0]} not found", {"missing_ids": missing})
    return [rows[i] for i in wanted]


def ssh_key_view(row: SshKey) -> dict[str, object]:
    """The API shape of a key."""
    return {
        "id": row.id,
        "name": row.name,
        "public_key": row.public_key,
        "fingerprint": row.fingerprint,
        "created_at": iso(row.created_at),
        "user_id": row.user_id,
        "project_id": row.project_id,
    }


def account_public_keys(
    session: Session,
    account_id: int,
    *,
    project_id: int | None = None,
    user_id: int | None = None,
    key_project_id: int | None = None,
) -> str:
    """Keys as ``authorized_keys`` text (one per line, oldest first; empty when there
    are none): RunPod's ``pubKey`` and the ``PUBLIC_KEY`` env. ``project_id``: only
    the keys whose users may write to that project now (a cluster's env);
    ``user_id``: only that user's keys (``myself { pubKey }``); ``key_project_id``:
    only the keys limited to that project (the caller's API key is restricted to it)."""
    query = select(SshKey).where(SshKey.account_id == account_id).order_by(SshKey.id)
    if user_id is not None:
        query = query.where(SshKey.user_id == user_id)
    if key_project_id is not None:
        query = query.where(SshKey.project_id == key_project_id)
    rows = list(session.scalars(query))
    if project_id is not None:
        access = AccessIndex.load(session, [r.user_id for r in rows if r.user_id is not None])
        rows = [
            r
            for r in rows
            if access.user_may(
                r.user_id, account_id, project_id, Need.WRITE, within_project=r.project_id
            )
        ]
    return "\n".join(r.public_key for r in rows)


MAX_KEYS_PER_TEXT = 100


def registering_project(session: Session, principal: Principal) -> int | None:
    """The project a key registered by ``principal`` is limited to: its API key's
    project restriction (None: none)."""
    if not principal.key_id:
        return None
    return session.scalar(select(ApiKey.project_id).where(ApiKey.id == principal.key_id))


def replace_keys_from_text(
    session: Session,
    account_id: int,
    text: object,
    *,
    user_id: int,
    project_id: int | None = None,
) -> list[SshKey]:
    """Make ``user_id``'s keys in the account exactly those of ``text`` (RunPod's
    ``updateUserSettings(input: {pubKey})``: one OpenSSH public key per line; blank
    lines and ``#`` comments are skipped). A key already stored (same key data) keeps
    its row, id and name; a new one is named by its comment, else by its fingerprint;
    a stored key the text does not hold is deleted. ``project_id`` (the caller's API
    key is restricted to that project): new keys are limited to it, and only the
    user's keys of that project are replaced (their others are beyond it). Raises
    ValidationFailed("pubKey") naming the first bad line, and changes nothing then."""
    if not isinstance(text, str):
        raise ValidationFailed("pubKey", "must be a string of OpenSSH public keys")
    wanted: dict[str, tuple[str, str]] = {}  # fingerprint -> (line, name)
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            normalised, fp = parse_public_key(line)
        except ValidationFailed as exc:
            reason = exc.message.removeprefix(f"{FIELD}: ")
            raise ValidationFailed("pubKey", f"line {number}: {reason}") from exc
        parts = normalised.split(None, 2)
        name = (parts[2] if len(parts) == 3 else "")[:MAX_NAME_CHARS] or f"key {fp[7:19]}"
        wanted.setdefault(fp, (normalised, name))
    if len(wanted) > MAX_KEYS_PER_TEXT:
        raise ValidationFailed("pubKey", f"at most {MAX_KEYS_PER_TEXT} keys")
    kept: list[SshKey] = []
    query = select(SshKey).where(SshKey.account_id == account_id, SshKey.user_id == user_id)
    if project_id is not None:
        query = query.where(SshKey.project_id == project_id)
    mine = session.scalars(query.order_by(SshKey.id))
    for row in mine:
        if row.fingerprint in wanted and row.fingerprint not in {k.fingerprint for k in kept}:
            kept.append(row)
        else:
            session.delete(row)
    have = {k.fingerprint for k in kept}
    for fp, (line, name) in wanted.items():
        if fp not in have:
            row = SshKey(
                account_id=account_id,
                name=name,
                public_key=line,
                fingerprint=fp,
                user_id=user_id,
                project_id=project_id,
            )
            session.add(row)
            kept.append(row)
    session.flush()
    return sorted(kept, key=lambda r: r.id)
