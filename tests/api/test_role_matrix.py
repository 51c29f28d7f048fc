"""Every route of the OpenAPI document, and the GraphQL fields, against the role matrix
(issue 15): two accounts A and B, a member of each role in each; for every path and
method, each role of A gets what its role allows (allowed: never 401/403; refused:
403 FORBIDDEN), and a member of B naming A's resources by id hears exactly what it
hears for ids that do not exist (404 where its role may use the route).

The expected outcome of each route is this test's own table (EXPECTED), written from
the issue's matrix, not read from api/http/permissions.py: a route nobody classified fails
the test until it is added here.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpuyard.core.roles import Role
from gpuyard.core.tls_trust import trusted_tls
from gpuyard.services.tenancy.auth import Scope, create_account, issue_key
from gpuyard.store.schema import ApiKey, Member, User
from gpuyard.testing.fake_runtime import FakeRuntime
from tests.helpers import LiveServer, live_server, make_settings

OWNER, ADMIN, MEMBER, BILLING, VIEWER = (
    Role.OWNER,
    Role.ADMIN,
    Role.MEMBER,
    Role.BILLING,
    Role.VIEWER,
)
ROLES = (OWNER, ADMIN, MEMBER, BILLING, VIEWER)

# Who may do what: the issue's "owner, admin (members, keys, quotas of projects),
# member (clusters, snapshots, keys of their own), billing (billing and budgets
# only), viewer (read)".
MAY: dict[str, frozenset[Role]] = {
    "read": frozenset({OWNER, ADMIN, MEMBER, VIEWER}),
    "write": frozenset({OWNER, ADMIN, MEMBER}),
    "billing": frozenset({OWNER, ADMIN, BILLING}),
    "budget": frozenset({OWNER, ADMIN, BILLING}),
    "members": frozenset({OWNER, ADMIN}),
    "projects": frozenset({OWNER, ADMIN}),
    "audit": frozenset({OWNER, ADMIN}),
    "account": frozenset({OWNER}),
    "own_keys": frozenset(ROLES),
    "any": frozenset(ROLES),
    "operator": frozenset(),
}
PUBLIC = "public"  # no key needed: not a role question

# Resources of an account: GET reads, anything else writes.
_RESOURCES = (
    # The account's SSH keys log into every cluster of it (the gateway, PUBLIC_KEY):
    # adding one is a change to the clusters, not a key of one's own.
    "/v1/ssh-keys",
    # Account secrets: their names are read like resources; a change changes what the
    # account's clusters start with.
    "/v1/secrets",
    # Registry credentials pull the account's images: reading the list is reading
    # resources, changing them a change to what its clusters run.
    "/v1/registry-auths",
    "/v1/clusters",
    "/v2/clusters",
    "/v1/networkvolumes",
    "/v1/snapshots",
    "/v1/reserved-ips",
    "/v1/security-groups",
    "/v1/templates",
    # Serverless endpoints: their workers are the account's clusters.
    "/v1/endpoints",
    "/distributed_jobs_v2/cluster",
    # RunPod's REST v2 (/runpod/v2): the same resources under RunPod's names.
    "/runpod/v2/pods",
    "/runpod/v2/templates",
    "/runpod/v2/registries",
    "/runpod/v2/network-volumes",
    "/runpod/v2/account/ssh-keys",
    "/runpod/v2/clusters",
    # RunPod's serverless job API: reading a job or the health is a read; running,
    # cancelling, retrying and purging are changes.
    "/runpod/v2/{endpoint_id}",
)
ACC = "/v1/accounts/{account_id}"
EXPECTED: dict[tuple[str, str], str] = {
    # GETs that hand out a way into a cluster need what a change needs.
    ("GET", "/v1/clusters/{cluster_id}/ports/{port}/open"): "write",
    ("GET", "/healthz"): PUBLIC,
    ("GET", "/v1/gpu-types"): "any",
    ("POST", "/v1/prices/quote"): "any",
    ("GET", "/v1/locations"): "any",
    ("GET", "/v1/plans"): "any",
    ("GET", "/runpod/v2/catalog/gpus"): "any",
    ("GET", "/runpod/v2/catalog/gpus/{id}"): "any",
    ("GET", "/runpod/v2/catalog/datacenters"): "any",
    ("GET", "/runpod/v2/catalog/datacenters/{id}"): "any",
    ("GET", "/v1/host-images"): "read",
    ("GET", "/v1/images"): "any",
    ("GET", "/v1/images/{image_version_id}"): "any",
    ("POST", "/v1/images"): "operator",
    ("GET", "/v1/billing"): "billing",
    ("GET", "/v1/projects"): "any",
    ("POST", "/v1/projects"): "projects",
    ("PATCH", "/v1/projects/{project_id}"): "projects",
    ("DELETE", "/v1/projects/{project_id}"): "projects",
    ("GET", "/v1/projects/{project_id}/members"): "any",
    ("POST", "/v1/projects/{project_id}/members"): "projects",
    ("DELETE", "/v1/projects/{project_id}/members/{member_id}"): "projects",
    # The accounts part (api/rest/tenancy/accounts.py, quotas, budgets, audit).
    ("POST", "/v1/accounts"): "operator",
    ("GET", "/v1/accounts"): "any",
    ("GET", ACC): "any",
    ("PATCH", ACC): "account",
    ("GET", ACC + "/members"): "any",
    ("PATCH", ACC + "/members/{member_id}"): "members",
    ("DELETE", ACC + "/members/{member_id}"): "members",
    ("GET", ACC + "/invitations"): "members",
    ("POST", ACC + "/invitations"): "members",
    ("DELETE", ACC + "/invitations/{invitation_id}"): "members",
    ("POST", "/v1/invitations/{token}/accept"): PUBLIC,
    ("GET", "/v1/me"): "any",
    # Registry credentials: a change changes what the account's clusters pull with.
    ("PATCH", "/v1/registry-auths/{registry_auth_id}"): "write",
    # The web console's sign-in: the key is in the body (checked there), the session
    # is the cookie's; no role question.
    ("POST", "/v1/console/session"): PUBLIC,
    ("GET", "/v1/console/session"): PUBLIC,
    ("DELETE", "/v1/console/session"): PUBLIC,
    ("GET", "/v1/audit-events"): "audit",
    ("GET", ACC + "/quotas"): "any",
    ("PUT", ACC + "/quotas"): "operator",
    ("PUT", ACC + "/projects/{project_id}/quotas"): "projects",
    ("POST", ACC + "/credits"): "operator",
    ("GET", ACC + "/credits"): "billing",
    ("GET", ACC + "/budget"): "billing",
    ("PATCH", ACC + "/budget"): "budget",
    ("GET", ACC + "/events"): "billing",
    ("GET", ACC + "/webhook-deliveries"): "budget",
}
_OPERATOR = ("/v1/hosts", "/v1/orphans")
_OWN_KEYS = ("/v1/api-keys",)


def _under(path: str, prefixes: tuple[str, ...]) -> bool:
    return any(path == p or path.startswith(p + "/") for p in prefixes)


def expected(method: str, path: str) -> str | None:
    """Which MAY class (or PUBLIC) the route is; None when nobody classified it."""
    found = EXPECTED.get((method, path))
    if found is not None:
        return found
    if _under(path, _OPERATOR):
        return "operator"
    if _under(path, _OWN_KEYS):
        return "own_keys"
    if _under(path, _RESOURCES):
        return "read" if method == "GET" else "write"
    return None


# Bodies that exercise the permission itself (an empty body might change nothing).
BODIES: dict[tuple[str, str], dict[str, Any]] = {
    ("PATCH", ACC): {"name": "A"},
    ("PATCH", ACC + "/members/{member_id}"): {"role": "viewer"},
    ("PATCH", ACC + "/budget"): {"alert_percent": 80},
    ("POST", ACC + "/invitations"): {"email": "invited@a.test", "role": "viewer"},
    # The operator's: a well-formed body, so only the caller can be wrong.
    ("POST", "/v1/accounts"): {"name": "C", "owner_email": "owner@c.test"},
    ("POST", ACC + "/credits"): {"amount": 1, "note": "top-up"},
    ("POST", "/v1/images"): {"name": "i", "version": "9", "image": "docker.io/library/ubuntu:2"},
    ("POST", "/v1/hosts"): {"name": "h9", "engine_url": "tcp://203.0.113.9:2375"},
    ("PATCH", "/v1/hosts/{host_id}"): {"client_address": "203.0.113.7"},
}
# Real ids a refused role names, where the table's default would be one it may touch
# anyway (a member may remove their own membership): another member's.
OTHER_MEMBER = {
    ("DELETE", ACC + "/members/{member_id}"),
    ("DELETE", "/v1/projects/{project_id}/members/{member_id}"),
}


@dataclass
class Tenant:
    account_id: int
    project_id: int
    keys: dict[Role, str] = field(default_factory=dict)
    members: dict[Role, int] = field(default_factory=dict)


@dataclass
class World:
    srv: LiveServer
    a: Tenant
    b: Tenant
    # A's resources: path parameter name -> a real id of A.
    real: dict[str, Any]


# Ids of nothing, by path parameter name (the default: an integer id).
MISSING: dict[str, Any] = {
    "cluster_id": "nocluster0000",
    "pod_id": "nocluster0000",
    "token": "gyi_nothing",
    "port": 8888,
}


def seed_tenant(srv: LiveServer, name: str) -> Tenant:
    """An account with an owner and one member of each other role, each with a write
    key of the account (seeded in the store: what accepting an invitation makes)."""
    with srv.server.ctx.transaction() as s:
        owner, account, project = create_account(s, email=f"owner@{name}.test", name=name)
        t = Tenant(account.id, project.id)
        for role in ROLES:
            if role == OWNER:
                user_id = owner.id
            else:
                user = User(email=f"{role.value}@{name}.test", name=f"{role.value} {name}")
                s.add(user)
                s.flush()
                s.add(Member(account_id=account.id, user_id=user.id, role=role.value))
                s.flush()
                user_id = user.id
            member = s.query(Member).filter_by(account_id=account.id, user_id=user_id).one()
            t.members[role] = member.id
            t.keys[role] = issue_key(
                s, user_id=user_id, account_id=account.id, name=role.value, scope=Scope.WRITE
            ).key
    return t


def public_key(tmp: Path) -> str:
    path = tmp / "id"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return (tmp / "id.pub").read_text().strip()


def data(r: httpx.Response, status: int = 201) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body: dict[str, Any] = r.json()["data"]
    return body


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("roles")
    settings = make_settings(
        tmp / "home",
        reserved_ips="203.0.113.0/29",
        rate_limit_per_key=0,
        rate_limit_per_source=0,
        rate_limit_auth_failures_per_minute=0,
    )
    with live_server(settings, FakeRuntime()) as srv:
        a, b = seed_tenant(srv, "a"), seed_tenant(srv, "b")
        with srv.client(a.keys[OWNER]) as c:
            body = {"gpu_type": "NVIDIA RTX A6000", "docker_image": "img", "volume_gb": 1}
            cluster = data(c.post("/v1/clusters", json=body))
            assert srv.server.reconciler.wait_idle(10)
            snapshot = data(c.post(f"/v1/clusters/{cluster['id']}/snapshots", json={}), 202)
            ssh = {"name": "k", "public_key": public_key(tmp)}
            ssh_key = data(c.post("/v1/ssh-keys", json=ssh))
            auth = {"name": "reg", "username": "u", "password": "p"}
            registry_auth = data(c.post("/v1/registry-auths", json=auth))
            nv = {"name": "nv", "size": 10, "dataCenterId": "local"}
            volume = data(c.post("/v1/networkvolumes", json=nv))
            ip = data(c.post("/v1/reserved-ips"))
            group = data(c.post("/v1/security-groups", json={"name": "g", "rules": []}))
            secret = data(c.post("/v1/secrets", json={"name": "s", "value": "v"}))
            template = data(c.post("/v1/templates", json={"name": "t", "docker_image": "img"}))
            endpoint_body = {"name": "e", "image": "img", "gpu_type_ids": ["NVIDIA RTX A6000"]}
            endpoint = data(c.post("/v1/endpoints", json=endpoint_body))
        real = {
            "account_id": a.account_id,
            "project_id": a.project_id,
            "cluster_id": cluster["id"],
            "pod_id": cluster["id"],
            "snapshot_id": snapshot["id"],
            "ssh_key_id": ssh_key["id"],
            "registry_auth_id": registry_auth["id"],
            "network_volume_id": volume["id"],
            "reserved_ip_id": ip["id"],
            "security_group_id": group["id"],
            "secret_id": secret["id"],
            "template_id": template["id"],
            "endpoint_id": endpoint["id"],
            "member_id": a.members[VIEWER],
            "port": 8888,
            # RunPod v2's ``{id}``, by resource (api/runpod_v2/).
            "v2:templates": template["id"],
            "v2:registries": str(registry_auth["id"]),
            "v2:network-volumes": volume["id"],
        }
        try:
            yield World(srv, a, b, real)
        finally:
            for client in _clients.values():
                client.close()
            _clients.clear()


def routes(srv: LiveServer) -> list[tuple[str, str]]:
    doc = httpx.get(f"{srv.url}/openapi.json", timeout=60, verify=trusted_tls()).json()
    return [(m.upper(), p) for p, ops in doc["paths"].items() for m in ops]


_PARAM = re.compile(r"\{([^}]+)\}")


def fill(path: str, ids: dict[str, Any]) -> str:
    return _PARAM.sub(lambda m: str(ids.get(m.group(1), MISSING.get(m.group(1), 999_999))), path)


_V2 = re.compile(r"^/runpod/v2/([^/]+)/\{id\}")


def call(
    srv: LiveServer, key: str, method: str, path: str, ids: dict[str, Any], account_id: int
) -> httpx.Response:
    params: dict[str, Any] = {}
    v2 = _V2.match(path)
    if v2 is not None and f"v2:{v2.group(1)}" in ids:
        ids = {**ids, "id": ids[f"v2:{v2.group(1)}"]}
    if path.startswith("/distributed_jobs_v2"):
        params = {"project_id": ids.get("project_id", 999_999), "location": "local"}
    if path.endswith("/pods/{pod_id}/logs"):
        params = {"follow": "false"}  # the stream ends with what is there now
    url = fill(path, ids)
    body = BODIES.get((method, path), {}) if method in ("POST", "PUT", "PATCH") else None
    return _client(srv, key).request(method, url, params=params, json=body)


_clients: dict[tuple[str, str], httpx.Client] = {}


def _client(srv: LiveServer, key: str) -> httpx.Client:
    """One client (one keep-alive connection) per key: the loops make ~1,500 calls."""
    client = _clients.get((srv.url, key))
    if client is None:
        client = _clients[(srv.url, key)] = srv.client(key)
    return client


def code(r: httpx.Response) -> str | None:
    try:
        body = r.json()
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    if isinstance(body.get("code"), str) and "type" in body:  # RFC 9457 (RunPod v2)
        return str(body["code"])
    error = body.get("error") or body.get("errors")  # v1 envelope, seed 002's
    return error.get("code") if isinstance(error, dict) else None


def test_every_route_answers_each_role_as_the_matrix_says(world: World) -> None:
    srv, a = world.srv, world.a
    unclassified, wrong = [], []
    # Refused roles first, with A's real ids (refused even though it exists); then
    # allowed roles: reads with real ids, changes with ids of nothing (no route
    # destroys A's resources half-way through the loop).
    for method, path in routes(srv):
        klass = expected(method, path)
        if klass is None:
            unclassified.append(f"{method} {path}")
            continue
        if klass == PUBLIC:
            continue
        for role in sorted(ROLES, key=lambda r: r in MAY[klass]):
            allowed = role in MAY[klass]
            ids = dict(world.real)
            if (method, path) in OTHER_MEMBER:
                ids["member_id"] = a.members[ADMIN]
            if allowed and method != "GET" and "{" in path:
                keep = {"account_id", "project_id", "port"}
                if (method, path) in BODIES:
                    keep |= {"member_id"}
                ids = {k: v for k, v in ids.items() if k in keep}
            r = call(srv, a.keys[role], method, path, ids, a.account_id)
            if allowed and (r.status_code in (401, 403) or r.status_code >= 500):
                wrong.append(f"{role} {method} {path}: {r.status_code} {r.text[:200]}")
            if not allowed and (r.status_code != 403 or code(r) != "FORBIDDEN"):
                wrong.append(f"{role} {method} {path}: {r.status_code}, 403 expected")
    assert not unclassified, f"routes missing from EXPECTED: {unclassified}"
    assert not wrong, "\n".join(wrong)


def test_another_accounts_ids_read_as_none(world: World) -> None:
    """A member of B, whatever its role, naming A's resources hears what it hears for
    ids of nothing: 404 for a read its role may make, the same 403 (or 400 for a body
    judged first) otherwise; /v1/accounts/{A}/... is 404 for every role of B."""
    srv, b = world.srv, world.b
    wrong = []
    for method, path in routes(srv):
        klass = expected(method, path)
        if klass in (None, PUBLIC, "operator") or ("{" not in path and "jobs" not in path):
            continue
        for role in ROLES:
            theirs = call(srv, b.keys[role], method, path, world.real, b.account_id)
            nothing = call(srv, b.keys[role], method, path, {}, b.account_id)
            if path.startswith(ACC):
                if theirs.status_code != 404:
                    wrong.append(f"B {role} {method} {path}: {theirs.status_code}, 404 expected")
                continue
            same = (theirs.status_code, code(theirs)) == (nothing.status_code, code(nothing))
            # A read its role allows must be 404; a change may be refused for its body
            # first (400), the same whoever's id it names.
            must_404 = method == "GET" and role in MAY[klass]
            if not same or theirs.status_code < 400 or (must_404 and theirs.status_code != 404):
                wrong.append(
                    f"B {role} {method} {path}: {theirs.status_code} {code(theirs)} for A's "
                    f"ids, {nothing.status_code} {code(nothing)} for none"
                )
    assert not wrong, "\n".join(wrong)


def test_lists_show_only_the_acting_accounts_resources(world: World) -> None:
    srv, b = world.srv, world.b
    with srv.client(b.keys[OWNER]) as c:
        clusters = data(c.get("/v1/clusters"), 200)
        assert world.real["cluster_id"] not in str(clusters)
        volumes = data(c.get("/v1/networkvolumes"), 200)
        assert world.real["network_volume_id"] not in str(volumes)
        assert data(c.get("/v1/snapshots"), 200)["snapshots"] == []


# -- GraphQL --------------------------------------------------------------------------

POD = "query($id: String!) { pod(input: {podId: $id}) { id } }"
STOP = "mutation($id: String!) { podStop(input: {podId: $id}) { id } }"
DEPLOY = (
    'mutation { podFindAndDeployOnDemand(input: {gpuTypeId: "NVIDIA RTX A6000", '
    'imageName: "img", gpuCount: 1, containerDiskInGb: 0}) { id } }'
)


def gql(srv: LiveServer, key: str, query: str, **variables: Any) -> dict[str, Any]:
    return srv.graphql(query, variables or None, key=key)


def error_code(body: dict[str, Any]) -> str | None:
    errors = body.get("errors") or []
    return errors[0]["extensions"]["code"] if errors else None


def test_graphql_fields_answer_each_role_as_the_matrix_says(world: World) -> None:
    srv, a = world.srv, world.a
    cid = world.real["cluster_id"]
    keys_text = gql(srv, a.keys[OWNER], "{ myself { pubKey } }")["data"]["myself"]["pubKey"]
    settings = "mutation($k: String!) { updateUserSettings(input: {pubKey: $k}) { id } }"
    checks: list[tuple[str, str, dict[str, Any]]] = [
        ("any", "{ myself { id pubKey } }", {}),
        ("any", "{ gpuTypes { id } }", {}),
        ("read", "{ myself { clusters { id } } }", {}),
        ("read", "{ myself { pods { id } } }", {}),
        ("read", "{ myself { networkVolumes { id } } }", {}),
        ("read", "{ myself { podTemplates { id } } }", {}),
        ("read", "{ myself { endpoints { id } } }", {}),
        ("write", 'mutation { deleteEndpoint(id: "noendpoint0001") }', {}),
        (
            "write",
            'mutation { saveEndpoint(input: {id: "noendpoint0001", workersMax: 1}) { id } }',
            {},
        ),
        ("read", POD, {"id": cid}),
        ("read", "query($id: String!) { cluster(input: {clusterId: $id}) { id } }", {"id": cid}),
        ("billing", "{ myself { currentSpendPerHr } }", {}),
        ("write", STOP, {"id": "nocluster0000"}),
        ("write", 'mutation { podTerminate(input: {podId: "nocluster0000"}) }', {}),
        ("write", 'mutation { podResume(input: {podId: "nocluster0000"}) { id } }', {}),
        ("write", 'mutation { deleteTemplate(templateName: "no such template") }', {}),
        (
            "write",
            'mutation { saveTemplate(input: {id: "notemplate", readme: "x"}) { id } }',
            {},
        ),
        # pubKey replaces the account's SSH keys: a change to its clusters' access.
        ("write", settings, {"k": keys_text}),
        # Registry credentials decide what the account's clusters pull.
        ("write", 'mutation { deleteRegistryAuth(registryAuthId: "999999") }', {}),
        (
            "write",
            'mutation { updateRegistryAuth(input: {id: "999999", username: "u", password: "p"}) '
            "{ id } }",
            {},
        ),
        (
            "write",
            'mutation { saveRegistryAuth(input: {name: "", username: "u", password: "p"}) { id } }',
            {},
        ),
    ]
    wrong = []
    for klass, query, variables in checks:
        for role in ROLES:
            body = gql(srv, a.keys[role], query, **variables)
            got = error_code(body)
            if role in MAY[klass] and got == "FORBIDDEN":
                wrong.append(f"{role} {query}: refused")
            if role not in MAY[klass] and got != "FORBIDDEN":
                wrong.append(f"{role} {query}: {got}, FORBIDDEN expected")
    assert not wrong, "\n".join(wrong)
    # A refused field is null beside the fields that stand.
    body = gql(srv, a.keys[BILLING], "{ myself { id clusters { id } } }")
    assert [e["path"] for e in body["errors"]] == [["myself", "clusters"]]
    assert error_code(body) == "FORBIDDEN"
    # Deploying is a change: a viewer hears FORBIDDEN and nothing is created.
    with srv.client(a.keys[OWNER]) as c:
        before = data(c.get("/v1/clusters"), 200)["pagination"]["total"]
        assert error_code(gql(srv, a.keys[VIEWER], DEPLOY)) == "FORBIDDEN"
        assert data(c.get("/v1/clusters"), 200)["pagination"]["total"] == before


def test_graphql_another_accounts_cluster_reads_as_none(world: World) -> None:
    srv, b = world.srv, world.b
    cid = world.real["cluster_id"]
    for role in (OWNER, ADMIN, MEMBER, VIEWER):
        assert error_code(gql(srv, b.keys[role], POD, id=cid)) == "CLUSTER_NOT_FOUND"
        assert error_code(gql(srv, b.keys[role], POD, id="nocluster0000")) == "CLUSTER_NOT_FOUND"
    for role in (OWNER, ADMIN, MEMBER):
        assert error_code(gql(srv, b.keys[role], STOP, id=cid)) == "CLUSTER_NOT_FOUND"
    mine = gql(srv, b.keys[OWNER], "{ myself { clusters { id } } }")["data"]["myself"]
    assert mine["clusters"] == []


# -- API keys between roles -----------------------------------------------------------


def fresh_key(srv: LiveServer, tenant: Tenant, role: Role) -> tuple[int, str]:
    """A new write key of ``role``'s member of ``tenant``: (id, secret)."""
    with srv.server.ctx.transaction() as s:
        member = s.get(Member, tenant.members[role])
        assert member is not None
        issued = issue_key(
            s, user_id=member.user_id, account_id=tenant.account_id, name="t", scope=Scope.WRITE
        )
    return issued.id, issued.key


