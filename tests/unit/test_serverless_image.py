"""The serverless test image's pure parts: which of runpod's requirements go in, ``ldd``
output, what of the standard library is copied, the recipe hash, the handlers and their
plain-HTTP server (run here, on the host, over loopback), and the failure messages."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from gpuyard.cli.main import cli
from gpuyard.core.errors import RuntimeFailure
from gpuyard.core.tls_trust import trusted_tls
from gpuyard.devtools import serverless_handler as handlers
from gpuyard.devtools import serverless_image as image
from tests.helpers import free_port
from tests.required_parts import need_tools

RUNPOD_METADATA = """Metadata-Version: 2.4
Name: runpod
Version: 1.12.0
Requires-Dist: aiohttp[speedups]>=3.14.3
Requires-Dist: aiohttp-retry>=2.9.1
Requires-Dist: boto3>=1.43.66
Requires-Dist: fastapi[all]>=0.141.1
Requires-Dist: InquirerPy==0.3.4
Requires-Dist: paramiko>=5.0.0
Requires-Dist: prettytable>=3.18.0
Requires-Dist: watchdog>=6.0.0
Requires-Dist: pytest; extra == "test"
Requires-Dist: tomli>=2.4.1
Summary: Requires-Dist: not a requirement line
"""


def test_worker_requirements_leave_out_what_no_worker_imports() -> None:
    assert image.worker_requirements(RUNPOD_METADATA) == [
        "aiohttp[speedups]>=3.14.3",
        "aiohttp-retry>=2.9.1",
        "paramiko>=5.0.0",
        "tomli>=2.4.1",
    ]
    # Every omission says who imports it instead.
    assert all(reason for reason in image.OMITTED_REQUIREMENTS.values())


def test_parse_ldd() -> None:
    out = """\tlinux-vdso.so.1 (0x00007ffd)
