"""HTTP proxy overhead: 1 MiB GETs through gpuyard's Caddy vs straight to the port.

One container of the offline web image (``gpuyard dev-image --web``) publishes port
8888 on loopback. A Caddy started the way gpuyard starts it (edge/caddy.py) is loaded
with the configuration gpuyard generates (edge/caddy_config.py), which names no
cluster: each request's port is looked up in gpuyard's resolver (edge/proxy_resolver.py,
its own process, started as gpuyard starts it) and its visibility in the route table's
marker files; the table holds that port twice, once as a public port and once as a
private port opened by a session cookie (the browser's path). The private port's every request is checked by the real API (the gpuyard app on
its fake runtime, bench/_gpuyard_fake_server.py, with a cluster and a session made
for it), as in production. ``wrk`` then fetches ``/bytes/1048576`` with 32 keep-alive
connections from:

- direct: ``127.0.0.1:<published port>``;
- bare Caddy: a second Caddy of the same binary whose whole configuration is one
  ``reverse_proxy`` to the published port (no matcher, lookup or header rule): what
  any Caddy in the path costs on this machine, so the rows below it show how much
  of the gap is gpuyard's configuration;
- proxy (public), proxy (private, cookie): Caddy, with the cluster's proxy host name.

Rounds alternate the order. Printed: requests/s, MiB/s, p50/p99 latency, the ratio
proxy/direct (goal >= 0.8x) and the p50 overhead (goal <= 1 ms), and the same p50 at
one connection (latency without queueing). Everything made here is removed at the end.

    .venv/bin/python bench/bench_proxy.py [--rounds 3] [--duration 8] [--connections 32]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import cpu_seconds, free_port, stop_process, wait_http_ok

from gpuyard.core.network.proxy import SESSION_COOKIE, ProxyBase, ProxyRoute, Visibility
from gpuyard.devtools.web_image import WEB_IMAGE, build_web_image
from gpuyard.edge.caddy import CaddyAdmin, CaddyProcess
from gpuyard.edge.caddy_config import ProxyListen, caddy_config
from gpuyard.edge.proxy_resolver import ResolverProcess
from gpuyard.edge.route_table import publish, table_routes
from gpuyard.services.installation.bootstrap import open_store
from gpuyard.services.tenancy.auth import hash_key
from gpuyard.settings import Settings
from gpuyard.store.schema import ApiKey, ProxySession

PUBLIC_ID = "benchpublic000"
SECRET = "bench-cookie-secret"
PATH = "/bytes/1048576"

_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1000.0}


def wrk(url: str, connections: int, duration: int, headers: dict[str, str]) -> dict[str, float]:
    """requests/s, MiB/s and latency percentiles (ms) of one wrk run."""
    args = ["wrk", "-t", "2" if connections > 1 else "1", "-c", str(connections),
            "-d", f"{duration}s", "--latency"]  # fmt: skip
    for name, value in headers.items():
        args += ["-H", f"{name}: {value}"]
    out = subprocess.run([*args, url], capture_output=True, text=True, check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    lat = {}
    for pct in ("50", "99"):
        m = re.search(rf"^\s+{pct}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        assert m, out
        lat[pct] = float(m.group(1)) * _UNITS[m.group(2)]
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if errors:
        raise RuntimeError(f"{url}: {errors.group(1)} failed responses\n{out}")
    return {"rps": rps, "mib_s": rps, "p50": lat["50"], "p99": lat["99"]}


def bare_caddy_config(admin: str, port: int, upstream: str) -> dict[str, object]:
    """One server on loopback ``port`` proxying everything to ``upstream``."""
    route = {"handle": [{"handler": "reverse_proxy", "upstreams": [{"dial": upstream}]}]}
    server = {"listen": [f"127.0.0.1:{port}"], "routes": [route],
              "automatic_https": {"disable": True}}  # fmt: skip
    return {
        "admin": {"listen": admin, "config": {"persist": False}},
        "apps": {"http": {"servers": {"bare": server}}},
    }


def start_api(home: Path, port: int, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """The gpuyard API on its fake runtime (the proxy's checks go to it), with one
    cluster declaring a private http port 8888 and a live session of the admin's key
    whose cookie is SECRET. Returns the process and the cluster's id."""
    home.mkdir(parents=True)
    launcher = Path(__file__).resolve().parent / "_gpuyard_fake_server.py"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, str(launcher), "--home", str(home), "--port", str(port)],
            env={**os.environ, "GPUYARD_HOME": str(home)},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    wait_http_ok(base + "/healthz", proc, log)
    key = json.loads((home / "credentials").read_text())["api_key"]
    created = httpx.post(
        base + "/v1/clusters",
        headers={"Authorization": f"Bearer {key}"},
        json={"docker_image": "img", "gpu_type": "NVIDIA RTX A6000",
              "ports": [{"internal_port": 8888, "protocol": "http"}]},
        timeout=30,
    )  # fmt: skip
    created.raise_for_status()
    cluster_id: str = created.json()["data"]["id"]
    # The session an open link would have become (links need a serving proxy).
    engine, sessions = open_store(Settings(home=home))
    try:
        with sessions.begin() as session:
            row = session.query(ApiKey).filter(ApiKey.key_hash == hash_key(key)).one()
            now = datetime.now(UTC)
            session.add(
                ProxySession(
                    token_hash=hashlib.sha256(b"bench-link").hexdigest(),
                    cluster_id=cluster_id, internal_port=8888, account_id=row.account_id,
                    key_name=row.name, created_at=now, link_expires_at=now, used_at=now,
                    expires_at=now + timedelta(hours=1),
                    cookie_hash=hashlib.sha256(SECRET.encode()).hexdigest(),
                    api_key_id=row.id, user_id=row.user_id,
                )
            )  # fmt: skip
    finally:
        engine.dispose()
    return proc, cluster_id


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=int, default=8)
    parser.add_argument("--connections", type=int, default=32)
    args = parser.parse_args()
    for tool in ("wrk", "caddy", "podman"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} is not installed (apt-get install {tool})")
    build_web_image("podman")
    work = Path(tempfile.mkdtemp(prefix="gy-bench-proxy-"))
    container = f"gy-bench-proxy-{int(time.time())}"
    published = free_port()
    subprocess.run(
        ["podman", "run", "-d", "--rm", "--name", container, "--label", "gpuyard.bench=proxy",
         "-p", f"127.0.0.1:{published}:8888", WEB_IMAGE],
        check=True, capture_output=True,
    )  # fmt: skip
    caddy = CaddyProcess(work / "caddy")
    admin = CaddyAdmin(caddy.admin_address)
    bare = CaddyProcess(work / "caddy-bare")
    bare_admin = CaddyAdmin(bare.admin_address)
    resolver = ResolverProcess(work / "caddy")
    api: subprocess.Popen[bytes] | None = None
    try:
        api_port, home = free_port(), work / "home"
        api, private_id = start_api(home, api_port, work / "api.log")
        caddy.ensure(admin)
        port = free_port()
        base = ProxyBase("http", "proxy.localhost", port)
        upstream = f"127.0.0.1:{published}"
        routes = [
            ProxyRoute(PUBLIC_ID, 8888, Visibility.PUBLIC, upstream),
            ProxyRoute(private_id, 8888, Visibility.PRIVATE, upstream),
        ]
        publish(resolver.table, resolver.markers, table_routes(routes))
        listen = ProxyListen(
            "127.0.0.1", port, f"127.0.0.1:{api_port}", caddy.admin_address,
            resolver=f"127.0.0.1:{resolver.ensure()}", markers=str(resolver.markers),
        )  # fmt: skip
        admin.load(caddy_config(base, listen))
        bare.ensure(bare_admin)
        bare_port = free_port()
        bare_admin.load(bare_caddy_config(bare.admin_address, bare_port, upstream))
        direct = f"http://127.0.0.1:{published}{PATH}"
        proxied = f"http://127.0.0.1:{port}{PATH}"
        targets = {
            "direct": (direct, {}),
            "bare Caddy": (f"http://127.0.0.1:{bare_port}{PATH}", {}),
            "proxy public": (proxied, {"Host": base.host(PUBLIC_ID, 8888)}),
            "proxy private (cookie)": (
                proxied,
                {"Host": base.host(private_id, 8888), "Cookie": f"{SESSION_COOKIE}={SECRET}"},
            ),
        }
        deadline = time.monotonic() + 15
        while True:  # the container answers, through the proxy too
            try:
                for url, headers in targets.values():
                    r = httpx.get(url, headers=headers, timeout=5)
                    assert r.status_code == 200 and len(r.content) == 1 << 20, r.status_code
                break
            except (httpx.HTTPError, AssertionError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        caddy_pid, bare_pid = caddy.pid(), bare.pid()
        assert caddy_pid is not None and bare_pid is not None
        pids = {name: caddy_pid for name in targets} | {"bare Caddy": bare_pid}
        caddy_cpu: dict[str, float] = {name: 0.0 for name in targets}
        served: dict[str, float] = {name: 0.0 for name in targets}
        results: dict[str, list[dict[str, float]]] = {name: [] for name in targets}
        single: dict[str, list[float]] = {name: [] for name in targets}
        names = list(targets)
        for rnd in range(args.rounds):
            order = names if rnd % 2 == 0 else list(reversed(names))
            for name in order:
                url, headers = targets[name]
                wrk(url, args.connections, 2, headers)  # warm-up
                before = cpu_seconds(pids[name])
                run = wrk(url, args.connections, args.duration, headers)
                caddy_cpu[name] += cpu_seconds(pids[name]) - before
                served[name] += run["rps"] * args.duration / 1024  # GiB
                results[name].append(run)
                single[name].append(wrk(url, 1, 3, headers)["p50"])
        best = {n: max(results[n], key=lambda r: r["rps"]) for n in names}
        print(f"1 MiB GETs, {args.connections} connections, {args.rounds} rounds of "
              f"{args.duration} s (best round shown)")  # fmt: skip
        print(f"{'target':26} {'req/s':>9} {'MiB/s':>9} {'p50 ms':>8} {'p99 ms':>8} "
              f"{'p50@1conn':>10} {'ratio':>7} {'p50 over':>9}")  # fmt: skip
        d = best["direct"]
        d1 = min(single["direct"])
        for name in names:
            row = best[name]
            s1 = min(single[name])
            print(f"{name:26} {row['rps']:9.0f} {row['mib_s']:9.0f} {row['p50']:8.2f} "
                  f"{row['p99']:8.2f} {s1:10.3f} {row['rps'] / d['rps']:6.2f}x "
                  f"{s1 - d1:8.3f}")  # fmt: skip
        for name in names[1:]:
            per_gib = caddy_cpu[name] / served[name] if served[name] else 0.0
            print(f"Caddy CPU per GiB through '{name}': {per_gib:.2f} s "
                  f"(one core's ceiling ~ {1024 / per_gib if per_gib else 0:.0f} MiB/s)")  # fmt: skip
        print("goal: ratio >= 0.80x, p50 overhead (one connection) <= 1 ms")
    finally:
        stop_process(api)
        caddy.stop()
        bare.stop()
        resolver.stop()
        admin.close()
        bare_admin.close()
        subprocess.run(["podman", "rm", "-f", container], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
