"""Engine URLs of added hosts (core/network/engine_address.py): the three accepted forms, what
each refuses, one key per engine however it is spelled, and no credentials shown."""

from __future__ import annotations

import pytest

from gpuyard.core.errors import ValidationFailed
from gpuyard.core.network.engine_address import EngineAddress, parse_engine_url, redacted


@pytest.mark.parametrize(
    ("url", "parsed"),
    [
        (
            "unix:///run/podman/podman.sock",
            EngineAddress("unix", None, None, None, "/run/podman/podman.sock"),
        ),
        ("ssh://core@gpu-1.example.com", EngineAddress("ssh", "core", "gpu-1.example.com", 22, "")),
        (
            "ssh://core@GPU-1:2222/run/user/1000/podman/podman.sock",
            EngineAddress("ssh", "core", "gpu-1", 2222, "/run/user/1000/podman/podman.sock"),
        ),
        ("ssh://root@[2001:db8::1]:22", EngineAddress("ssh", "root", "2001:db8::1", 22, "")),
        ("tcp://10.0.0.5:2376", EngineAddress("tcp", None, "10.0.0.5", 2376, "")),
        ("tcp://localhost:2375/", EngineAddress("tcp", None, "localhost", 2375, "")),
    ],
)
def test_accepted_forms(url: str, parsed: EngineAddress) -> None:
    assert parse_engine_url(url) == parsed


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("docker.sock", "must start with"),
        ("http://gpu-1:2375", "must start with"),
        ("unix://run/podman.sock", "absolute socket path"),
        ("unix:///run/../etc/x.sock", "normalised"),
        ("ssh://gpu-1", "login name"),
        ("ssh://@gpu-1", "login name"),
        ("ssh://root:hunter2@gpu-1", "password"),
        ("ssh://root:@gpu-1", "password"),
        ("ssh://root@gpu-1:0", "port"),
        ("ssh://root@gpu-1:", "port"),
        ("ssh://root@gpu-1:70000", "port"),
        ("ssh://root@gpu%2d1", "percent"),
        ("ssh://root@-gpu", "not a host name"),
        ("ssh://root@2001:db8::1", "brackets"),
        ("ssh://root@gpu-1/a//b.sock", "normalised"),
        ("ssh://root@gpu-1 -oProxyCommand=x", "white space"),
        ("ssh://-oProxyCommand=x@gpu-1", "login name"),
        ("tcp://gpu-1", "needs a port"),
        ("tcp://admin@gpu-1:2376", "no user"),
        ("tcp://gpu-1:2376/v1.41", "no path"),
        ("tcp://gpu-1:2376?x=1", "query"),
        ("tcp://:2376", "needs a host"),
        ("ssh://root@gpu-1\x00", "control"),
        ("ssh://root@[::1", "not a valid URL"),
        ("tcp://[::1]x:2376", "not host[:port]"),
        ("tcp://[v1.fe]:2376", "not host[:port]"),
        ("tcp://gpu-1:+5", "not host[:port]"),
    ],
)
def test_refusals_say_which_rule(url: str, says: str) -> None:
    with pytest.raises(ValidationFailed) as caught:
        parse_engine_url(url)
    assert caught.value.field == "engine_url"
    assert says in caught.value.message


def test_one_key_per_engine() -> None:
    same = ["ssh://core@GPU-1", "ssh://core@gpu-1:22", "ssh://core@gpu-1/"]
    assert len({parse_engine_url(u).key for u in same}) == 1
    others = ["ssh://alice@gpu-1", "ssh://core@gpu-1:2222", "ssh://core@gpu-1/run/d.sock"]
    assert len({parse_engine_url(u).key for u in [same[0], *others]}) == 4


def test_loopback() -> None:
    assert parse_engine_url("unix:///run/d.sock").loopback
    assert parse_engine_url("tcp://127.0.0.2:2375").loopback
    assert parse_engine_url("tcp://[::1]:2375").loopback
    assert parse_engine_url("tcp://localhost:2375").loopback
    assert not parse_engine_url("tcp://10.0.0.1:2375").loopback


def test_shown_urls_carry_no_credentials() -> None:
    assert redacted("ssh://core@gpu-1:22") == "ssh://core@gpu-1:22"
    assert redacted("tcp://user:secret@gpu-1:2376/?token=abc") == "tcp://user@gpu-1:2376/"
    assert redacted(None) is None
