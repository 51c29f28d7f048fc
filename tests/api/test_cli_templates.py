"""``gpuyard templates ...`` and ``gpuyard clusters create --template`` against a live
server over real HTTP (FakeRuntime): create, list, get, update, delete; secret env
values masked in every output; errors printed as the other commands print them;
another account's key naming this account's template hears not-found."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from gpuyard.cli.main import cli
from gpuyard.core.secret_env import MASK
from gpuyard.services.tenancy.auth import Scope, create_account, issue_key
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.helpers import LiveServer, live_server, make_settings

SECRET = "hf_cli_secret_value_1234"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LiveServer]:
    with live_server(make_settings(tmp_path / "home"), FakeRuntime()) as live:
        yield live


def run(server: LiveServer, *args: str, key: str | None = None, stdin: str | None = None) -> Result:
    env = {
        "GPUYARD_URL": server.url,
        "GPUYARD_API_KEY": key or server.key,
        "GPUYARD_HOME": str(server.server.ctx.settings.home),
    }
    return CliRunner().invoke(cli, list(args), env=env, input=stdin)


def ok_json(result: Result) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def other_key(server: LiveServer) -> str:
    with server.server.ctx.transaction() as session:
        user, account, _ = create_account(session, email="b@example.com", name="b")
        return issue_key(
            session, user_id=user.id, account_id=account.id, name="b", scope=Scope.WRITE
        ).key


def test_templates_create_list_get_update_delete(server: LiveServer, tmp_path: Path) -> None:
    auth = ok_json(
        run(
            server, "registry-auths", "create", "reg", "--username", "bot", "--password-stdin",
            "--json", stdin="pw\n",
        )
    )  # fmt: skip
    script = tmp_path / "start.sh"
    script.write_text("echo hi\nexec sleep infinity\n")
    made = ok_json(
        run(
            server, "templates", "create", "jupyter", "--image", "runpod/pytorch:2.1",
            "--env", "MODE=dev", "--secret-env", f"HF_TOKEN={SECRET}", "--port", "8888/http",
            "--port", "22", "--container-disk-gb", "15", "--volume-gb", "2",
            "--registry-auth", str(auth["id"]), "--start-script-file", str(script), "--json",
        )
    )  # fmt: skip
    tid = made["id"]
    assert made["env"] == {"MODE": "dev", "HF_TOKEN": MASK}
    assert [(p["internal_port"], p["protocol"]) for p in made["ports"]] == [
        (8888, "http"),
        (22, "tcp"),
    ]
    assert made["container_registry_auth_id"] == str(auth["id"])
    assert made["start_script"] == script.read_text()

    table = run(server, "templates", "list")
    assert table.exit_code == 0 and tid in table.stdout and "jupyter" in table.stdout
    shown = run(server, "templates", "get", tid)
    assert shown.exit_code == 0, shown.output
    assert "runpod/pytorch:2.1" in shown.stdout and f"HF_TOKEN={MASK}" in shown.stdout
    for out in (table.output, shown.output):
        assert SECRET not in out

    changed = ok_json(
        run(server, "templates", "update", tid, "--name", "jl", "--no-registry-auth", "--json")
    )
    assert changed["name"] == "jl" and changed["container_registry_auth_id"] is None
    assert changed["env"] == {"MODE": "dev", "HF_TOKEN": MASK}  # untouched
    nothing = run(server, "templates", "update", tid)
    assert nothing.exit_code != 0 and "nothing to change" in nothing.output

    # A cluster from the template: its start script is the command (no docker args).
    cluster = ok_json(run(server, "clusters", "create", "--template", tid, "--json"))
    assert cluster["template_id"] == tid and cluster["docker_image"] == "runpod/pytorch:2.1"
    assert cluster["docker_args"].startswith("/bin/sh -c ")
    assert cluster["env"]["HF_TOKEN"] == MASK
    assert run(server, "clusters", "create").exit_code != 0  # neither --image nor --template

    assert run(server, "templates", "delete", tid).exit_code == 0
    assert ok_json(run(server, "templates", "list", "--json")) == {"templates": []}


def test_template_errors_print_like_the_other_commands(server: LiveServer) -> None:
    made = run(server, "templates", "create", "t", "--image", "img", "--registry-auth", "999")
    assert made.exit_code != 0
    assert "error: VALIDATION_ERROR: container_registry_auth_id" in made.output
    bad = run(server, "templates", "create", "t", "--image", "img", "--env", "NOEQUALS")
    assert bad.exit_code != 0 and "KEY=VALUE" in bad.output
    ok_json(run(server, "templates", "create", "t", "--image", "img", "--json"))
    taken = run(server, "templates", "create", "t", "--image", "img")
    assert taken.exit_code != 0 and "error: TEMPLATE_EXISTS" in taken.output
    missing = run(server, "templates", "get", "nosuchtemplate")
    assert missing.exit_code != 0 and "error: TEMPLATE_NOT_FOUND" in missing.output
    as_json = run(server, "templates", "get", "nosuchtemplate", "--json")
    assert as_json.exit_code != 0 and "TEMPLATE_NOT_FOUND" in as_json.output


def test_another_accounts_key_cannot_reach_a_template(server: LiveServer) -> None:
    tid = ok_json(run(server, "templates", "create", "mine", "--image", "img", "--json"))["id"]
    theirs = other_key(server)
    for args in (
        ("templates", "get", tid),
        ("templates", "update", tid, "--name", "stolen"),
        ("templates", "delete", tid),
    ):
        r = run(server, *args, key=theirs)
        assert r.exit_code != 0 and "TEMPLATE_NOT_FOUND" in r.output, (args, r.output)
    assert ok_json(run(server, "templates", "list", "--json", key=theirs)) == {"templates": []}
    used = run(server, "clusters", "create", "--template", tid, "--json", key=theirs)
    assert used.exit_code != 0 and "template_id" in used.output
    assert ok_json(run(server, "templates", "get", tid, "--json"))["name"] == "mine"


def test_registry_auths_update_from_the_cli(server: LiveServer) -> None:
    auth = ok_json(
        run(
            server, "registry-auths", "create", "reg", "--username", "bot", "--password-stdin",
            "--json", stdin="pw\n",
        )
    )  # fmt: skip
    aid = str(auth["id"])
    renamed = ok_json(run(server, "registry-auths", "update", aid, "--name", "reg2", "--json"))
    assert renamed == {**auth, "name": "reg2"}
    changed = run(
        server, "registry-auths", "update", aid, "--username", "bot2", "--password-stdin",
        stdin=SECRET + "\n",
    )  # fmt: skip
    assert changed.exit_code == 0 and "reg2" in changed.stdout and SECRET not in changed.output
    empty = run(server, "registry-auths", "update", aid)
    assert empty.exit_code != 0 and "--password" in empty.output
    theirs = run(server, "registry-auths", "update", aid, "--name", "x", key=other_key(server))
    assert theirs.exit_code != 0 and "REGISTRY_AUTH_NOT_FOUND" in theirs.output