def may_revoke(actor: Role, holder: Role) -> int:
    """What ``actor`` hears revoking a key of another member whose role is ``holder``:
    200 where its role may take the holder's role away (owners anybody's, admins all
    but owners'), 403 for an admin and an owner's key, 404 for the roles that do not
    manage members (others' keys are not theirs to see)."""
    if actor not in MAY["members"]:
        return 404
    if holder == OWNER and actor != OWNER:
        return 403
    return 200


def test_key_management_between_roles(world: World) -> None:
    srv, a = world.srv, world.a
    wrong = []
    for actor in ROLES:
        listed = _client(srv, a.keys[actor]).get("/v1/api-keys", params={"all": "true"})
        if (listed.status_code == 200) != (actor in MAY["members"]):
            wrong.append(f"{actor} lists every key: {listed.status_code}")
        for holder in ROLES:
            key_id, secret = fresh_key(srv, a, holder)
            r = _client(srv, a.keys[actor]).delete(f"/v1/api-keys/{key_id}")
            want = 200 if actor == holder else may_revoke(actor, holder)
            codes = {403: "FORBIDDEN", 404: "API_KEY_NOT_FOUND"}
            if r.status_code != want or (want != 200 and code(r) != codes[want]):
                wrong.append(f"{actor} revokes {holder}'s key: {r.status_code}, {want} expected")
            still = httpx.get(
                f"{srv.url}/v1/me",
                headers={"Authorization": f"Bearer {secret}"},
                verify=trusted_tls(),
            )
            if (still.status_code == 200) == (want == 200):
                wrong.append(f"{holder}'s key after {actor}'s revoke: {still.status_code}")
    assert not wrong, "\n".join(wrong)
    # The refusal an admin hears names both roles, in the v1 envelope.
    key_id, _ = fresh_key(srv, a, OWNER)
    body = _client(srv, a.keys[ADMIN]).delete(f"/v1/api-keys/{key_id}").json()
    assert body["success"] is False
    assert body["error"]["details"]["role"] == "admin"
    assert body["error"]["details"]["target_role"] == "owner"


