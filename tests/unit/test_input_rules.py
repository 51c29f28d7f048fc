"""core/input_rules.py: the pure rules every surface applies to user input."""

from __future__ import annotations

import json
import time

import pytest

from gpuyard.core.errors import ValidationFailed
from gpuyard.core.input_rules import (
    MAX_DB_ID,
    check_env_limits,
    check_mount_path,
    check_name,
    check_text,
    json_too_deep,
    parse_id,
    value_too_deep,
)


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize(
    ("text", "deep"),
    [
        (nested(64), False),
        (nested(65), True),
        ('{"a":' * 64 + "1" + "}" * 64, False),
        ('{"a":' * 65 + "1" + "}" * 65, True),
        # Wide, not deep: many siblings at depth 3.
        ("[" + ",".join([nested(2)] * 1000) + "]", False),
        # Brackets inside strings, with escaped quotes, nest nothing.
        (json.dumps(["[" * 1000, '\\"[[[' * 100, "{" * 1000]), False),
        (json.dumps({"k" * 10: "]" * 100 + "[" * 100}), False),
        # Depth reached in steps rather than in one run of openers.
        ("[1," * 70 + "1" + "]" * 70, True),
        ("[[]," * 70 + "1" + "]" * 70, True),
        (nested(100_000), True),
    ],
)
def test_json_depth(text: str, deep: bool) -> None:
    assert json_too_deep(text) is deep
    assert json_too_deep(text.encode()) is deep
    if not deep:
        assert value_too_deep(json.loads(text)) is False


def test_json_depth_agrees_with_the_parsed_value() -> None:
    for depth in (1, 10, 63, 64, 65, 200):
        value = json.loads(nested(depth))
        assert value_too_deep(value) is (depth > 64)
        assert json_too_deep(nested(depth)) is (depth > 64)


def test_json_depth_of_hostile_text_is_quick() -> None:
    # Unterminated strings full of escapes must not make the scan quadratic.
    for text in (
        b'"\\"' * 200_000,
        b'"' + b"\\" * 400_000,
        b"[" * 400_000,
        nested(200_000).encode(),
    ):
        started = time.perf_counter()
        json_too_deep(text)
        assert time.perf_counter() - started < 2.0


def test_env_limits() -> None:
    check_env_limits({f"K{i}": "v" for i in range(256)})
    with pytest.raises(ValueError, match="257 environment variables; at most 256"):
        check_env_limits({f"K{i}": "v" for i in range(257)})
    check_env_limits({"N" * 256: "v"})
    with pytest.raises(ValueError, match="longer than 256"):
        check_env_limits({"N" * 257: "v"})
    check_env_limits({"V": "x" * 32 * 1024})
    with pytest.raises(ValueError, match="32769 bytes"):
        check_env_limits({"V": "x" * (32 * 1024 + 1)})
    with pytest.raises(ValueError, match="bytes"):
        check_env_limits({"V": "€" * 11_000})  # 33,000 bytes in UTF-8
    # Each under 32 KiB, together over 256 KiB.
    with pytest.raises(ValueError, match="at most 262144"):
        check_env_limits({f"K{i}": "x" * 30_000 for i in range(9)})
    check_env_limits({"REMOVED": None})


@pytest.mark.parametrize(
    "name", ["a\u202eb", "\u202a", "\u202d", "\u2066", "\u2069", "\u200e", "\u200f", "\u061c"]
)
def test_bidi_controls_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="bidirectional"):
        check_name(name)
    with pytest.raises(ValueError):
        check_text(name)


@pytest.mark.parametrize("char", ["\x00", "\x07", "\t", "\n", "\r", "\x1b", "\x7f", "\x85", "\x9f"])
def test_control_characters_are_refused_in_names(char: str) -> None:
    with pytest.raises(ValueError, match=f"U\\+{ord(char):04X} at position 1"):
        check_name("a" + char)


def test_descriptions_may_span_lines() -> None:
    assert check_text("one\n\ttwo\r\n") == "one\n\ttwo\r\n"
    with pytest.raises(ValueError):
        check_text("bell\x07")
    for fine in ("Café", "日本語", "emoji 🚀 ok", "a-b_c.d (e)", "zero\u200dwidth joiner"):
        assert check_name(fine) == fine


@pytest.mark.parametrize(
    "path",
    ["/workspace", "/data/models", "/root", "/opt/app-1.2", "/var/lib/x", "/mnt/a@b+c=d~e"],
)
def test_allowed_mount_paths(path: str) -> None:
    assert check_mount_path(path) == path


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("/", "not be '/'"),
        ("workspace", "absolute"),
        ("", "absolute"),
        ("/workspace/", "normalised"),
        ("//workspace", "normalised"),
        ("/a//b", "normalised"),
        ("/a/../b", "'..'"),
        ("/a/./b", "'.'"),
        ("/..", "'..'"),
        ("/a:ro", "may hold only"),
        ("/a,b", "may hold only"),
        ("/a b", "may hold only"),
        ("/a\nb", "may hold only"),
        ("/" + "a" * 600, "at most 512"),
        ("/sys", "/sys"),
        ("/proc/1", "/proc"),
        ("/dev/shm", "/dev"),
        ("/etc", "/etc"),
        ("/usr/local", "/usr"),
        ("/bin", "/bin"),
        ("/sbin", "/sbin"),
        ("/lib", "/lib"),
        ("/lib32", "/lib32"),
        ("/lib64/x", "/lib64"),
        ("/libx32", "/libx32"),
        ("/boot", "/boot"),
        ("/run/user", "/run"),
        ("/var/run", "/var/run"),
        ("/var/lock/x", "/var/lock"),
    ],
)
def test_refused_mount_paths(path: str, why: str) -> None:
    with pytest.raises(ValueError, match=why.replace(".", r"\.")):
        check_mount_path(path)


def test_parse_id() -> None:
    assert parse_id("p", None) is None
    assert parse_id("p", "") is None
    assert parse_id("p", "7") == 7
    assert parse_id("p", str(MAX_DB_ID)) == MAX_DB_ID
    for bad in (str(MAX_DB_ID + 1), "0", "-1", "+1", " 1", "1.0", "1_0", "\u0661", "9" * 5000):
        with pytest.raises(ValidationFailed) as caught:
            parse_id("p", bad)
        assert caught.value.field == "p"
    with pytest.raises(ValidationFailed, match="required"):
        parse_id("p", None, required=True)
