"""What clusters use: ``gpuyard projects``, ``ssh-keys``, ``registry-auths``, ``images``,
``plans``, ``locations``, ``reserved-ips`` and ``security-groups``.

Like the other HTTP commands these import only the client (no server modules), so
the CLI starts fast; the server validates everything and its errors are shown as
``error: CODE: message``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from gpuyard.cli.client import JSON
from gpuyard.cli.common import api_options, make_call
from gpuyard.cli.output import print_json, print_table


def _scope_options(f: click.decorators.FC) -> click.decorators.FC:
    f = click.option(
        "--active-iam", type=int, default=None, help="Act for another account (membership id)."
    )(f)
    return click.option(
        "--project-id", type=int, default=None, help="Project (default: the default project)."
    )(f)


def _done(data: JSON, as_json: bool, message: str) -> None:
    if as_json:
        print_json(data)
    else:
        click.echo(message)


# -- projects -----------------------------------------------------------------------


@click.group("projects")
def projects() -> None:
    """Projects of your account."""


@projects.command("list")
@click.option("--active-iam", type=int, default=None, help="Act for another account.")
@api_options
def projects_list(
    active_iam: int | None, url: str | None, api_key: str | None, as_json: bool
) -> None:
    """List projects."""
    call = make_call(url, api_key, as_json)
    with call.client as client:
        data = client.list_projects(active_iam=active_iam)
    if call.as_json:
        print_json(data)
        return
    rows = [[p["id"], p["name"], p["is_default"], p["created_at"]] for p in data["projects"]]
    print_table(["ID", "NAME", "DEFAULT", "CREATED"], rows, "no projects")


@projects.command("create")
@click.argument("name")
@click.option("--active-iam", type=int, default=None, help="Act for another account.")
@api_options
def projects_create(
    name: str, active_iam: int | None, url: str | None, api_key: str | None, as_json: bool
) -> None:
    """Create a project; prints its id."""
    call = make_call(url, api_key, as_json)
    with call.client as client:
        data = client.create_project(name, active_iam=active_iam)
    _done(data, call.as_json, f"project {data['id']} ({data['name']}) created")


# -- catalog ------------------------------------------------------------------------


@click.command("plans")
@api_options
def plans(url: str | None, api_key: str | None, as_json: bool) -> None:
    """Node plans (sku_id) with their size and price per node-hour."""
    call = make_call(url, api_key, as_json)
    with call.client as client:
        data = client.plans()
    if call.as_json:
        print_json(data)
        return
    rows = [
        [
            p["sku_id"],
            p["name"],
            p["gpu_type"],
            p["gpus_per_node"],
            p["cpus_per_node"],
            f"{p['memory_gb_per_node']}G",
            f"{p['price_per_hour']:.4f}",
        ]
        for p in data["plans"]
    ]
    print_table(["SKU", "NAME", "GPU TYPE", "GPUS", "VCPUS", "MEM", "$/H"], rows, "no plans")


@click.command("locations")
@api_options
def locations(url: str | None, api_key: str | None, as_json: bool) -> None:
    """Locations with hosts, and their free/total GPUs per type."""
    call = make_call(url, api_key, as_json)
    with call.client as client:
        data = client.locations()
    if call.as_json:
        print_json(data)
        return
    rows = [
        [
            loc["location"],
            f"{loc['healthy_hosts']}/{loc['hosts']}",
            ", ".join(
                f"{g['gpu_type']} {g['free_gpus']}/{g['total_gpus']}" for g in loc["gpu_types"]
            ),
        ]
        for loc in data["locations"]
    ]
    print_table(["LOCATION", "HOSTS UP", "GPUS FREE/TOTAL"], rows, "no locations")


# -- SSH keys -----------------------------------------------------------------------


@click.group("ssh-keys")
def ssh_keys() -> None:
    """SSH public keys training nodes authorise."""


@ssh_keys.command("list")
@click.option("--active-iam", type=int, default=None, help="Act for another account.")
@api_options
def ssh_keys_list(
    active_iam: int | None, url: str | None, api_key: str | None, as_json: bool
) -> None:
    """List SSH keys with their fingerprints."""
    call = make_call(url, api_key, as_json)
    with call.client as client:
        data = client.list_ssh_keys(active_iam=active_iam)
    if call.as_json:
        print_json(data)
        return
    rows = [[k["id"], k["name"], k["fingerprint"], k["created_at"]] for k in data["ssh_keys"]]
    print_table(["ID", "NAME", "FINGERPRINT", "CREATED"], rows, "no SSH keys")


@ssh_keys.command("add")
@click.argument("name")
@click.option(
    "--file",
    "path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="A public key file (e.g. ~/.ssh/id_ed25519.pub).",
)
@click.option("--key", "text", default=None, help="The public key line itself.")
@click.option("--active-iam", type=int, default=None, help="Act for another account.")
@api_options
def ssh_keys_add(
    name: str,
    path: Path | None,
    text: str | None,
    active_iam: int | None,
    url: str | None,
    api_key: str | None,
    as_json: bool,
) -> None:
    """Add a public key from --file or --key; prints its id and fingerprint."""
    if (path is None) == (text is None):
        raise click.UsageError("give exactly one of --file PATH or --key TEXT")
    key = text or ""
    if path is not None:
        try:
            key = path.read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise click.UsageError(f"cannot read {path}: {e}") from e
    call = make_call(url, api_key, as_json)
    with call.client as client:
        data = client.add_ssh_key(name, key, active_iam=active_iam)
    _done(data, call.as_json, f"SSH key {data['id']} ({data['name']}) {data['fingerprint']}")


@ssh_keys.command("delete")
@click.argument("key_id", metavar="ID", type=int)
@click.option("--active-iam", type=int, default=None, help="Act for another account.")
@api_options
def ssh_keys_delete(
    key_id: int, active_iam: int | None, url: str | None, api_key: str | None, as_json: bool
) -> None:
    """Delete an SSH key."""
    call = make_call(url, api_key, as_json)
    with call.client as client:
        data = client.delete_ssh_key(str(key_id), active_iam=active_iam)
    _done(data, call.as_json, f"SSH key {key_id} deleted")


# -- registry credentials -------------------------------------------------------------


@click.group("registry-auths")
def registry_auths() -> None:
    """Private registry credentials clusters pull their images with."""


@registry_auths.command("list")
@click.option("--active-iam", type=int, default=None, help="Act for another account.")
@api_options
def registry_auths_list(
    active_iam: int | None, url: str | None, api_key: str | None, as_json: bool
) -> None:
    """List registry credentials (id and name: the password is never shown)."""
    call = make_call(url, api_key, as_json)
    with call.client as client:
        data = client.list_registry_auths(active_iam=active_iam)
    if call.as_json:
        print_json(data)
        return
    rows = [[a["id"], a["name"], a["created_at"]] for a in data["registry_auths"]]
    print_table(["ID", "NAME", "CREATED"], rows, "no registry credentials")


@registry_auths.command("create")
@click.argument("name")
@click.option("--username", required=True, help="The registry's user name.")
@click.option(
    "--password-stdin",
    is_flag=True,
    help="Read the password (or token) from standard input instead of a prompt.",
)
@click.option("--active-iam", type=int, default=None, help="Act for another account.")
@api_options
def registry_auths_create(
    name: str,
    username: str,
    password_stdin: bool,
    active_iam: int | None,
    url: str | None,
    api_key: str | None,
    as_json: bool,
) -> None:
    """Store credentials; name them on a cluster with registry_auth_id."""
    if password_stdin:
        password = sys.stdin.read().rstrip("\r\n")
    else:
        password = click.prompt("Password", hide_input=True)
    call = make_call(url, api_key, as_json)
    with call.client as client:
        data = client.create_registry_auth(name, username, password, active_iam=active_iam)
    _done(data, call.as_json, f"registry auth {data['id']} ({data['name']})")


@registry_auths.command("update")
@click.argument("auth_id", metavar="ID", type=int)
@click.option("--name", default=None, help="A new name.")
@click.option("--username", default=None, help="A new user name.")
@click.option(
    "--password", "new_password", is_flag=True, help="Set a new password (hidden prompt)."
)
@click.option(
    "--password-stdin", is_flag=True, help="Read a new password (or token) from standard input."
)
@click.option("--active-iam", type=int, default=None, help="Act for another account.")
@api_options
def registry_auths_update(
    auth_id: int,
    name: str | None,
    username: str | None,
    new_password: bool,
    password_stdin: bool,
    active_iam: int | None,
    url: str | None,
    api_key: str | None,
    as_json: bool,
) -> None:
    """Change credentials' name, username or password; clusters naming them pull with
    the new ones from their next start."""
    changes: JSON = {}
    if name is not None:
        changes["name"] = name
    if username is not None:
        changes["username"] = username
    if password_stdin:
        changes["password"] = sys.stdin.read().rstrip("\r\n")
    elif new_password:
        changes["password"] = click.prompt("Password", hide_input=True)
    if not changes:
        raise click.UsageError("give --name, --username, --password or --password-stdin")
    call = make_call(url, api_key, as_json)
    with call.client as client:
        data = client.update_registry_auth(auth_id, changes, active_iam=active_iam)
    _done(data, call.as_json, f"registry auth {data['id']} ({data['name']}) updated")


@registry_auths.command("delete")
@click.argument("auth_id", metavar="ID", type=int)
@click.option("--active-iam", type=int, default=None, help="Act for another account.")
@api_options
def registry_auths_delete(
    auth_id: int, active_iam: int | None, url: str | None, api_key: str | None, as_json: bool
) -> None:
    """Delete registry credentials (refused while a template or a live cluster names
    them)."""
    call = make_call(url, api_key, as_json)
    with call.client as client:
        data = client.delete_registry_auth(auth_id, active_iam=active_iam)
    _done(data, call.as_json, f"registry auth {auth_id} deleted")


# -- images -------------------------------------------------------------------------


@click.group("images")
def images() -> None:
    """Node image versions (image_version_id)."""


@images.command("list")
@api_options
def images_list(url: str | None, api_key: str | None, as_json: bool) -> None:
    """List image versions."""
    call = make_call(url, api_key, as_json)
    with call.client as client:
        data = client.list_images()
    if call.as_json:
        print_json(data)
        return
    rows = [[i["id"], i["name"], i["version"], i["image"]] for i in data["images"]]
    print_table(["ID", "NAME", "VERSION", "IMAGE"], rows, "no images")


@images.command("register")
@click.option("--name", required=True, help="e.g. slurm-node")
@click.option("--version", "version", required=True, help="e.g. 22.05-bookworm")
@click.option("--image", required=True, help="An image reference the engine can run.")
@click.option("--description", default=None, help="Free-text description.")
@api_options
def images_register(
    name: str,
    version: str,
    image: str,
    description: str | None,
    url: str | None,
    api_key: str | None,
    as_json: bool,
) -> None:
    """Register an image version (needs an admin key)."""
    body: JSON = {"name": name, "version": version, "image": image}
    if description is not None:
        body["description"] = description
    call = make_call(url, api_key, as_json)
    with call.client as client:
        data = client.register_image(body)
    _done(data, call.as_json, f"image version {data['id']} registered ({data['image']})")


# -- reserved IPs -------------------------------------------------------------------


@click.group("reserved-ips")
def reserved_ips() -> None:
    """Public addresses reserved from the pool."""


@reserved_ips.command("list")
@_scope_options
@api_options
def reserved_ips_list(
    project_id: int | None,
    active_iam: int | None,
    url: str | None,
    api_key: str | None,
    as_json: bool,
) -> None:
    """List the project's reserved IPs."""
    call = make_call(url, api_key, as_json)
    with call.client as client:
        data = client.list_reserved_ips(project_id=project_id, active_iam=active_iam)
    if call.as_json:
        print_json(data)
        return
    rows = [
        [r["id"], r["address"], r["status"], r["training_cluster_id"], r["created_at"]]
        for r in data["reserved_ips"]
    ]
    print_table(["ID", "ADDRESS", "STATUS", "CLUSTER", "CREATED"], rows, "no reserved IPs")


