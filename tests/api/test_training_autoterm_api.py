"""A training cluster's auto-termination policy over real HTTP and through the CLI:
given on create, changed by ``update_auto_terminate``, refused in the training
envelope with the clusters' bounds, shown in the detail with its countdown."""

from __future__ import annotations

import json
from typing import Any

from click.testing import CliRunner
from sqlalchemy import select

from gpuyard.cli.main import cli
from gpuyard.store.schema import Host
from tests.api.test_training_api import (  # noqa: F401 (fixtures)
    BASE,
    assert_error,
    body,
    params,
    set_status,
    setup,
    tsrv,
)
from tests.helpers import LiveServer


def test_policy_on_create_by_action_and_in_the_detail(
    tsrv: LiveServer,  # noqa: F811
    setup: dict[str, Any],  # noqa: F811
) -> None:
    with tsrv.client() as c:
        for bad, field in (
            ({"idle_minutes": 0}, "auto_terminate.idle_minutes"),
            ({"cost_limit_usd": 2e6}, "auto_terminate.cost_limit_usd"),
            ({"action": "terminate"}, "auto_terminate.action"),
            ({"when": 1}, "auto_terminate.when"),
            ("soon", "auto_terminate"),
        ):
            r = c.post(BASE, params=params(setup), json=body(setup, auto_terminate=bad))
            assert_error(r, 400, "VALIDATION_ERROR", field)
        r = c.post(
            BASE, params=params(setup), json=body(setup, auto_terminate={"idle_minutes": -1})
        )
        assert "greater than 0 and at most 525,600 (minutes)" in r.json()["message"]

        r = c.post(
            BASE,
            params=params(setup),
            json=body(setup, auto_terminate={"idle_minutes": 30, "action": "delete"}),
        )
        assert r.status_code == 201, r.json()
        cid = r.json()["data"]["id"]
        url = f"{BASE}{cid}/"
        got = c.get(url, params=params(setup)).json()["data"]
        assert got["auto_terminate"]["enabled"] is True
        assert got["auto_terminate"]["idle_minutes"] == 30
        assert got["auto_terminate"]["action"] == "delete"
        # Creating: no deadline yet.
        assert got["auto_terminate"]["next_deadline_at"] is None
        assert "update_auto_terminate" in got["allowed_actions"]

        set_status(tsrv, cid, "running")
        r = c.put(
            url,
            params=params(setup),
            json={"action": "update_auto_terminate", "auto_terminate": {"max_runtime_hours": 2}},
        )
        assert r.status_code == 200, r.json()
        policy = r.json()["data"]["auto_terminate"]
        assert policy["max_runtime_hours"] == 2 and policy["idle_minutes"] == 30
        assert policy["next_rule"] == "max_runtime" and policy["next_action"] == "delete"
        assert 0 < policy["seconds_left"] <= 7200
        r = c.put(url, params=params(setup), json={"action": "update_auto_terminate"})
        assert_error(r, 400, "VALIDATION_ERROR", "auto_terminate")
        r = c.put(
            url,
            params=params(setup),
            json={"action": "update_auto_terminate", "auto_terminate": {"max_runtime_hours": 0}},
        )
        assert_error(r, 400, "VALIDATION_ERROR", "auto_terminate.max_runtime_hours")
        events = c.get(f"{url}events/", params=params(setup)).json()["data"]
        assert any(e["message"] == "policy updated: max_runtime_hours" for e in events)


def test_cli_sets_shows_and_changes_the_policy(
    tsrv: LiveServer,  # noqa: F811
    setup: dict[str, Any],  # noqa: F811
) -> None:
    env = {"GPUYARD_URL": tsrv.url, "GPUYARD_API_KEY": tsrv.key}
    runner = CliRunner()
    scope = ["--project-id", str(setup["project_id"])]
    created = runner.invoke(
        cli,
        [
            "--json", "training", "create", *scope, "--name", "cli",
            "--image-version-id", str(setup["image_id"]), "--ssh-key-id", str(setup["key_id"]),
            "--nodes", "1", "--gpu-type", "NVIDIA RTX A6000", "--gpus-per-node", "1",
            "--cpus-per-node", "2", "--memory-gb-per-node", "4", "--idle-minutes", "15",
        ],
        env=env,
    )  # fmt: skip
    assert created.exit_code == 0, created.output
    cid = json.loads(created.output)["id"]
    set_status(tsrv, cid, "running")
    shown = runner.invoke(cli, ["training", "get", *scope, str(cid)], env=env)
    assert shown.exit_code == 0, shown.output
    # Each node with its host and status, and the policy.
    with tsrv.server.ctx.read() as s:
        hosts = set(s.scalars(select(Host.name)))
    lines = [ln for ln in shown.output.splitlines() if "-controller" in ln or "-worker-1" in ln]
    assert len(lines) == 2 and all("creating" in ln for ln in lines), shown.output
    assert all(any(f" {h} " in ln for h in hosts) for ln in lines), (hosts, shown.output)
    assert "auto-terminate: idle 15 min -> stop" in shown.output
    changed = runner.invoke(
        cli,
        [
            "training", "action", *scope, str(cid), "update_auto_terminate",
            "--cost-limit-usd", "50", "--auto-action", "delete",
        ],
        env=env,
    )  # fmt: skip
    assert changed.exit_code == 0, changed.output
    assert "auto-terminate: idle 15 min, cost 50.00 USD -> delete" in changed.output
    off = runner.invoke(
        cli,
        ["training", "action", *scope, str(cid), "update_auto_terminate", "--auto-terminate-off"],
        env=env,
    )
    assert off.exit_code == 0 and "auto-terminate: off" in off.output, off.output
