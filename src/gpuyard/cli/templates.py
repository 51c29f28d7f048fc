"""``gpuyard templates ...``: the account's cluster templates (``/v1/templates``),
saved configurations that ``gpuyard clusters create --template`` (and RunPod's
``templateId``) start from. Secret env values are sent marked secret and only ever
shown masked; like the other HTTP commands this imports only the client."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from gpuyard.cli.client import JSON
from gpuyard.cli.clusters import env_with_secrets, parse_port
from gpuyard.cli.common import PROJECT_OPTION, api_options, every_page, make_call
from gpuyard.cli.output import key_values, print_json, print_table


def _read(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise click.UsageError(f"cannot read {path}: {e}") from e


def _body(options: dict[str, Any]) -> JSON:
    """The request body of the options given (None: not given)."""
    body: JSON = {k: v for k, v in options.items() if v is not None}
    return body


def _show(t: JSON) -> None:
    ports = ", ".join(f"{p['internal_port']}/{p['protocol']}" for p in t.get("ports") or [])
    env = ", ".join(f"{k}={v}" for k, v in (t.get("env") or {}).items())
    text = key_values(
        [
            ("id", t["id"]),
            ("name", t["name"]),
            ("project", t["project_id"]),
            ("image", t["docker_image"]),
            ("docker args", t["docker_args"] or None),
            ("start script", (t["start_script"] or "").strip() or None),
            ("env", env or None),
            ("ports", ports or None),
            ("container disk", f"{t['container_disk_gb']} GB"),
            ("volume", f"{t['volume_gb']} GB at {t['volume_mount_path']}"),
            ("registry auth", t.get("container_registry_auth_id")),
            ("serverless", t.get("is_serverless")),
            ("created", t["created_at"]),
            ("updated", t["updated_at"]),
        ]
    )
    click.echo(text)


_SECRET_ENV = click.option(
    "--secret-env",
    multiple=True,
    metavar="KEY=VAL",
    help="Environment variable stored sealed and shown masked (repeatable).",
)
_ENV = click.option(
    "--env", "env", multiple=True, metavar="KEY=VAL", help="Environment variable (repeatable)."
)
_PORT = click.option(
    "--port",
    "ports",
    multiple=True,
    metavar="INTERNAL[:EXTERNAL][/PROTO[,public]]",
    help="Port to expose (repeatable), e.g. 22, 8888/http, 8888/http,public.",
)
_SCRIPT = click.option(
    "--start-script-file",
    "script_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Shell script run as the command (/bin/sh -c) when there are no docker args.",
)
_README = click.option(
    "--readme-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Markdown readme.",
)


@click.group("templates")
def templates() -> None:
    """Cluster templates: saved configurations clusters are created from."""


@templates.command("list")
@PROJECT_OPTION
@api_options
def templates_list(
    project_id: int | None, url: str | None, api_key: str | None, as_json: bool
) -> None:
    """List the account's templates."""
    call = make_call(url, api_key, as_json)
    with call.client as client:
        rows = every_page(client, "/v1/templates", "templates", project_id)
    if call.as_json:
        print_json({"templates": rows})
        return
    table = [
        [t["id"], t["name"], t["docker_image"], t.get("container_registry_auth_id") or "-"]
        for t in rows
    ]
    print_table(["ID", "NAME", "IMAGE", "REGISTRY AUTH"], table, "no templates")


@templates.command("get")
@click.argument("template_id", metavar="ID")
@api_options
def templates_get(template_id: str, url: str | None, api_key: str | None, as_json: bool) -> None:
    """Show one template (secret env values masked)."""
    call = make_call(url, api_key, as_json)
    with call.client as client:
        data = client.request("GET", f"/v1/templates/{template_id}")
    if call.as_json:
        print_json(data)
    else:
        _show(data)


@templates.command("create")
@click.argument("name")
@click.option("--image", required=True, help="Container image.")
@click.option("--args", "docker_args", default=None, help="Command override (docker args).")
@_ENV
@_SECRET_ENV
@_PORT
@click.option(
    "--container-disk-gb",
    type=click.IntRange(min=1),
    default=None,
    help="Container disk of its clusters (GB).",
)
@click.option(
    "--volume-gb", type=click.IntRange(min=0), default=None, help="Their volume (GB; 0: none)."
)
@click.option("--volume-mount-path", default=None, help="Default /workspace.")
@click.option("--registry-auth", "registry_auth", type=int, default=None, metavar="ID",
              help="Pull the image with these registry credentials (registry-auths).")  # fmt: skip
