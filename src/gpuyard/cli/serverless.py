"""``gpuyard endpoints ...`` and ``gpuyard jobs run``: serverless endpoints
(``/v1/endpoints``) and requests to them through RunPod's job API
(``/runpod/v2/{endpoint_id}/run``, ``runsync``, ``status``, ``stream``). Secret env
values are sent marked secret and only ever shown masked; like the other HTTP commands
this imports only the client."""

from __future__ import annotations

import json
import time
from typing import Any

import click

from gpuyard.cli.client import JSON, GpuyardClient
from gpuyard.cli.clusters import env_with_secrets
from gpuyard.cli.common import PROJECT_OPTION, api_options, every_page, make_call
from gpuyard.cli.output import key_values, print_json, print_table

# RunPod's final job states: polling stops at any of them.
FINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMED_OUT"})
JOBS = "/runpod/v2"


def _counts(e: JSON) -> str:
    w, j = e.get("workers") or {}, e.get("jobs") or {}
    return (
        f"{w.get('running', 0)} running, {w.get('idle', 0)} idle, "
        f"{w.get('starting', 0)} starting; {j.get('inQueue', 0)} in queue, "
        f"{j.get('inProgress', 0)} in progress"
    )


def _show(e: JSON) -> None:
    env = ", ".join(f"{k}={v}" for k, v in (e.get("env") or {}).items())
    text = key_values(
        [
            ("id", e["id"]),
            ("name", e["name"]),
            ("project", e["project_id"]),
            ("status", e["status"]),
            ("version", e["version"]),
            ("image", e["image"]),
            ("template", e.get("template_id")),
            ("gpus", f"{e['gpu_count']} x {', '.join(e['gpu_type_ids']) or '-'}"),
            ("workers", f"{e['workers_min']}..{e['workers_max']}"),
            ("now", _counts(e)),
            ("scaler", f"{e['scaler_type']} {e['scaler_value']}"),
            ("idle timeout", f"{e['idle_timeout_s']} s"),
            ("execution timeout", f"{e['execution_timeout_ms']} ms"),
            ("env", env or None),
            ("network volume", e.get("network_volume_id")),
            ("locations", ", ".join(e.get("locations") or []) or None),
            ("flashboot", e.get("flashboot")),
            ("capacity problem", e.get("capacity_problem")),
            ("created", e["created_at"]),
        ]
    )
    click.echo(text)


@click.group("endpoints")
def endpoints() -> None:
    """Serverless endpoints: an image whose workers scale with its job queue."""


@endpoints.command("list")
@PROJECT_OPTION
@api_options
def endpoints_list(
    project_id: int | None, url: str | None, api_key: str | None, as_json: bool
) -> None:
    """List the account's endpoints with their workers and queue now."""
    call = make_call(url, api_key, as_json)
    with call.client as client:
        rows = every_page(client, "/v1/endpoints", "endpoints", project_id)
    if call.as_json:
        print_json({"endpoints": rows})
        return
    table = [
        [
            e["id"],
            e["name"],
            e["image"],
            f"{e['workers_min']}..{e['workers_max']}",
            (e.get("workers") or {}).get("running", 0) + (e.get("workers") or {}).get("idle", 0),
            (e.get("jobs") or {}).get("inQueue", 0),
        ]
        for e in rows
    ]
    print_table(["ID", "NAME", "IMAGE", "WORKERS", "READY", "QUEUED"], table, "no endpoints")


@endpoints.command("get")
@click.argument("endpoint_id", metavar="ID")
@api_options
def endpoints_get(endpoint_id: str, url: str | None, api_key: str | None, as_json: bool) -> None:
    """Show one endpoint (secret env values masked)."""
    call = make_call(url, api_key, as_json)
    with call.client as client:
        data = client.request("GET", f"/v1/endpoints/{endpoint_id}")
    if call.as_json:
        print_json(data)
    else:
        _show(data)


@endpoints.command("create")
@click.argument("name")
@click.option("--image", default=None, help="Worker image (or --template).")
@click.option("--template", "template_id", default=None, metavar="ID",
              help="Template whose image, env and disks fill what is not given.")  # fmt: skip
