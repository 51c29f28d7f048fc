"""A small typed HTTP client for the REST v1 API, one method per endpoint.

Every method returns the envelope's ``data`` (a JSON object) on success and raises
:class:`ApiError` on an error envelope (or any non-2xx answer) and
:class:`ServerUnreachable` when no server answers at the URL. Nothing else escapes:
transport failures other than a refused connection become :class:`ServerUnreachable`
too, with the reason.
"""

from __future__ import annotations

from typing import Any

import httpx

from gpuyard.core.tls_trust import trusted_tls

JSON = dict[str, Any]


class ApiError(Exception):
    """The server answered with an error: ``code`` (stable, e.g. ``CLUSTER_NOT_FOUND``),
    ``message``, ``details`` and the HTTP ``status``."""

    def __init__(self, code: str, message: str, details: JSON | None, status: int) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.details: JSON = details or {}
        self.status = status


class ServerUnreachable(Exception):
    """No gpuyard server answered at ``url``; ``reason`` says why (refused, timeout...)."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"{url}: {reason}")
        self.url = url
        self.reason = reason


class GpuyardClient:
    """Client of one server. ``transport`` is for tests (e.g. ``httpx.MockTransport``).

    Usable as a context manager; :meth:`close` releases the connection pool.
    """

    def __init__(
        self,
        url: str,
        api_key: str | None,
        *,
        timeout_s: float = 60.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(
            base_url=self.url,
            headers=headers,
            timeout=timeout_s,
            transport=transport,
            verify=trusted_tls(),
        )

    def close(self) -> None:
        self._http.close()

    @property
    def http(self) -> httpx.Client:
        """The underlying HTTP client, for APIs with their own envelope (training)."""
        return self._http

    def __enter__(self) -> GpuyardClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing -------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        json: JSON | None = None,
        params: dict[str, str | int] | None = None,
    ) -> JSON:
        """One API call: its ``data`` (a non-object wrapped as ``{"value": …}``).
        Raises ApiError with the envelope's code, message and details, or
        ServerUnreachable."""
        try:
            resp = self._http.request(method, path, json=json, params=params)
        except httpx.ConnectError as e:
            raise ServerUnreachable(self.url, f"connection failed ({e})") from e
        except httpx.TimeoutException as e:
            raise ServerUnreachable(self.url, "timed out waiting for an answer") from e
        except httpx.TransportError as e:
            raise ServerUnreachable(self.url, str(e) or type(e).__name__) from e
        try:
            body = resp.json()
        except ValueError:
            body = None
        if resp.is_success and isinstance(body, dict) and body.get("success") is not False:
            data = body.get("data", body)
            return data if isinstance(data, dict) else {"value": data}
        err = body.get("error") if isinstance(body, dict) else None
        if isinstance(err, dict):
            details = err.get("details")
            raise ApiError(
                str(err.get("code") or "HTTP_ERROR"),
                str(err.get("message") or resp.reason_phrase),
                details if isinstance(details, dict) else None,
                resp.status_code,
            )
        text = resp.text.strip()[:200] or resp.reason_phrase
        raise ApiError("HTTP_ERROR", f"HTTP {resp.status_code}: {text}", None, resp.status_code)

    # -- endpoints ------------------------------------------------------------------

    def healthz(self) -> JSON:
        """``GET /healthz``: ``{"ok": true, "engine": "ok" | problem}`` (no key needed)."""
        return self.request("GET", "/healthz")

    def create_cluster(self, body: JSON) -> JSON:
        """``POST /v1/clusters``; ``body`` follows ``CreateCluster``. Returns the cluster."""
        return self.request("POST", "/v1/clusters", json=body)

    def list_clusters(
        self,
        *,
        status: str | None = None,
        search: str | None = None,
        project_id: int | None = None,
        page: int = 1,
        per_page: int = 50,
        cursor: str | None = None,
    ) -> JSON:
        """``GET /v1/clusters``: ``{"clusters": [...], "pagination": {...}}``; with
        ``cursor`` (a ``pagination.next_cursor``) the page after it."""
        params: dict[str, str | int] = {"page": page, "per_page": per_page}
        if cursor:
            params["cursor"] = cursor
        if status:
            params["status"] = status
        if search:
            params["search"] = search
        if project_id is not None:
            params["project_id"] = project_id
        return self.request("GET", "/v1/clusters", params=params)

    def get_cluster(self, cluster_id: str) -> JSON:
        return self.request("GET", f"/v1/clusters/{cluster_id}")

    def start_cluster(self, cluster_id: str, body: JSON | None = None) -> JSON:
        """``POST /v1/clusters/{id}/start``; ``body`` follows ``StartCluster``."""
        return self.request("POST", f"/v1/clusters/{cluster_id}/start", json=body or {})

    def bid_resume_cluster(self, cluster_id: str, body: JSON) -> JSON:
        """``POST /v1/clusters/{id}/bid-resume``; ``body``: ``bid_per_gpu``, ``gpu_count``."""
        return self.request("POST", f"/v1/clusters/{cluster_id}/bid-resume", json=body)

    def stop_cluster(self, cluster_id: str) -> JSON:
        return self.request("POST", f"/v1/clusters/{cluster_id}/stop")

    def restart_cluster(self, cluster_id: str) -> JSON:
        return self.request("POST", f"/v1/clusters/{cluster_id}/restart")

    def terminate_cluster(self, cluster_id: str) -> JSON:
        return self.request("DELETE", f"/v1/clusters/{cluster_id}")

    def open_port(self, cluster_id: str, port: int) -> JSON:
        """``GET /v1/clusters/{id}/ports/{port}/open``: a one-time ``url`` that opens a
        private http port in a browser, with ``expires_at``."""
        return self.request("GET", f"/v1/clusters/{cluster_id}/ports/{port}/open")

    def cluster_events(self, cluster_id: str) -> JSON:
        """``GET /v1/clusters/{id}/events``, every page followed by its cursor:
        ``{"events": [...]}``, oldest first."""
        path = f"/v1/clusters/{cluster_id}/events"
        events: list[Any] = []
        params: dict[str, str | int] = {"per_page": 500}
        while True:
            data = self.request("GET", path, params=params)
            events += data.get("events", [])
            cursor = (data.get("pagination") or {}).get("next_cursor")
            if not cursor:
                return {"events": events}
            params["cursor"] = cursor

    def gpu_types(self) -> JSON:
        """``GET /v1/gpu-types``: ``{"gpu_types": [...]}`` with prices and availability."""
        return self.request("GET", "/v1/gpu-types")

    def hosts(self) -> JSON:
        """``GET /v1/hosts`` (admin scope): ``{"installation_id", "hosts": [...]}``."""
        return self.request("GET", "/v1/hosts")

    def add_host(self, body: JSON) -> JSON:
        """``POST /v1/hosts`` (admin): the new host."""
        return self.request("POST", "/v1/hosts", json=body)

    def get_host(self, host_id: int) -> JSON:
        """``GET /v1/hosts/{id}`` (admin)."""
        return self.request("GET", f"/v1/hosts/{host_id}")

    def update_host(self, host_id: int, body: JSON) -> JSON:
        """``PATCH /v1/hosts/{id}`` (admin): the host as changed."""
        return self.request("PATCH", f"/v1/hosts/{host_id}", json=body)

    def cordon_host(self, host_id: int) -> JSON:
        """``POST /v1/hosts/{id}/cordon`` (admin)."""
        return self.request("POST", f"/v1/hosts/{host_id}/cordon")

    def drain_host(self, host_id: int) -> JSON:
        """``POST /v1/hosts/{id}/drain`` (admin)."""
        return self.request("POST", f"/v1/hosts/{host_id}/drain")

    def uncordon_host(self, host_id: int) -> JSON:
        """``POST /v1/hosts/{id}/uncordon`` (admin)."""
        return self.request("POST", f"/v1/hosts/{host_id}/uncordon")

    def delete_host(self, host_id: int) -> JSON:
        """``DELETE /v1/hosts/{id}`` (admin): ``{"id", "name", "deleted"}``."""
        return self.request("DELETE", f"/v1/hosts/{host_id}")

    def host_ssh_key(self) -> JSON:
        """``GET /v1/hosts/ssh-key`` (admin): ``{"public_key": ...}``."""
        return self.request("GET", "/v1/hosts/ssh-key")

    def orphans(self, *, include_done: bool = False) -> JSON:
        """``GET /v1/orphans`` (admin): ``{"installation_id", "orphans": [...]}``."""
        return self.request("GET", "/v1/orphans", params={"all": "true"} if include_done else None)

    def delete_orphan(self, orphan_id: str) -> JSON:
        """``DELETE /v1/orphans/{id}`` (admin): the orphan, now deleted."""
        return self.request("DELETE", f"/v1/orphans/{orphan_id}")

    def billing(
        self,
        *,
        from_: str | None = None,
        to: str | None = None,
        group_by: str | None = None,
        project_id: int | None = None,
    ) -> JSON:
        """``GET /v1/billing``: totals and ``items`` per cluster, GPU type or day."""
        params: dict[str, str | int] = {}
        for name, value in (("from", from_), ("to", to), ("group_by", group_by)):
            if value:
                params[name] = value
        if project_id is not None:
            params["project_id"] = project_id
        return self.request("GET", "/v1/billing", params=params)

    # -- training-cluster resources ---------------------------------------------------

    @staticmethod
    def _scope(project_id: int | None, active_iam: int | None) -> dict[str, str | int]:
        params: dict[str, str | int] = {}
        if project_id is not None:
            params["project_id"] = project_id
        if active_iam is not None:
            params["active_iam"] = active_iam
        return params

    def list_projects(self, *, active_iam: int | None = None) -> JSON:
        """``GET /v1/projects``: ``{"projects": [...]}``."""
        return self.request("GET", "/v1/projects", params=self._scope(None, active_iam))

    def create_project(self, name: str, *, active_iam: int | None = None) -> JSON:
        """``POST /v1/projects``. Returns the project."""
        return self.request(
            "POST", "/v1/projects", json={"name": name}, params=self._scope(None, active_iam)
        )

    def locations(self) -> JSON:
        """``GET /v1/locations``: ``{"locations": [...]}`` with GPU capacity."""
        return self.request("GET", "/v1/locations")

    def plans(self) -> JSON:
        """``GET /v1/plans``: ``{"plans": [...]}`` (``sku_id`` and price per node-hour)."""
        return self.request("GET", "/v1/plans")

    def list_ssh_keys(self, *, active_iam: int | None = None) -> JSON:
        """``GET /v1/ssh-keys``: ``{"ssh_keys": [...]}``."""
        return self.request("GET", "/v1/ssh-keys", params=self._scope(None, active_iam))

    def add_ssh_key(self, name: str, public_key: str, *, active_iam: int | None = None) -> JSON:
        """``POST /v1/ssh-keys``. Returns the key with its fingerprint."""
        return self.request(
            "POST",
            "/v1/ssh-keys",
            json={"name": name, "public_key": public_key},
            params=self._scope(None, active_iam),
        )

    def delete_ssh_key(self, key_id: str, *, active_iam: int | None = None) -> JSON:
        return self.request(
            "DELETE", f"/v1/ssh-keys/{key_id}", params=self._scope(None, active_iam)
        )

    def list_registry_auths(self, *, active_iam: int | None = None) -> JSON:
        """``GET /v1/registry-auths``: ``{"registry_auths": [...]}`` (id and name)."""
        return self.request("GET", "/v1/registry-auths", params=self._scope(None, active_iam))

    def create_registry_auth(
        self, name: str, username: str, password: str, *, active_iam: int | None = None
    ) -> JSON:
        """``POST /v1/registry-auths``. The password is sent once, never answered."""
        return self.request(
            "POST",
            "/v1/registry-auths",
            json={"name": name, "username": username, "password": password},
            params=self._scope(None, active_iam),
        )

    def update_registry_auth(
        self, auth_id: int, changes: JSON, *, active_iam: int | None = None
    ) -> JSON:
        """``PATCH /v1/registry-auths/{id}`` with ``username``, ``password``, ``name``."""
        return self.request(
            "PATCH",
            f"/v1/registry-auths/{auth_id}",
            json=changes,
            params=self._scope(None, active_iam),
        )

    def delete_registry_auth(self, auth_id: int, *, active_iam: int | None = None) -> JSON:
        return self.request(
            "DELETE", f"/v1/registry-auths/{auth_id}", params=self._scope(None, active_iam)
        )

    def list_images(self) -> JSON:
        """``GET /v1/images``: ``{"images": [...]}``."""
        return self.request("GET", "/v1/images")

    def register_image(self, body: JSON) -> JSON:
        """``POST /v1/images`` (admin scope); ``body``: name, version, image, description."""
        return self.request("POST", "/v1/images", json=body)

    def list_reserved_ips(
        self, *, project_id: int | None = None, active_iam: int | None = None
    ) -> JSON:
        """``GET /v1/reserved-ips``: ``{"reserved_ips": [...]}``."""
        return self.request("GET", "/v1/reserved-ips", params=self._scope(project_id, active_iam))

    def allocate_reserved_ip(
        self, *, project_id: int | None = None, active_iam: int | None = None
    ) -> JSON:
        """``POST /v1/reserved-ips``: the lowest free pool address."""
        return self.request("POST", "/v1/reserved-ips", params=self._scope(project_id, active_iam))

    def release_reserved_ip(
        self, ip_id: str, *, project_id: int | None = None, active_iam: int | None = None
    ) -> JSON:
        return self.request(
            "DELETE", f"/v1/reserved-ips/{ip_id}", params=self._scope(project_id, active_iam)
        )

    def list_security_groups(
        self, *, project_id: int | None = None, active_iam: int | None = None
    ) -> JSON:
        """``GET /v1/security-groups``: ``{"security_groups": [...]}``."""
        return self.request(
            "GET", "/v1/security-groups", params=self._scope(project_id, active_iam)
        )

    def create_security_group(
        self, body: JSON, *, project_id: int | None = None, active_iam: int | None = None
    ) -> JSON:
        """``POST /v1/security-groups``; ``body``: name, description, rules."""
        return self.request(
            "POST", "/v1/security-groups", json=body, params=self._scope(project_id, active_iam)
        )

    def delete_security_group(
        self, group_id: str, *, project_id: int | None = None, active_iam: int | None = None
    ) -> JSON:
        return self.request(
            "DELETE",
            f"/v1/security-groups/{group_id}",
            params=self._scope(project_id, active_iam),
        )

    # -- snapshots ------------------------------------------------------------------

    def create_snapshot(self, cluster_id: str, body: JSON) -> JSON:
        """``POST /v1/clusters/{id}/snapshots``; ``body``: name, description."""
        return self.request("POST", f"/v1/clusters/{cluster_id}/snapshots", json=body)

    def list_snapshots(
        self,
        *,
        cluster_id: str | None = None,
        project_id: int | None = None,
        network_volume_id: str | None = None,
    ) -> JSON:
        params: dict[str, str | int] = {"per_page": 500}
        if cluster_id:
            params["cluster_id"] = cluster_id
        if project_id:
            params["project_id"] = project_id
        if network_volume_id:
            params["network_volume_id"] = network_volume_id
        return self.request("GET", "/v1/snapshots", params=params)

    def get_snapshot(self, snapshot_id: str) -> JSON:
        return self.request("GET", f"/v1/snapshots/{snapshot_id}")

    def delete_snapshot(self, snapshot_id: str) -> JSON:
        return self.request("DELETE", f"/v1/snapshots/{snapshot_id}")
