"""OpenSSH public-key parsing: real keys from ``ssh-keygen`` are accepted with the
fingerprint ``ssh-keygen -lf`` prints; malformed, mislabelled and private keys are
refused with a message naming ``public_key``."""

from __future__ import annotations

import base64
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from gpuyard.core.errors import ValidationFailed
from gpuyard.services.access.ssh_keys import parse_public_key

needs_keygen = pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="no ssh-keygen")


def keygen(tmp_path: Path, key_type: str, bits: int | None = None) -> Path:
    """A fresh key pair; returns the private key's path (``.pub`` beside it)."""
    path = tmp_path / f"id_{key_type}_{bits or 0}"
    cmd = ["ssh-keygen", "-q", "-t", key_type, "-N", "", "-C", "me@host", "-f", str(path)]
    if bits is not None:
        cmd[4:4] = ["-b", str(bits)]
    subprocess.run(cmd, check=True, capture_output=True)
    return path


def keygen_fingerprint(pub: Path) -> str:
    out = subprocess.run(
        ["ssh-keygen", "-l", "-E", "sha256", "-f", str(pub)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return out.split()[1]


def wire(*fields: bytes) -> str:
    """Base64 of SSH wire-format strings."""
    return base64.b64encode(b"".join(struct.pack(">I", len(f)) + f for f in fields)).decode()


def p256_point() -> bytes:
    """A point of P-256 (uncompressed), as a security key's public key holds."""
    public = ec.generate_private_key(ec.SECP256R1()).public_key()
    return public.public_bytes(Encoding.X962, PublicFormat.UncompressedPoint)


def refused(text: object, needle: str) -> ValidationFailed:
    with pytest.raises(ValidationFailed) as info:
        parse_public_key(text)
    assert info.value.field == "public_key"
    assert needle in info.value.message, info.value.message
    return info.value


@needs_keygen
@pytest.mark.parametrize(
    ("key_type", "bits"),
    [("ed25519", None), ("rsa", 2048), ("ecdsa", 256), ("ecdsa", 384), ("ecdsa", 521)],
)
def test_real_keys_parse_with_ssh_keygen_fingerprints(
    tmp_path: Path, key_type: str, bits: int | None
) -> None:
    private = keygen(tmp_path, key_type, bits)
    pub = Path(f"{private}.pub")
    text = pub.read_text()
    normalised, fp = parse_public_key(text)
    assert normalised == text.strip()
    assert fp == keygen_fingerprint(pub)
    assert fp.startswith("SHA256:") and not fp.endswith("=")


@needs_keygen
def test_normalises_whitespace_and_keeps_comment(tmp_path: Path) -> None:
    key_type, data, _ = Path(f"{keygen(tmp_path, 'ed25519')}.pub").read_text().split()
    normalised, _ = parse_public_key(f"  {key_type}\t {data}   my laptop key  \n")
    assert normalised == f"{key_type} {data} my laptop key"
    bare, _ = parse_public_key(f"{key_type} {data}")
    assert bare == f"{key_type} {data}"


@needs_keygen
def test_private_keys_are_refused_with_a_hint(tmp_path: Path) -> None:
    private = keygen(tmp_path, "ed25519")
    err = refused(private.read_text(), "PRIVATE key")
    assert "ssh-keygen -y" in err.message
    refused("-----BEGIN RSA PRIVATE KEY-----\nMIIE...\n-----END RSA PRIVATE KEY-----", "PRIVATE")


@needs_keygen
def test_rfc4716_keys_are_refused_with_a_hint(tmp_path: Path) -> None:
    pub = Path(f"{keygen(tmp_path, 'ed25519')}.pub")
    ssh2 = subprocess.run(
        ["ssh-keygen", "-e", "-f", str(pub)], check=True, capture_output=True, text=True
    ).stdout
    refused(ssh2, "ssh-keygen -i")


@needs_keygen
def test_declared_type_must_match_the_blob(tmp_path: Path) -> None:
    _, data, _ = Path(f"{keygen(tmp_path, 'ed25519')}.pub").read_text().split()
    refused(f"ssh-rsa {data}", "'ssh-ed25519' key but the line declares 'ssh-rsa'")
    refused(f"ecdsa-sha2-nistp256 {data}", "declares")


def test_sk_keys_are_accepted() -> None:
    ed = wire(b"sk-ssh-ed25519@openssh.com", b"\x01" * 32, b"ssh:")
    normalised, fp = parse_public_key(f"sk-ssh-ed25519@openssh.com {ed} yubikey")
    assert normalised == f"sk-ssh-ed25519@openssh.com {ed} yubikey"
    assert fp.startswith("SHA256:")
    point = p256_point()
    ec_blob = wire(b"sk-ecdsa-sha2-nistp256@openssh.com", b"nistp256", point, b"ssh:")
    parse_public_key(f"sk-ecdsa-sha2-nistp256@openssh.com {ec_blob}")
    # A point of the right size that is not on the curve is no key.
    off = wire(b"sk-ecdsa-sha2-nistp256@openssh.com", b"nistp256", b"\x04" + b"\x02" * 64, b"ssh:")
    refused(f"sk-ecdsa-sha2-nistp256@openssh.com {off}", "not on its curve")
    refused(
        "sk-ssh-ed25519@openssh.com " + wire(b"sk-ssh-ed25519@openssh.com", b"\x01" * 32, b""),
        "application is empty",
    )


@needs_keygen
def test_sk_fingerprint_matches_ssh_keygen(tmp_path: Path) -> None:
    line = "sk-ssh-ed25519@openssh.com " + wire(
        b"sk-ssh-ed25519@openssh.com", bytes(range(32)), b"ssh:"
    )
    pub = tmp_path / "sk.pub"
    pub.write_text(line + "\n")
    assert parse_public_key(line)[1] == keygen_fingerprint(pub)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "is empty"),
        ("   \n", "is empty"),
        ("ssh-ed25519", "base64 key data"),
        ("ssh-dss AAAAB3NzaC1kc3MAAACBAP", "unsupported key type 'ssh-dss'"),
        ('command="ls" ssh-ed25519 AAAA', "unsupported key type"),
        ("ssh-ed25519-cert-v01@openssh.com AAAA", "unsupported key type"),
        ("ssh-ed25519 not*base64", "not valid base64"),
        ("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI", "not valid base64"),
        ("ssh-ed25519 AAAA", "truncated"),
        ("ssh-ed25519 " + wire(b"ssh-ed25519"), "truncated"),
        ("ssh-ed25519 " + wire(b"ssh-ed25519", b"\x01" * 31), "not 32 bytes"),
        ("ssh-ed25519 " + wire(b"ssh-ed25519", b"\x01" * 32, b"x"), "trailing bytes"),
        ("ssh-rsa " + wire(b"ssh-rsa", b"\x01\x00\x01", b"\x00" + b"\xff" * 64), "at least 1024"),
        ("ssh-rsa " + wire(b"ssh-rsa", b"\x01\x00\x01", b"\xff" * 256), "not a positive"),
        ("ssh-rsa " + wire(b"ssh-rsa", b"", b"\x7f" * 256), "not a positive"),
        (
            "ecdsa-sha2-nistp256 " + wire(b"ecdsa-sha2-nistp256", b"nistp384", b"\x04" + b"1" * 64),
            "curve 'nistp256'",
        ),
        (
            "ecdsa-sha2-nistp256 " + wire(b"ecdsa-sha2-nistp256", b"nistp256", b"\x04" + b"1" * 63),
            "malformed",
        ),
        (
            "ecdsa-sha2-nistp384 " + wire(b"ecdsa-sha2-nistp384", b"nistp384", b"\x03" + b"1" * 96),
            "malformed",
        ),
        ("ssh-ed25519 AAAA\nssh-ed25519 AAAA", "one line"),
        ("ssh-ed25519 " + wire(b"ssh-ed25519", b"\x01" * 32) + " bad\x07comment", "control"),
        ("ssh-ed25519 " + "A" * 20000, "longer than"),
    ],
)
def test_malformed_keys_are_refused(text: str, needle: str) -> None:
    refused(text, needle)


@pytest.mark.parametrize("value", [None, 42, ["ssh-ed25519 AAAA"], {"key": "x"}])
def test_non_strings_are_refused(value: object) -> None:
    refused(value, "must be a string")


def test_a_good_ecdsa_key_with_trailing_bytes_says_so() -> None:
    blob = wire(b"ecdsa-sha2-nistp256", b"nistp256", p256_point(), b"x")
    refused(f"ecdsa-sha2-nistp256 {blob}", "trailing bytes")
    good = wire(b"ecdsa-sha2-nistp256", b"nistp256", p256_point())
    assert parse_public_key(f"ecdsa-sha2-nistp256 {good}")[1].startswith("SHA256:")