@reserved_ips.command("allocate")
@_scope_options
@api_options
def reserved_ips_allocate(
    project_id: int | None,
    active_iam: int | None,
    url: str | None,
    api_key: str | None,
    as_json: bool,
) -> None:
    """Reserve the lowest free address; prints it."""
    call = make_call(url, api_key, as_json)
    with call.client as client:
        data = client.allocate_reserved_ip(project_id=project_id, active_iam=active_iam)
    _done(data, call.as_json, f"reserved IP {data['id']}: {data['address']}")


@reserved_ips.command("release")
@click.argument("ip_id", metavar="ID", type=int)
@_scope_options
@api_options
def reserved_ips_release(
    ip_id: int,
    project_id: int | None,
    active_iam: int | None,
    url: str | None,
    api_key: str | None,
    as_json: bool,
) -> None:
    """Release a reserved IP back to the pool."""
    call = make_call(url, api_key, as_json)
    with call.client as client:
        data = client.release_reserved_ip(str(ip_id), project_id=project_id, active_iam=active_iam)
    _done(data, call.as_json, f"reserved IP {ip_id} released")


# -- security groups ----------------------------------------------------------------


def parse_rule(text: str) -> JSON:
    """``tcp:22:10.0.0.0/8`` / ``udp:8000-9000:0.0.0.0/0`` / ``all:1-65535:::/0``:
    protocol, port range and source CIDR (which may itself contain colons)."""
    parts = text.split(":", 2)
    if len(parts) != 3 or not all(parts):
        raise click.BadParameter(
            f"{text!r}: expected PROTOCOL:PORTS:CIDR, e.g. tcp:22:10.0.0.0/8", param_hint="--rule"
        )
    return {"protocol": parts[0], "port_range": parts[1], "source_cidr": parts[2]}