\tlibpython3.11.so.1.0 => /opt/py/lib/libpython3.11.so.1.0 (0x00007f6c)
\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f6c21a1e000)
\tlibmissing.so.1 => not found
\t/lib64/ld-linux-x86-64.so.2 (0x00007f6c2227c000)
"""
    assert image.parse_ldd(out) == [
        Path("/opt/py/lib/libpython3.11.so.1.0"),
        Path("/lib/x86_64-linux-gnu/libc.so.6"),
        Path("/lib64/ld-linux-x86-64.so.2"),
    ]
    assert image.parse_ldd("\tstatically linked\n") == []


def fake_python(root: Path) -> image.HostPython:
    stdlib = root / "lib" / "python3.11"
    for rel in (
        "os.py",
        "json/__init__.py",
        "json/__pycache__/__init__.cpython-311.pyc",
        "json/__pycache__/__init__.cpython-311.opt-1.pyc",
        "test/test_os.py",
        "site-packages/big/__init__.py",
        "tkinter/__init__.py",
        "config-3.11-x86_64-linux-gnu/libpython3.11.a",
        "lib-dynload/_json.cpython-311-x86_64-linux-gnu.so",
        "lib-dynload/_tkinter.cpython-311-x86_64-linux-gnu.so",
        "lib-dynload/_testcapi.cpython-311-x86_64-linux-gnu.so",
    ):
        (stdlib / rel).parent.mkdir(parents=True, exist_ok=True)
        (stdlib / rel).write_bytes(b"x")
    exe = root / "bin" / "python3.11"
    exe.parent.mkdir(parents=True)
    exe.write_bytes(b"\x7fELF")
    return image.HostPython(exe, stdlib, stdlib / "lib-dynload", "3.11.0 (test)")


def test_stdlib_copy_leaves_out_tests_guis_and_installed_packages(tmp_path: Path) -> None:
    python = fake_python(tmp_path)
    copied = sorted(str(p.relative_to(python.stdlib)) for p in image.stdlib_files(python))
    assert copied == [
        "json/__init__.py",
        "json/__pycache__/__init__.cpython-311.pyc",
        "lib-dynload/_json.cpython-311-x86_64-linux-gnu.so",
        "os.py",
    ]


def test_recipe_digest_covers_wheels_and_interpreter(tmp_path: Path) -> None:
    need_tools(image.BUSYBOX_PATH, how="apt-get install busybox-static")
    python = fake_python(tmp_path / "py")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    first = image.recipe_digest(python, wheels)
    assert first == image.recipe_digest(python, wheels) and len(first) == 16
    (wheels / "runpod-1.12.0-py3-none-any.whl").write_bytes(b"one")
    with_wheel = image.recipe_digest(python, wheels)
    assert with_wheel != first
    (wheels / "runpod-1.12.0-py3-none-any.whl").write_bytes(b"two")
    assert image.recipe_digest(python, wheels) != with_wheel
    python.executable.write_bytes(b"\x7fELF another build")
    assert image.recipe_digest(python, wheels) not in (first, with_wheel)


def test_a_complete_wheel_cache_is_used_without_pip(tmp_path: Path) -> None:
    wheel = tmp_path / "runpod-1.12.0-py3-none-any.whl"
    wheel.write_bytes(b"")
    (tmp_path / image.COMPLETE_MARKER).write_text("runpod==1.12.0\n")
    # A pip that cannot run proves it was not asked.
    assert image.ensure_wheels(tmp_path, pip_python="/nonexistent/python") == wheel


def test_an_incomplete_wheel_cache_fetches_and_says_why_it_failed(tmp_path: Path) -> None:
    with pytest.raises(RuntimeFailure) as e:
        image.ensure_wheels(tmp_path, pip_python="/nonexistent/python")
    assert "needs the package index once" in e.value.message


def test_install_without_the_runpod_wheel_is_a_clear_failure(tmp_path: Path) -> None:
    with pytest.raises(RuntimeFailure) as e:
        image.install_site(tmp_path, tmp_path / "site")
    assert "runpod-1.12.0-*.whl" in e.value.message


def test_image_runs_the_handler_unbuffered_with_runpod_on_its_path() -> None:
    changes = image.import_changes("abc123")
    assert 'CMD ["python", "-u", "handler.py"]' in changes
    assert f"ENV PYTHONPATH={image.SITE_DIR}" in changes
    assert f"LABEL {image.RECIPE_LABEL}=abc123" in changes
    assert b"runpod.serverless.start(config)" in image.handler_source()


def test_missing_engine_cli_is_a_clear_failure() -> None:
    with pytest.raises(RuntimeFailure) as e:
        image.image_recipe(runtime_cli="gpuyard-no-such-engine")
    assert "not found on PATH" in e.value.message


def test_cli_refuses_two_images_at_once() -> None:
    result = CliRunner().invoke(cli, ["dev-image", "--serverless", "--web"])
    assert result.exit_code == 2 and "pick one" in result.output


# The handlers, as runpod calls them (a job dict), and run outside runpod.


def test_echo_returns_the_input_unchanged() -> None:
    job_input = {"prompt": "hi", "nested": [1, {"a": None}]}
    assert handlers.echo({"id": "j", "input": job_input}) == job_input


def test_stream_yields_every_chunk_in_order() -> None:
    chunks = list(handlers.stream({"id": "j", "input": {"chunks": 4}}))
    assert chunks == [{"index": i, "of": 4} for i in range(4)]
    assert len(list(handlers.stream({"id": "j", "input": None}))) == 3


def test_slow_sleeps_the_input_and_can_be_cancelled() -> None:
    assert handlers.call_handler(handlers.slow, {"id": "j", "input": 0.01})["slept"] == 0.01

    async def cancelled() -> float:
        task = asyncio.create_task(handlers.slow({"id": "j", "input": {"seconds": 60}}))
        await asyncio.sleep(0.01)
        t0 = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return time.monotonic() - t0

    assert asyncio.run(cancelled()) < 1


def test_worker_configs_name_runpods_options() -> None:
    assert handlers.worker_config("echo") == {"handler": handlers.echo}
    assert handlers.worker_config("stream")["return_aggregate_stream"] is True
    assert handlers.worker_config("concurrent")["concurrency_modifier"] is handlers.concurrency
    assert asyncio.iscoroutinefunction(handlers.worker_config("async")["handler"])
    with pytest.raises(ValueError, match="choose one of echo, stream"):
        handlers.worker_config("nope")


def test_concurrency_modifier_reads_concurrency(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONCURRENCY", "7")
    assert handlers.concurrency(1) == 7
    monkeypatch.setenv("CONCURRENCY", "many")
    assert handlers.concurrency(1) == handlers.DEFAULT_CONCURRENCY


def test_call_handler_collects_async_generators() -> None:
    async def agen(job: dict[str, Any]) -> Any:
        for i in range(2):
            yield i

    assert handlers.call_handler(agen, {"input": None}) == [0, 1]
    assert handlers.call_handler(handlers.async_handler, {"input": 5}) == {
        "async": True,
        "input": 5,
    }


@pytest.fixture
def direct() -> Iterator[str]:
    port = free_port()
    server = handlers.make_http_server(handlers.concurrent, port, host="127.0.0.1")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{port}"
    server.shutdown()
    server.server_close()


def test_direct_http_server(direct: str) -> None:
    with httpx.Client(base_url=direct, timeout=10, verify=trusted_tls()) as client:
        assert client.get("/health").json()["status"] == "ok"
        assert client.get("/nope").status_code == 404
        assert client.post("/", content=b"[").status_code == 400
        assert client.post("/", content=json.dumps([1])).status_code == 400
        answer = client.post("/", json={"input": {"seconds": 0}})
        assert answer.status_code == 200 and answer.json()["worker"] == "local"
    with ThreadPoolExecutor(3) as pool:
        outs = list(
            pool.map(
                lambda _: httpx.post(
                    direct, json={"input": {"seconds": 0.5}}, verify=trusted_tls()
                ).json(),
                range(3),
            )
        )
    assert max(o["in_flight_max"] for o in outs) >= 3  # a thread per connection


def test_direct_http_reports_a_failing_handler() -> None:
    def broken(job: dict[str, Any]) -> Any:
        raise RuntimeError("boom")

    port = free_port()
    server = handlers.make_http_server(broken, port, host="127.0.0.1")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        answer = httpx.post(f"http://127.0.0.1:{port}/", json={"input": 1}, verify=trusted_tls())
        assert answer.status_code == 500 and answer.json() == {"error": "RuntimeError: boom"}
    finally:
        server.shutdown()
        server.server_close()
