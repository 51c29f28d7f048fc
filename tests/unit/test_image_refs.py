"""Image references and the registry allow-list (core/image_refs.py): an image name
must not make the engine connect to an address or a registry the operator did not
allow."""

from __future__ import annotations

import ipaddress

import pytest

from gpuyard.core.errors import ValidationFailed
from gpuyard.core.image_refs import (
    DEFAULT_ALLOWED_REGISTRIES,
    RegistryPolicy,
    check_image,
    parse_image_ref,
)
from gpuyard.settings import Settings

DEFAULT = RegistryPolicy.parse(DEFAULT_ALLOWED_REGISTRIES)
DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("reference", "registry", "path", "tag", "digest"),
    [
        ("ubuntu", "docker.io", "ubuntu", None, None),
        ("ubuntu:22.04", "docker.io", "ubuntu", "22.04", None),
        ("pytorch/pytorch:2.2-cuda12.1", "docker.io", "pytorch/pytorch", "2.2-cuda12.1", None),
        ("docker.io/library/ubuntu", "docker.io", "library/ubuntu", None, None),
        ("index.docker.io/library/ubuntu", "docker.io", "library/ubuntu", None, None),
        ("ghcr.io/org/img:v1", "ghcr.io", "org/img", "v1", None),
        (f"ghcr.io/org/img@{DIGEST}", "ghcr.io", "org/img", None, DIGEST),
        (f"ghcr.io/org/img:v1@{DIGEST}", "ghcr.io", "org/img", "v1", DIGEST),
        ("reg.example.com:5000/team/img:1", "reg.example.com:5000", "team/img", "1", None),
        ("127.0.0.1:8765/x", "127.0.0.1:8765", "x", None, None),
        ("[::1]:5000/x:t", "[::1]:5000", "x", "t", None),
        ("[fe80::1]/x", "[fe80::1]", "x", None, None),
        ("localhost/gpuyard/busybox:latest", "localhost", "gpuyard/busybox", "latest", None),
        ("localhost:5000/x", "localhost:5000", "x", None, None),
        # An upper-case first component is a registry (as the engines read it).
        ("Registry/x", "registry", "x", None, None),
        # No '.', ':' or 'localhost': a Docker Hub namespace, not a registry.
        ("2130706433/x", "docker.io", "2130706433/x", None, None),
    ],
)  # fmt: skip
def test_references_parse_as_the_engines_read_them(
    reference: str, registry: str, path: str, tag: str | None, digest: str | None
) -> None:
    ref = parse_image_ref(reference)
    assert (ref.registry.text, ref.path, ref.tag, ref.digest) == (registry, path, tag, digest)


@pytest.mark.parametrize(
    "reference",
    [
        "",
        "two words",
        "x/Y",
        "x:y:z",
        "img@sha256:short",
        "img:" + "t" * 129,
        "::1/x",
        "[::1/x",
        "[::1]5000/x",
        "[not-v6]/x",
        "host:port/x",
        "host:99999/x",
        "-bad.example.com/x",
        "ghcr.io/",
        "ghcr.io//x",
        "x" * 256,
        "a\nb",
    ],
)
def test_malformed_references_are_refused(reference: str) -> None:
    with pytest.raises(ValueError):
        parse_image_ref(reference)
    with pytest.raises(ValidationFailed) as info:
        check_image(reference, DEFAULT, "docker_image")
    assert info.value.field == "docker_image"