@click.option("--gpu-type", "gpu_types", multiple=True, metavar="ID",
              help="GPU type: catalog id, display name or RunPod pool (repeatable).")  # fmt: skip
@click.option("--gpu-count", type=click.IntRange(min=0), default=None, help="GPUs per worker.")
@click.option("--workers-min", type=click.IntRange(min=0), default=None, help="Default 0.")
@click.option("--workers-max", type=click.IntRange(min=0), default=None, help="Default 3.")
@click.option("--idle-timeout", "idle_timeout_s", type=click.IntRange(min=1), default=None,
              help="Seconds a worker may idle before it is stopped (default 5).")  # fmt: skip
@click.option("--scaler-type", type=click.Choice(["QUEUE_DELAY", "REQUEST_COUNT"]),
              default=None, help="Default QUEUE_DELAY.")  # fmt: skip
@click.option("--scaler-value", type=click.IntRange(min=1), default=None, help="Default 4.")
@click.option("--execution-timeout-ms", type=click.IntRange(min=0), default=None,
              help="A job's timeout when its policy sets none (0: none).")  # fmt: skip
@click.option("--env", "env", multiple=True, metavar="KEY=VAL", help="Environment (repeatable).")
@click.option("--secret-env", multiple=True, metavar="KEY=VAL",
              help="Environment variable stored sealed and shown masked (repeatable).")  # fmt: skip
@click.option("--network-volume", "network_volume_id", default=None, metavar="ID",
              help="Network volume mounted in every worker.")  # fmt: skip
@click.option("--location", "locations", multiple=True, metavar="ID",
              help="Place workers only here (repeatable; default anywhere).")  # fmt: skip
@click.option("--flashboot", is_flag=True, default=False,
              help="Keep idle workers stopped on their host for fast starts.")  # fmt: skip
@click.option("--cpu-cores", type=click.IntRange(min=1), default=None, help="Default 2.")
@click.option("--memory-gb", type=click.IntRange(min=1), default=None, help="Default 4.")
@click.option("--container-disk-gb", type=click.IntRange(min=1), default=None, help="Default 10.")
@click.option("--volume-gb", type=click.IntRange(min=0), default=None, help="Default 0.")
@PROJECT_OPTION
@api_options
def endpoints_create(
    name: str,
    image: str | None,
    template_id: str | None,
    gpu_types: tuple[str, ...],
    env: tuple[str, ...],
    secret_env: tuple[str, ...],
    locations: tuple[str, ...],
    flashboot: bool,
    project_id: int | None,
    url: str | None,
    api_key: str | None,
    as_json: bool,
    **numbers: Any,
) -> None:
    """Create endpoint NAME (unique in the account) from --image or --template."""
    if image is None and template_id is None:
        raise click.UsageError("give --image or --template")
    body: JSON = {
        "name": name,
        **{k: v for k, v in numbers.items() if v is not None},
    }
    for key, value in (("image", image), ("template_id", template_id)):
        if value is not None:
            body[key] = value
    if gpu_types:
        body["gpu_type_ids"] = list(gpu_types)
    if env or secret_env:
        body["env"] = env_with_secrets(env, secret_env)
    if locations:
        body["locations"] = list(locations)
    if flashboot:
        body["flashboot"] = True
    params: dict[str, str | int] = {} if project_id is None else {"project_id": project_id}
    call = make_call(url, api_key, as_json)
    with call.client as client:
        data = client.request("POST", "/v1/endpoints", json=body, params=params)
    if call.as_json:
        print_json(data)
    else:
        click.echo(f"endpoint {data['id']} ({data['name']})")


@endpoints.command("delete")
@click.argument("endpoint_id", metavar="ID")
@api_options
def endpoints_delete(endpoint_id: str, url: str | None, api_key: str | None, as_json: bool) -> None:
    """Delete endpoint ID: it takes no new jobs; its workers finish theirs and stop."""
    call = make_call(url, api_key, as_json)
    with call.client as client:
        data = client.request("DELETE", f"/v1/endpoints/{endpoint_id}")
    if call.as_json:
        print_json(data)
    else:
        click.echo(f"endpoint {endpoint_id} deleted (its workers drain and stop)")


