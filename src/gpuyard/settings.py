"""All configuration in one object, read from ``GPUYARD_*`` environment variables.

Nothing reads the environment at import time: ``Settings()`` is built by the entry
point and passed down (``create_app(settings)``, api/engine_server.py).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from gpuyard.core.billing.pricing import Prices
from gpuyard.core.fleet import PlacementPolicy
from gpuyard.core.image_refs import DEFAULT_ALLOWED_REGISTRIES, RegistryPolicy
from gpuyard.core.network.ippool import parse_pool
from gpuyard.core.placement import AllocationRatios
from gpuyard.core.training.network import check_pool


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GPUYARD_", extra="ignore")

    home: Path = Field(default_factory=lambda: Path.home() / ".gpuyard")
    database_url: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    engine_url: str | None = None
    start_podman_service: bool = True

    # Local host inventory overrides (declared instead of discovered).
    local_gpus: str | None = None
    local_vcpus: int | None = None
    local_memory_gb: int | None = None
    local_disk_gb: int | None = None
    # The local machine's CUDA driver version ("12.4") where NVML cannot tell it (GPUs
    # declared with local_gpus); NVML's own answer wins where it has one.
    local_cuda_version: str | None = Field(default=None, pattern=r"^[0-9]+(\.[0-9]+)?$")
    local_cloud_type: str = "SECURE"
    local_location: str = "local"
    # Address users reach published ports on (shown in connection strings).
    public_address: str | None = None
    # Where serverless workers' containers reach this server (RunPod's RUNPOD_WEBHOOK_*
    # URLs point below it), e.g. http://10.0.0.5:8000. None: derived
    # (services/serverless/callback.py; docs/decisions.md "Where serverless workers
    # reach the server").
    serverless_callback_url: str | None = None
    # The port of a second listener on every address that serves serverless workers'
    # requests only (worker keys), for a server on loopback only. None: no such
    # listener (workers then need GPUYARD_HOST or the callback URL).
    serverless_worker_port: int | None = Field(default=None, ge=1, le=65535)
    # The pool projects reserve public IPs from (core/network/ippool.py): a CIDR such as
    # 127.0.10.0/28 or comma-separated addresses and CIDRs. None: no reserved IPs.
    reserved_ips: str | None = None
    # The pool training clusters' own networks (a /24 each) come from; the same subnet
    # is used on every host a cluster's nodes run on (core/training/network.py). None:
    # a /16 of 10.192.0.0/10 chosen by the installation's id.
    training_subnets: str | None = None

    # Placement (core/placement.py): binpack fills the fullest host that fits first
    # (whole hosts stay free for large requests); spread takes the emptiest.
    placement_policy: PlacementPolicy = PlacementPolicy.BINPACK

    vcpu_allocation_ratio: float = 1.0
    memory_allocation_ratio: float = 1.0
    disk_allocation_ratio: float = 1.0

    # Registries images may come from (core/image_refs.py): names, *.wildcards, exact
    # addresses for a private registry, `localhost` (local images, never pulled) and
    # `public`. Addresses and localhost names are refused unless listed exactly.
    allowed_registries: str = DEFAULT_ALLOWED_REGISTRIES

    port_range_start: int = 20000
    port_range_end: int = 29999

    price_vcpu_hour: float = 0.0
    price_memory_gb_hour: float = 0.0
    price_container_disk_gb_month: float = 0.10
    price_volume_gb_month_running: float = 0.10
    price_volume_gb_month_stopped: float = 0.20

    reconcile_interval_s: float = 2.0
    reconcile_workers: int = 16
    stop_timeout_s: int = 10
    readiness_timeout_s: float = 120.0

    # Fleet (README "Hosts"): every host's engine is pinged this often; after
    # ``heartbeat_misses`` misses in a row it is unreachable (nothing new lands there,
    # its clusters keep their GPUs and bill nothing until it answers again). A ping
    # that has no answer within ``heartbeat_timeout_s`` is a miss, however long engine
    # operations may take (``remote_engine_timeout_s``): a host that stops answering
    # is unreachable within misses x max(interval, timeout) + timeout (3 x 5 + 3 = 18 s
    # with these defaults), and reachable again within interval + timeout of answering.
    heartbeat_interval_s: float = Field(default=5.0, gt=0)
    heartbeat_misses: int = Field(default=3, ge=1)
    heartbeat_timeout_s: float = Field(default=3.0, gt=0)
    # Each engine's containers are listed and compared with the store (crashes found,
    # orphans collected) after a heartbeat at most this often.
    observe_interval_s: float = Field(default=5.0, gt=0)
    # Several API replicas on one database (services/installation/leases.py): each background duty
    # is owned by one replica through a lease in the database that lasts this long
    # unless renewed; a dead replica's duties move to another within about this time.
    lease_ttl_s: float = Field(default=15.0, gt=0)
    # Engine calls to a host other than this machine give up after this long, so a
    # dead host holds up only its own work lane.
    remote_engine_timeout_s: float = 30.0

    # Ownership and collection (README "What gpuyard owns"): a container of ours the
    # database does not know is removed after this grace; a volume is quarantined and
    # deleted only after the retention (or by an admin).
    orphan_container_grace_s: float = 120.0
    orphan_volume_retention_hours: float = 72.0
    # Desired state wins: a cluster that should run and does not is recreated with
    # exponential back-off; after ``restart_limit`` failures within
    # ``restart_window_s`` it goes to error.
    restart_backoff_initial_s: float = 1.0
    restart_backoff_max_s: float = 300.0
    restart_limit: int = 5
    restart_window_s: float = 600.0
    # Engines that cannot apply CPU/memory limits: refuse creates unless allowed here.
    allow_unenforced_limits: bool = False
    # Disk sizes (docs/decisions.md "Disk sizes"): a sized volume is an ext4 image file
    # in ``volume_image_dir`` on its engine's host, loop-mounted by Podman; a container
    # disk is held to its size by the engine (overlay on XFS with project quotas).
    # Hosts that cannot enforce either refuse clusters unless this allows it. An empty
    # ``volume_image_dir`` makes no images: volume sizes are then not enforced.
    allow_unenforced_disk: bool = False
    # A host whose engine is reached over tcp:// offers the proxy no private path to a
    # private http port, which would be published on the host's addresses: creates of
    # clusters with such ports are refused there unless allowed here.
    allow_exposed_private_ports: bool = False
    volume_image_dir: str = "/var/lib/gpuyard/volume-images"
    # Spare volume images kept ready per size in use (runtimes/volumes/images.py
    # SPARES_FOLDER): a new volume's first start takes one instead of making its file
    # system. 0: none, each new volume's image is made on its start's path.
    volume_spares: int = Field(default=1, ge=0, le=4)
    # Each account's clusters share a network closed to other accounts by host firewall
    # rules (runtimes/hosts/firewall.py; root needed on Podman). True: run without them, letting
    # clusters of different accounts reach each other (single-tenant installations).
    allow_unisolated_networks: bool = False
    # How long an Idempotency-Key is remembered.
    idempotency_ttl_hours: float = 24.0
    # Secrets at rest (README "Security"): the Fernet key that encrypts secret env
    # values and munge keys in the database. None: ``<home>/secret.key``, created 0600
    # on the first start. Replicas sharing one database must share this file.
    secret_key_file: Path | None = None

    # HTTP proxy (README "HTTP proxy"): every http port of a cluster is reachable at
    # ``{scheme}://{cluster_id}-{port}.{proxy_domain}`` through Caddy, which gpuyard
    # configures through its admin API. ``caddy_admin``: the admin address of a Caddy
    # gpuyard should configure (``unix//path`` or ``host:port``); None: gpuyard starts
    # its own (``caddy_binary``) with its admin socket in the home.
    proxy_enabled: bool = True
    proxy_domain: str = "proxy.localhost"
    proxy_bind: str = "127.0.0.1"
    proxy_port: int = Field(default=8080, ge=1, le=65535)
    # The port users' URLs name (behind a load balancer, say 443); None: proxy_port.
    proxy_public_port: int | None = Field(default=None, ge=1, le=65535)
    # A wildcard certificate for ``*.{proxy_domain}``: URLs become https.
    proxy_tls_cert_file: Path | None = None
    proxy_tls_key_file: Path | None = None
    caddy_admin: str | None = None
    caddy_binary: str = "caddy"
    # Where Caddy reaches this API (open links, key checks); None: 127.0.0.1:port.
    proxy_api_upstream: str | None = None
    proxy_sync_interval_s: float = Field(default=5.0, gt=0)
    # An ``open`` link works once, within this time; the cookie it sets lasts longer.
    proxy_link_ttl_s: float = Field(default=300.0, gt=0)
    proxy_session_hours: float = Field(default=24.0, gt=0)

    # Snapshots (README "Snapshots"): a restic repository, ``<home>/snapshots`` when
    # None, or any restic repository string (``s3:https://host/bucket/prefix``; S3
    # credentials from the usual AWS_* environment variables). Its password is made
    # on first use in ``snapshot_password_file`` (``<home>/snapshot.password``, 0600).
    # Each account's snapshots go to ``<repository>/accounts/<id>``, whose password is
    # derived from that file (storage/account_repositories.py).
    snapshot_repository: str | None = None
    snapshot_password_file: Path | None = None
    # Storage prices per GB-month (billed per second through the ledger): snapshot
    # data as stored after de-duplication, and network volumes by their size.
    price_snapshot_gb_month: float = Field(default=0.05, ge=0)
    price_network_volume_gb_month: float = Field(default=0.07, ge=0)
    # How often each host's volumes are measured (the engine's disk-usage report) for
    # clusters' and network volumes' ``used_bytes`` (reconciler/duties/volume_usage.py).
    volume_usage_interval_s: float = Field(default=60.0, gt=0)

    # Auto-termination: a cluster is idle while its CPU and every GPU stay under these.
    idle_cpu_percent: float = 5.0
    idle_gpu_percent: float = 10.0
    idle_sample_interval_s: float = 15.0

    # Budget webhooks (services/tenancy/webhooks.py): targets on loopback, link-local, private
    # or other non-public addresses are refused unless allowed here (a webhook must
    # not be a way into the operator's network). Each attempt gives up after
    # ``webhook_timeout_s``; after ``webhook_max_attempts`` a delivery is failed.
    webhook_allow_private: bool = False
    webhook_timeout_s: float = Field(default=5.0, gt=0, le=60)
    webhook_max_attempts: int = Field(default=8, ge=1, le=50)

    # Training clusters: where their SSH ports listen, how long a node may take to
    # show up in Slurm, how long update_image waits for a drained node's jobs.
    training_bind_address: str = "0.0.0.0"
    training_ready_timeout_s: float = 180.0
    training_drain_timeout_s: float = 300.0
    # How long a node's lifecycle script may run before the operation goes on without it.
    training_lifecycle_timeout_s: float = 1800.0
    # Off: training clusters are recorded but no operator builds them (tests, hosts
    # without a node image).
    training_enabled: bool = True

    # SSH gateway (README "SSH into any cluster"; edge/ssh_gateway.py): a process of its
    # own that ``gpuyard serve`` starts unless ``ssh_enabled`` is false or ``ssh_port``
    # is 0. ``ssh_bind``: where it listens (None: ``host``); ``ssh_host``: the host name
    # connection strings name (None: ``public_address``, else the API's connectable
    # host). Each source address may fail ``ssh_auth_failures_per_minute`` logins, an
    # allowance that refills at that many a minute (a token bucket, as the API's failed
    # keys); a source that has spent it is refused (any key) until one failure's worth
    # has refilled; 0: no limit.
    ssh_enabled: bool = True
    ssh_port: int = Field(default=2222, ge=0, le=65535)
    ssh_bind: str | None = None
    ssh_host: str | None = None
    ssh_auth_failures_per_minute: int = Field(default=10, ge=0)
    # Public keys one connection may offer before it is dropped (OpenSSH's MaxAuthTries).
    ssh_max_auth_tries: int = Field(default=6, ge=1)
    ssh_login_timeout_s: float = Field(default=30.0, gt=0)

    # Rate limits (api/http/rate_limit.py; README "Rate limits"): token buckets per API key
    # and per source address (requests a second, burst), and failed API keys per
    # minute per source. 0 turns a limit off. Buckets are per replica: N replicas let
    # up to N times these through. ``trusted_proxies`` (IPs/CIDRs, comma-separated):
    # whose X-Forwarded-For names the source; empty: the peer address, always.
    # How long a GraphQL query's answer is kept for the next identical query of the
    # same key (api/fast/view_cache.py); any write of this process forgets it at once. Its
    # runtime stats are already up to GPUYARD_GRAPHQL_RUNTIME_STATS_TTL_S old.
    graphql_answer_max_age_s: float = Field(default=1.0, ge=0, le=60)
    # GraphQL (README "GraphQL"; api/graphql/settings.py): limits against abusive
    # documents and whether introspection is answered. The defaults admit graphql-core's
    # standard introspection query (depth 15) and every query RunPod's SDK and the seed
    # send, with room to spare. ``graphql_document_cache_size``: parsed and validated
    # documents kept, by query text (LRU). A container's runtime stats (``runtime {
    # container }``) are read from the engine at most once per
    # ``graphql_runtime_stats_ttl_s``, however many clients poll; a failed read is
    # retried after ``graphql_runtime_stats_error_ttl_s`` (at most the former).
    graphql_introspection: bool = True
    graphql_max_depth: int = Field(default=15, ge=1, le=100)
    graphql_max_aliases: int = Field(default=30, ge=0, le=10_000)
    graphql_max_tokens: int = Field(default=2_000, ge=10, le=1_000_000)
    graphql_max_batch: int = Field(default=10, ge=1, le=1_000)
    graphql_max_query_length: int = Field(default=32_768, ge=100, le=10_000_000)
    graphql_document_cache_size: int = Field(default=512, ge=0, le=100_000)
    graphql_runtime_stats_ttl_s: float = Field(default=3.0, ge=0, le=60)
    graphql_runtime_stats_error_ttl_s: float = Field(default=0.5, ge=0, le=60)
    # The most workers one serverless endpoint may ask for (its ``workers_max``).
    serverless_max_workers: int = Field(default=100, ge=1, le=10_000)
    rate_limit_per_key: float = Field(default=20.0, ge=0)
    rate_limit_key_burst: int = Field(default=100, ge=1)
    rate_limit_per_source: float = Field(default=50.0, ge=0)
    rate_limit_source_burst: int = Field(default=200, ge=1)
    rate_limit_auth_failures_per_minute: int = Field(default=10, ge=0)
    rate_limit_max_tracked: int = Field(default=50_000, ge=1)
    trusted_proxies: str = ""

    # Hostile-input limits and the metrics endpoint (README "Security"). A request body
    # larger than max_body_bytes is refused with 413 before it is read or parsed
    # (api/http/body_limit.py). /metrics answers an admin-scope API key or metrics_token
    # (Authorization: Bearer); metrics_public opens it to anyone who reaches the port.
    max_body_bytes: int = Field(default=256 * 1024, ge=1024, le=64 * 1024 * 1024)
    metrics_enabled: bool = True
    metrics_token: SecretStr | None = None
    metrics_public: bool = False

    # Serverless endpoints' queue (README "Serverless endpoints"). A worker that has not
    # pinged for serverless_worker_ping_timeout_s (counted from its start, with
    # serverless_worker_start_grace_s before its first ping) is replaced and its jobs
    # go back to the queue, at most serverless_job_max_retries times; a worker's
    # job-take waits up to serverless_job_take_wait_s for a job before answering 204;
    # a finished job's result is kept serverless_result_ttl_s.
    serverless_worker_ping_timeout_s: int = Field(default=30, ge=1, le=3600)
    serverless_worker_start_grace_s: int = Field(default=300, ge=1, le=86400)
    serverless_job_max_retries: int = Field(default=3, ge=0, le=100)
    serverless_job_take_wait_s: float = Field(default=20.0, ge=0, le=120)
    serverless_result_ttl_s: int = Field(default=1800, ge=1, le=7 * 86400)

    @field_validator("reserved_ips")
    @classmethod
    def _reserved_ips(cls, value: str | None) -> str | None:
        # A malformed pool fails at start-up, not on the first allocation.
        parse_pool(value)
        return value

    @field_validator("training_subnets")
    @classmethod
    def _training_subnets(cls, value: str | None) -> str | None:
        return None if value is None else check_pool(value)

    @field_validator("allowed_registries")
    @classmethod
    def _allowed_registries(cls, value: str) -> str:
        # A malformed entry fails at start-up, not on the first create.
        RegistryPolicy.parse(value)
        return value

    @property
    def registry_policy(self) -> RegistryPolicy:
        return RegistryPolicy.parse(self.allowed_registries)

    @property
    def effective_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.home / 'gpuyard.db'}"

    @property
    def ssh_gateway_endpoint(self) -> tuple[str, int] | None:
        """``(host, port)`` users reach the SSH gateway at; None when it is off."""
        if not self.ssh_enabled or self.ssh_port == 0:
            return None
        host = self.ssh_host or self.public_address or self.host
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        return host, self.ssh_port

    @property
    def credentials_path(self) -> Path:
        return self.home / "credentials"

    @property
    def secret_key_path(self) -> Path:
        return self.secret_key_file or self.home / "secret.key"

    @property
    def snapshot_repository_location(self) -> str:
        return self.snapshot_repository or str(self.home / "snapshots")

    @property
    def snapshot_password_path(self) -> Path:
        return self.snapshot_password_file or self.home / "snapshot.password"

    @property
    def unreachable_within_s(self) -> float:
        """The longest a host that stops answering stays reachable: its last answered
        heartbeat, then ``heartbeat_misses`` heartbeats (one per interval, or back to
        back when a miss outlasts the interval) that each wait ``heartbeat_timeout_s``."""
        every = max(self.heartbeat_interval_s, self.heartbeat_timeout_s)
        return self.heartbeat_misses * every + self.heartbeat_timeout_s

    @property
    def allocation_ratios(self) -> AllocationRatios:
        return AllocationRatios(
            vcpu=self.vcpu_allocation_ratio,
            memory=self.memory_allocation_ratio,
            disk=self.disk_allocation_ratio,
        )

    @property
    def prices(self) -> Prices:
        return Prices(
            vcpu_hour=self.price_vcpu_hour,
            memory_gb_hour=self.price_memory_gb_hour,
            container_disk_gb_month=self.price_container_disk_gb_month,
            volume_gb_month_running=self.price_volume_gb_month_running,
            volume_gb_month_stopped=self.price_volume_gb_month_stopped,
        )