@pytest.mark.parametrize(
    ("host", "address"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("0x7f.0.0.1", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("0x7f000001.", "127.0.0.1"),
        ("10.0.0.5", "10.0.0.5"),
        ("0.0", "0.0.0.0"),
    ],
)
def test_resolver_forms_of_ipv4_are_addresses(host: str, address: str) -> None:
    """The C resolver reads these as addresses without DNS, so must the check."""
    got = parse_image_ref(f"{host}/x").registry.address
    assert got == ipaddress.ip_address(address)


@pytest.mark.parametrize(
    "reference",
    [
        "ubuntu",
        "ubuntu:22.04",
        "pytorch/pytorch:2.2-cuda12.1-devel",
        "runpod/pytorch:2.1",
        "docker.io/library/ubuntu",
        "index.docker.io/library/ubuntu",
        "ghcr.io/org/img:v1",
        f"quay.io/org/img@{DIGEST}",
        "nvcr.io/nvidia/pytorch:24.01-py3",
        "registry.k8s.io/pause:3.9",
        "gcr.io/project/img",
        "public.ecr.aws/lambda/python:3.12",
        "mcr.microsoft.com/azureml/openmpi4.1.0-ubuntu22.04",
        "localhost/gpuyard/busybox:latest",
        "localhost/gpuyard/slurm-node:latest",
    ],
)
def test_the_default_allows_public_registries_and_local_images(reference: str) -> None:
    check_image(reference, DEFAULT, "docker_image")


@pytest.mark.parametrize(
    "reference",
    [
        "127.0.0.1:8765/x",
        "127.0.0.1/x",
        "127.1/x",
        "0x7f.1/x",
        "[::1]:5000/x",
        "[::1]/x",
        "[::ffff:127.0.0.1]:5000/x",
        "[fe80::1]/x",
        "[fd00::5]:5000/x",
        "10.0.0.5/x",
        "172.16.0.1:5000/x",
        "192.168.1.1/x",
        "169.254.169.254/x",
        "0.0.0.0:80/x",
        "8.8.8.8/x",
        "localhost:5000/x",
        "localhost:8000/x",
        "foo.localhost/x",
        "evil.example.com/x",
        "registry-1.docker.io/x",
        "ghcr.io:443/x",
        "ghcr.io.evil.com/x",
    ],
)
def test_the_default_refuses_addresses_and_unlisted_registries(reference: str) -> None:
    with pytest.raises(ValidationFailed) as info:
        check_image(reference, DEFAULT, "imageName")
    assert info.value.field == "imageName"
    assert info.value.details["registry"] == parse_image_ref(reference).registry.text


def test_wildcards_match_names_under_them_only() -> None:
    policy = RegistryPolicy.parse("*.example.com,*.corp.test:5000")
    check_image("a.example.com/x", policy, "f")
    check_image("a.b.example.com/x:1", policy, "f")
    check_image("reg.corp.test:5000/x", policy, "f")
    for refused in (
        "example.com/x",  # the wildcard is for names under it
        "a.example.com:5000/x",  # another port
        "reg.corp.test/x",  # no port
        "evilexample.com/x",
        "ubuntu",  # Docker Hub is not listed
    ):
        with pytest.raises(ValidationFailed):
            check_image(refused, policy, "f")


@pytest.mark.parametrize(
    "reference",
    [
        "127.0.0.1:8765/x",
        "10.0.0.5/x",
        "[::1]:5000/x",
        "169.254.169.254/x",
        "localhost:5000/x",
        "a.localhost/x",
        "localhost/x",
    ],
)
def test_a_wildcard_never_lets_in_an_address_or_localhost(reference: str) -> None:
    with pytest.raises(ValidationFailed):
        check_image(reference, RegistryPolicy.parse("*,*.example.com"), "f")


def test_an_address_is_allowed_only_when_listed_exactly() -> None:
    policy = RegistryPolicy.parse("public,10.0.0.5:5000,[fd00::5]:5000,localhost:5000")
    check_image("10.0.0.5:5000/team/x:1", policy, "f")
    check_image("[fd00::5]:5000/x", policy, "f")
    check_image("[fd00:0::5]:5000/x", policy, "f")  # the same address, written longer
    check_image("localhost:5000/x", policy, "f")
    check_image("ubuntu", policy, "f")  # `public` kept the public registries
    for refused in (
        "10.0.0.5/x",  # another port
        "10.0.0.5:5001/x",
        "10.0.0.6:5000/x",
        "[fd00::6]:5000/x",
        "127.0.0.1:5000/x",
        "localhost/x",  # local images are an entry of their own
    ):
        with pytest.raises(ValidationFailed):
            check_image(refused, policy, "f")


@pytest.mark.parametrize("setting", ["*.10.0.0.5", "ghcr.io:x", "bad host", "[::1", "*.:5000"])
def test_malformed_settings_fail_at_start_up(setting: str) -> None:
    with pytest.raises(ValueError):
        RegistryPolicy.parse(setting)
    with pytest.raises(ValueError):
        Settings(allowed_registries=setting)


def test_the_setting_defaults_to_public_registries_and_local_images() -> None:
    settings = Settings()
    assert settings.allowed_registries == DEFAULT_ALLOWED_REGISTRIES
    assert settings.registry_policy == DEFAULT
    assert "docker.io" in DEFAULT.listed_names() and "localhost" in DEFAULT.listed_names()


def test_error_details_do_not_show_listed_addresses() -> None:
    """A private registry's address the operator listed is not shown to users."""
    policy = RegistryPolicy.parse("ghcr.io,*.example.com,10.0.0.5:5000")
    with pytest.raises(ValidationFailed) as info:
        check_image("quay.io/x", policy, "f")
    assert info.value.details["allowed_registries"] == ["ghcr.io", "*.example.com"]