# ---------------------------------------------------------------- jobs


@click.group("jobs")
def jobs() -> None:
    """Requests to serverless endpoints (RunPod's job API)."""


def _input(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as e:
        raise click.BadParameter(f"not JSON: {e}", param_hint="--input") from e


def _until_final(client: GpuyardClient, endpoint_id: str, job: JSON, poll_s: float) -> JSON:
    """``job`` polled through ``status`` until it reaches a final state."""
    while str(job.get("status")) not in FINAL:
        time.sleep(poll_s)
        job = client.request("GET", f"{JOBS}/{endpoint_id}/status/{job['id']}")
    return job


def _streamed(client: GpuyardClient, endpoint_id: str, job_id: str, poll_s: float) -> JSON:
    """Print each streamed chunk's output (one JSON line each) as ``stream`` hands it
    out, until the job reaches a final state; answers the last ``stream`` answer."""
    while True:
        part = client.request("GET", f"{JOBS}/{endpoint_id}/stream/{job_id}")
        for chunk in part.get("stream") or []:
            click.echo(json.dumps(chunk.get("output")))
        if str(part.get("status")) in FINAL:
            return part
        time.sleep(poll_s)


@jobs.command("run")
@click.argument("endpoint_id", metavar="ENDPOINT")
@click.option("--input", "input_text", required=True, metavar="JSON", help="The job's input.")
@click.option("--sync", is_flag=True, default=False, help="Use runsync (one request).")
@click.option("--stream", is_flag=True, default=False,
              help="Print each streamed chunk as the handler yields it.")  # fmt: skip
@click.option("--wait-ms", type=click.IntRange(min=1), default=None,
              help="With --sync: how long runsync waits for the result.")  # fmt: skip
@click.option("--no-wait", is_flag=True, default=False,
              help="Print the queued job's id and return at once.")  # fmt: skip
@click.option("--poll-s", type=click.FloatRange(min=0.01), default=0.5, show_default=True,
              help="Seconds between status polls.")  # fmt: skip
@api_options
def jobs_run(
    endpoint_id: str,
    input_text: str,
    sync: bool,
    stream: bool,
    wait_ms: int | None,
    no_wait: bool,
    poll_s: float,
    url: str | None,
    api_key: str | None,
    as_json: bool,
) -> None:
    """Send a job to ENDPOINT and print its result (exit status 1 unless COMPLETED)."""
    if sync and stream:
        raise click.UsageError("--sync and --stream exclude each other")
    if wait_ms is not None and not sync:
        raise click.UsageError("--wait-ms goes with --sync")
    if no_wait and (sync or stream):
        raise click.UsageError("--no-wait goes with neither --sync nor --stream")
    body: JSON = {"input": _input(input_text)}
    call = make_call(url, api_key, as_json)
    with call.client as client:
        if sync:
            params: dict[str, str | int] = {} if wait_ms is None else {"wait": wait_ms}
            job = client.request("POST", f"{JOBS}/{endpoint_id}/runsync", json=body, params=params)
        else:
            job = client.request("POST", f"{JOBS}/{endpoint_id}/run", json=body)
        if no_wait:
            if call.as_json:
                print_json(job)
            else:
                click.echo(f"job {job['id']} {job['status']}")
            return
        if stream:
            _streamed(client, endpoint_id, str(job["id"]), poll_s)
        job = _until_final(client, endpoint_id, job, poll_s)
    _report(job, call.as_json, streamed=stream)


def _report(job: JSON, as_json: bool, *, streamed: bool) -> None:
    status = str(job.get("status"))
    if as_json:
        print_json(job)
    elif not streamed or status != "COMPLETED":
        if status == "COMPLETED":
            click.echo(json.dumps(job.get("output")))
        else:
            click.echo(f"job {job.get('id')} {status}: {job.get('error') or ''}".rstrip(": "))
    if status != "COMPLETED":
        raise SystemExit(1)