@click.group("security-groups")
def security_groups() -> None:
    """Security groups: inbound rules training clusters attach."""


@security_groups.command("list")
@_scope_options
@api_options
def security_groups_list(
    project_id: int | None,
    active_iam: int | None,
    url: str | None,
    api_key: str | None,
    as_json: bool,
) -> None:
    """List the project's security groups and their rules."""
    call = make_call(url, api_key, as_json)
    with call.client as client:
        data = client.list_security_groups(project_id=project_id, active_iam=active_iam)
    if call.as_json:
        print_json(data)
        return
    rows = [
        [
            g["id"],
            g["name"],
            " ".join(f"{r['protocol']}:{r['port_range']}:{r['source_cidr']}" for r in g["rules"])
            or "(deny all)",
        ]
        for g in data["security_groups"]
    ]
    print_table(["ID", "NAME", "RULES"], rows, "no security groups")


@security_groups.command("create")
@click.argument("name")
@click.option(
    "--rule",
    "rules",
    multiple=True,
    help="PROTOCOL:PORTS:CIDR, e.g. tcp:22:10.0.0.0/8 (repeatable; none: deny all).",
)
@click.option("--description", default=None, help="Free-text description.")
@_scope_options
@api_options
def security_groups_create(
    name: str,
    rules: tuple[str, ...],
    description: str | None,
    project_id: int | None,
    active_iam: int | None,
    url: str | None,
    api_key: str | None,
    as_json: bool,
) -> None:
    """Create a security group; prints its id."""
    body: JSON = {"name": name, "rules": [parse_rule(r) for r in rules]}
    if description is not None:
        body["description"] = description
    call = make_call(url, api_key, as_json)
    with call.client as client:
        data = client.create_security_group(body, project_id=project_id, active_iam=active_iam)
    _done(data, call.as_json, f"security group {data['id']} ({data['name']}) created")


@security_groups.command("delete")
@click.argument("group_id", metavar="ID", type=int)
@_scope_options
@api_options
def security_groups_delete(
    group_id: int,
    project_id: int | None,
    active_iam: int | None,
    url: str | None,
    api_key: str | None,
    as_json: bool,
) -> None:
    """Delete a security group (not while a training cluster attaches it)."""
    call = make_call(url, api_key, as_json)
    with call.client as client:
        data = client.delete_security_group(
            str(group_id), project_id=project_id, active_iam=active_iam
        )
    _done(data, call.as_json, f"security group {group_id} deleted")


COMMANDS = (
    projects,
    ssh_keys,
    registry_auths,
    images,
    plans,
    locations,
    reserved_ips,
    security_groups,
)
