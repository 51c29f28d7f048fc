"""Pull errors reach users as fixed messages (runtimes/engines/pull_errors.py): whatever the
engine says about the address it dialled and how the connection ended, a closed, an
open and an HTTP port read the same."""

from __future__ import annotations

import re

import docker.errors
import pytest
import requests

from gpuyard.core.errors import RuntimeFailure
from gpuyard.runtimes.engines import pull_errors
from gpuyard.runtimes.engines.pull_errors import FAILED, NOT_FOUND, UNREACHABLE, USER_MESSAGES

# What Podman 4.3 and Docker say when the registry host:port is closed, open but not a
# registry, an HTTP server, slow, or unknown.
UNREACHABLE_TEXTS = [
    "initializing source docker://127.0.0.1:8765/x:latest: pinging container registry "
    '127.0.0.1:8765: Get "https://127.0.0.1:8765/v2/": dial tcp 127.0.0.1:8765: connect: '
    "connection refused",
    "initializing source docker://127.0.0.1:8765/x:latest: pinging container registry "
    '127.0.0.1:8765: Get "https://127.0.0.1:8765/v2/": http: server gave HTTP response to '
    "HTTPS client",
    "initializing source docker://127.0.0.1:8765/x:latest: pinging container registry "
    '127.0.0.1:8765: Get "https://127.0.0.1:8765/v2/": EOF',
    "pinging container registry 127.0.0.1:8765: invalid status code from registry 404 (Not Found)",
    'Get "https://10.0.0.5:5000/v2/": tls: first record does not look like a TLS handshake',
    'Get "https://10.0.0.5:5000/v2/": net/http: TLS handshake timeout',
    'Get "https://10.0.0.5:5000/v2/": dial tcp 10.0.0.5:5000: i/o timeout',
    'Get "https://nope.example.com/v2/": dial tcp: lookup nope.example.com: no such host',
    'Get "https://10.0.0.5:5000/v2/": x509: certificate signed by unknown authority',
    "error parsing HTTP 404 response body: invalid character 'p' after top-level value: "
    '"404 page not found\\n"',
    'Get "https://10.0.0.5:5000/v2/": read tcp 10.0.0.1:40000->10.0.0.5:5000: read: '
    "connection reset by peer",
]
NOT_FOUND_TEXTS = [
    "initializing source docker://nosuch:latest: reading manifest latest in "
    "docker.io/library/nosuch: requested access to the resource is denied",
    "manifest for nosuch:latest not found: manifest unknown: manifest unknown",
    "pull access denied for nosuch, repository does not exist or may require "
    "'docker login': denied: requested access to the resource is denied",
    "reading manifest v9 in ghcr.io/org/img: manifest unknown",
    "name unknown: repository name not known to registry",
]
# The registry asked for credentials, or refused the ones given.
CREDENTIALS_TEXTS = [
    "unauthorized: authentication required",
    "initializing source docker://127.0.0.1:5000/busybox:latest: reading manifest latest "
    "in 127.0.0.1:5000/busybox: authentication required",
    'Head "http://127.0.0.1:5000/v2/busybox/manifests/latest": unauthorized: '
    "authentication required",
    "unauthorized: incorrect username or password",
]
# Any address, port or engine wording in a message would tell ports apart again.
LEAKS = re.compile(r"\d+\.\d+\.\d+\.\d+|:\d{2,5}\b|dial|refused|tls|http|eof", re.IGNORECASE)


@pytest.mark.parametrize("text", UNREACHABLE_TEXTS)
def test_connection_level_failures_all_read_registry_unreachable(text: str) -> None:
    assert pull_errors.user_message(text) == UNREACHABLE


@pytest.mark.parametrize("text", NOT_FOUND_TEXTS)
def test_registry_answers_read_not_found_or_denied(text: str) -> None:
    assert pull_errors.user_message(text) == NOT_FOUND


@pytest.mark.parametrize("text", CREDENTIALS_TEXTS)
def test_a_registry_asking_for_credentials_reads_credentials_needed(text: str) -> None:
    assert pull_errors.user_message(text) == pull_errors.CREDENTIALS_NEEDED
    assert "registry_auth_id" in pull_errors.CREDENTIALS_NEEDED


def test_anything_else_reads_image_pull_failed() -> None:
    assert pull_errors.user_message("writing blob: no space left on device") == FAILED
    assert pull_errors.user_message("") == FAILED


def test_the_fixed_messages_carry_no_network_detail() -> None:
    for message in USER_MESSAGES:
        assert not LEAKS.search(message), message


def _api_error(status: int, explanation: str) -> docker.errors.APIError:
    response = requests.Response()
    response.status_code = status
    cls = docker.errors.NotFound if status == 404 else docker.errors.APIError
    return cls(f"{status} Server Error", response=response, explanation=explanation)


def test_sdk_errors_and_wrapped_ones_are_mapped() -> None:
    refused = _api_error(
        500,
        'Get "https://127.0.0.1:8765/v2/": dial tcp 127.0.0.1:8765: connect: connection refused',
    )
    assert pull_errors.from_exception(refused) == UNREACHABLE
    # Docker answers 404 for a pull the registry refused.
    missing = _api_error(404, "pull access denied for nosuch, repository does not exist")
    assert pull_errors.from_exception(missing) == NOT_FOUND
    assert pull_errors.from_exception(_api_error(404, "")) == NOT_FOUND
    assert pull_errors.from_exception(_api_error(500, "something else")) == FAILED
    # Engine.errors wraps the SDK's exception in a RuntimeFailure whose cause it is.
    try:
        try:
            raise refused
        except docker.errors.APIError as e:
            raise RuntimeFailure("pulling image x failed: ...") from e
    except RuntimeFailure as wrapped:
        assert pull_errors.from_exception(wrapped) == UNREACHABLE
    timeout = requests.exceptions.ReadTimeout("Read timed out. (read timeout=60)")
    assert pull_errors.from_exception(timeout) == UNREACHABLE