# What a key restricted to a project never does, whatever its role: the account's.
ACCOUNT_LEVEL_CLASSES = frozenset({"billing", "budget", "members", "projects", "audit", "account"})


def test_a_key_restricted_to_a_project_gets_no_account_level_route(world: World) -> None:
    """A's owner's key restricted to A's project, on every route whose class concerns
    the whole account: 403 FORBIDDEN naming the restriction, with A's real ids."""
    srv, a = world.srv, world.a
    with srv.server.ctx.transaction() as s:
        member = s.get(Member, a.members[OWNER])
        assert member is not None
        issued = issue_key(
            s, user_id=member.user_id, account_id=a.account_id, name="ci", scope=Scope.WRITE
        )
        row = s.get(ApiKey, issued.id)
        assert row is not None
        row.project_id, row.restricted = a.project_id, True
    wrong, seen = [], 0
    for method, path in routes(srv):
        if expected(method, path) not in ACCOUNT_LEVEL_CLASSES:
            continue
        seen += 1
        ids = dict(world.real)
        if (method, path) in OTHER_MEMBER:
            ids["member_id"] = a.members[ADMIN]
        r = call(srv, issued.key, method, path, ids, a.account_id)
        if r.status_code != 403 or code(r) != "FORBIDDEN":
            wrong.append(f"{method} {path}: {r.status_code} {r.text[:200]}")
    assert seen > 15 and not wrong, "\n".join(wrong)