@_SCRIPT
@_README
@click.option("--serverless", is_flag=True, default=False, help="Mark it a serverless template.")
@PROJECT_OPTION
@api_options
def templates_create(
    name: str,
    image: str,
    docker_args: str | None,
    env: tuple[str, ...],
    secret_env: tuple[str, ...],
    ports: tuple[str, ...],
    container_disk_gb: int | None,
    volume_gb: int | None,
    volume_mount_path: str | None,
    registry_auth: int | None,
    script_file: Path | None,
    readme_file: Path | None,
    serverless: bool,
    project_id: int | None,
    url: str | None,
    api_key: str | None,
    as_json: bool,
) -> None:
    """Save template NAME (unique in the account)."""
    body = _body(
        {
            "name": name,
            "docker_image": image,
            "docker_args": docker_args,
            "container_disk_gb": container_disk_gb,
            "volume_gb": volume_gb,
            "volume_mount_path": volume_mount_path,
            "container_registry_auth_id": None if registry_auth is None else str(registry_auth),
            "start_script": _read(script_file),
            "readme": _read(readme_file),
            "is_serverless": serverless or None,
        }
    )
    if env or secret_env:
        body["env"] = env_with_secrets(env, secret_env)
    if ports:
        body["ports"] = [parse_port(p) for p in ports]
    params: dict[str, str | int] = {} if project_id is None else {"project_id": project_id}
    call = make_call(url, api_key, as_json)
    with call.client as client:
        data = client.request("POST", "/v1/templates", json=body, params=params)
    if call.as_json:
        print_json(data)
    else:
        click.echo(f"template {data['id']} ({data['name']})")


@templates.command("update")
@click.argument("template_id", metavar="ID")
@click.option("--name", default=None, help="A new name.")
@click.option("--image", default=None, help="Container image.")
@click.option("--args", "docker_args", default=None, help="Command override (docker args).")
@_ENV
@_SECRET_ENV
@_PORT
@click.option(
    "--container-disk-gb",
    type=click.IntRange(min=1),
    default=None,
    help="New container disk of its clusters (GB).",
)
@click.option("--volume-gb", type=click.IntRange(min=0), default=None, help="New volume size (GB).")
@click.option("--volume-mount-path", default=None, help="New volume mount path.")
@click.option("--registry-auth", "registry_auth", type=int, default=None, metavar="ID",
              help="Pull the image with these registry credentials.")  # fmt: skip
@click.option("--no-registry-auth", is_flag=True, help="Pull without registry credentials.")
@_SCRIPT
@_README
@api_options
def templates_update(
    template_id: str,
    name: str | None,
    image: str | None,
    docker_args: str | None,
    env: tuple[str, ...],
    secret_env: tuple[str, ...],
    ports: tuple[str, ...],
    container_disk_gb: int | None,
    volume_gb: int | None,
    volume_mount_path: str | None,
    registry_auth: int | None,
    no_registry_auth: bool,
    script_file: Path | None,
    readme_file: Path | None,
    url: str | None,
    api_key: str | None,
    as_json: bool,
) -> None:
    """Change template ID: only the options given. --env/--secret-env replace the
    whole env (secret values kept where the masked value is given back); --port
    replaces the port list."""
    if registry_auth is not None and no_registry_auth:
        raise click.UsageError("--registry-auth and --no-registry-auth exclude each other")
    body = _body(
        {
            "name": name,
            "docker_image": image,
            "docker_args": docker_args,
            "container_disk_gb": container_disk_gb,
            "volume_gb": volume_gb,
            "volume_mount_path": volume_mount_path,
            "container_registry_auth_id": None if registry_auth is None else str(registry_auth),
            "start_script": _read(script_file),
            "readme": _read(readme_file),
        }
    )
    if no_registry_auth:
        body["container_registry_auth_id"] = None
    if env or secret_env:
        body["env"] = env_with_secrets(env, secret_env)
    if ports:
        body["ports"] = [parse_port(p) for p in ports]
    if not body:
        raise click.UsageError("nothing to change: give at least one option")
    call = make_call(url, api_key, as_json)
    with call.client as client:
        data = client.request("PATCH", f"/v1/templates/{template_id}", json=body)
    if call.as_json:
        print_json(data)
    else:
        click.echo(f"template {data['id']} ({data['name']}) updated")


@templates.command("delete")
@click.argument("template_id", metavar="ID")
@api_options
def templates_delete(template_id: str, url: str | None, api_key: str | None, as_json: bool) -> None:
    """Delete template ID (clusters made from it keep running)."""
    call = make_call(url, api_key, as_json)
    with call.client as client:
        data = client.request("DELETE", f"/v1/templates/{template_id}")
    if call.as_json:
        print_json(data)
    else:
        click.echo(f"template {template_id} deleted")
