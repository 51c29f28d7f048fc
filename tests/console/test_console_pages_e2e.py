"""The console's other pages in a real browser (Playwright driving Debian's chromium)
against ``gpuyard serve`` on real Podman containers and the real restic repository.

- Snapshots on a cluster's page: take one, see it listed and ready; stop the cluster
  and restore it (the start's answer names the snapshot); the clone form starts from
  the snapshot and makes a new cluster.
- The events panel shows the newest events of a long history, newest first.
- Training clusters: the list and the create form with the plans; a cluster made
  through the API shows its nodes on its page, and the page's delete works.
- The account page lists the members and makes an invitation whose token is shown
  once; the operator's hosts page shows this machine with capacity bars, and its
  cordon button cordons (uncordon after).
- On a phone-width screen every page fits the width (wide tables scroll in their own
  box), and the keyboard alone signs in and reaches the create form.

Every request the pages made is a public API route, as in test_console_e2e.py.
"""

from __future__ import annotations

import re
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.console import test_console_e2e as base
from tests.console.conftest import watch
from tests.e2e.conftest import DEV_IMAGE
from tests.e2e.test_server_e2e import ServerProcess, running_server, wait_status
from tests.required_parts import need_module, needs_tools

pytestmark = [pytest.mark.e2e, needs_tools("restic", how="apt-get install restic")]
sync_api = need_module("playwright.sync_api", how="pip install playwright (make venv)")

SLURM_IMAGE = "localhost/gpuyard/slurm-node:latest"
TRAINING = "/distributed_jobs_v2/cluster/"
# Synthetic history written under a cluster: more than two pages of the events list.
HISTORY = 130


@pytest.fixture(scope="module")
def server(engine_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    home = tmp_path_factory.mktemp("console-pages") / "home"
    with running_server(home, engine_url, {}) as srv:
        yield srv


@pytest.fixture(scope="module")
def browser(server: ServerProcess) -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(
            executable_path=str(base.CHROMIUM), args=base.CHROMIUM_ARGS, headless=True
        )
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def recorder(server: ServerProcess) -> Iterator[base.Recorder]:
    """Every request of every page of this module; checked once all have run."""
    rec = base.Recorder(server.url)
    yield rec
    templates = base.route_templates(server)
    strays = sorted(
        f"{method} {path}"
        for method, path in rec.calls
        if path != "/"
        and not path.startswith("/console/")
        and not any(m == method and p.match(path) for m, p, _ in templates)
    )
    assert not strays, f"the console called routes outside the public API: {strays}"


@pytest.fixture
def page(browser: Any, server: ServerProcess, recorder: base.Recorder) -> Iterator[Any]:
    p = base.new_page(browser, server, recorder)
    base.sign_in(p, server.key)
    yield p
    p.context.close()


def create_cluster(c: httpx.Client, **extra: Any) -> str:
    body = {"gpu_count": 0, "docker_image": DEV_IMAGE, "volume_gb": 1, "memory_gb": 1}
    r = c.post("/v1/clusters", json={**body, "cpu_cores": 1, **extra})
    assert r.status_code == 201, r.text
    cid: str = r.json()["data"]["id"]
    return cid


def terminate(c: httpx.Client, cid: str) -> None:
    c.delete(f"/v1/clusters/{cid}")


def test_snapshots_take_restore_and_clone(page: Any, server: ServerProcess) -> None:
    shots = base.artifacts_dir()
    with server.client() as c:
        cid = create_cluster(c)
    page.goto(f"{server.url}/#/clusters/{cid}")
    base.wait_status(page, "running")

    # Take one from the running cluster: listed at once, ready once read.
    page.fill("[data-testid=snapshot-name]", "before-upgrade")
    page.click("[data-testid=take-snapshot] button[type=submit]")
    row = page.locator("[data-testid=snapshots] tr[data-snapshot]")
    sync_api.expect(row).to_have_count(1)
    sync_api.expect(row).to_contain_text("before-upgrade")
    sync_api.expect(row.locator("[data-status=ready]")).to_have_count(1, timeout=180_000)
    sync_api.expect(row).to_contain_text("crash-consistent")
    snapshot_id = row.get_attribute("data-snapshot")
    assert snapshot_id
    restore = row.locator("[data-snapshot-action=restore]")
    assert restore.is_disabled()  # the cluster runs: restoring into it is refused
    page.screenshot(path=str(shots / "console-snapshots.png"), full_page=True)

    # Restore into the stopped cluster: the start's answer names the snapshot.
    page.click("[data-action=stop]")
    base.wait_status(page, "stopped")
    sync_api.expect(restore).to_be_enabled()
    restore.click()
    result = page.locator("[data-testid=start-result]")
    sync_api.expect(result).to_contain_text(f"restore_from_snapshot: {snapshot_id}")
    base.wait_status(page, "running", timeout=180_000)

    # Clone: the form names the snapshot and starts from the source's shape.
    page.click(f"tr[data-snapshot='{snapshot_id}'] [data-snapshot-action=clone]")
    sync_api.expect(page.locator("[data-testid=clone-of]")).to_contain_text(snapshot_id)
    assert page.input_value("#f-docker_image") == DEV_IMAGE
    assert page.input_value("#f-volume_gb") == "1"
    page.click("[data-testid=create-submit]")
    page.wait_for_url(re.compile(r"#/clusters/(?!new)[a-z0-9]+$"))
    clone_id = page.url.rsplit("/", 1)[1]
    assert clone_id != cid
    with server.client() as c:
        snaps = c.get("/v1/snapshots", params={"cluster_id": cid}).json()["data"]["snapshots"]
        assert [s["id"] for s in snaps if s["name"] == "before-upgrade"] == [snapshot_id]
        terminate(c, clone_id)
        terminate(c, cid)


def add_history(server: ServerProcess, cid: str, count: int) -> None:
    """``count`` events under cluster ``cid``, written straight into the server's
    database (a real history this long takes hundreds of stops and starts)."""
    start = datetime.now(UTC).replace(tzinfo=None) - timedelta(hours=1)
    rows = [
        (cid, (start + timedelta(seconds=i)).isoformat(sep=" "), "note", f"synthetic {i}")
        for i in range(count)
    ]
    db = sqlite3.connect(server.db_path, timeout=30)
    try:
        with db:
            db.executemany(
                "INSERT INTO events (cluster_id, created_at, type, message) VALUES (?, ?, ?, ?)",
                rows,
            )
    finally:
        db.close()


def settled_event_total(c: httpx.Client, cid: str, quiet_s: float = 1.5) -> int:
    """The count of cluster ``cid``'s events once it has not grown for ``quiet_s``."""
    deadline = time.monotonic() + 60
    total, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        now_total = c.get(f"/v1/clusters/{cid}/events").json()["data"]["pagination"]["total"]
        if now_total != total:
            total, since = now_total, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return int(total)
        time.sleep(0.2)
    raise AssertionError(f"cluster {cid} kept writing events")


def test_events_panel_shows_the_newest(page: Any, server: ServerProcess) -> None:
    with server.client() as c:
        cid = create_cluster(c)
        # The synthetic history goes in once the cluster has settled: an event of its
        # start written after it would lead the list.
        wait_status(c, cid, {"running"})
        base_total = settled_event_total(c, cid)
    add_history(server, cid, HISTORY)
    page.goto(f"{server.url}/#/clusters/{cid}")
    events = page.locator("[data-testid=events] li")
    sync_api.expect(events).to_have_count(50)
    # Newest first: the last synthetic event leads, the 50th newest closes the list.
    sync_api.expect(events.first).to_contain_text(f"synthetic {HISTORY - 1}")
    sync_api.expect(events.last).to_contain_text(f"synthetic {HISTORY - 50}")
    assert base_total + HISTORY > 100  # the list is read from past its second page

    # A new event shows on the next poll (the kept cursor reads only what is new).
    with server.client() as c:
        assert c.post(f"/v1/clusters/{cid}/stop").status_code == 200
    base.wait_status(page, "stopped")
    sync_api.expect(events.first).not_to_contain_text(f"synthetic {HISTORY - 1}")
    sync_api.expect(events).to_have_count(50)
    with server.client() as c:
        terminate(c, cid)


def test_training_pages(page: Any, server: ServerProcess, tmp_path: Path) -> None:
    shots = base.artifacts_dir()
    with server.client() as c:
        project = next(p for p in c.get("/v1/projects").json()["data"]["projects"])
        plans = c.get("/v1/plans").json()["data"]["plans"]
        images = c.get("/v1/images").json()["data"]["images"]
    assert plans, "the local host's GPUs make plans"
    pub = ssh_public_key(tmp_path)
    with server.client() as c:
        key = c.post("/v1/ssh-keys", json={"name": "console", "public_key": pub}).json()["data"]

    page.click("nav a[href='#/training']")
    page.wait_for_selector("[data-testid=training-table]")
    page.click("[data-testid=new-training]")
    options = page.locator("[data-testid=training-plans] option")
    sync_api.expect(options).to_have_count(len(plans))
    assert plans[0]["name"] in options.first.inner_text()
    page.select_option("#t-sku_id", str(plans[0]["sku_id"]))
    page.fill("#t-no_of_nodes", "2")
    estimate = page.inner_text("[data-testid=training-estimate]")
    assert f"${2 * plans[0]['price_per_hour']:.2f}/h" in estimate, estimate
    # The API's error lands on the field it names (an invalid name).
    page.fill("#t-name", "Not A Name")
    page.click("[data-testid=training-submit]")
    error = page.wait_for_selector(".field-error")
    assert error.inner_text()
    # The form offers auto-termination, and a refused value is shown at its input.
    page.fill("#t-name", "console-autoterm")
    page.fill("[data-field='auto_terminate.idle_minutes']", "0")
    page.click("[data-testid=training-submit]")
    page.wait_for_selector("[data-field='auto_terminate.idle_minutes'][aria-invalid=true]")
    sync_api.expect(page.locator("[data-testid=training-autoterm-inputs]")).to_contain_text(
        "greater than 0"
    )
    page.screenshot(path=str(shots / "console-training-create.png"), full_page=True)

    slurm = [i for i in images if i["image"] == SLURM_IMAGE]
    assert slurm, f"the first start registers the Slurm node image: {images}"
    params = {"project_id": project["id"], "location": "local"}
    with server.client() as c:
        created = c.post(
            TRAINING,
            params=params,
            json={
                "name": "console-e2e",
                "image_version_id": slurm[0]["id"],
                "ssh_key_ids": [key["id"]],
                "no_of_nodes": 1,
                "sku_id": None,
                "gpu_type": "NVIDIA RTX A6000",
                "gpus_per_node": 1,
                "cpus_per_node": 1,
                "memory_gb_per_node": 1,
                "auto_terminate": {"max_runtime_hours": 1},
            },
        )
        assert created.status_code == 201, created.text
        tid = created.json()["data"]["id"]

    page.goto(f"{server.url}/#/training?project_id={project['id']}&location=local")
    page.click(f"tr[data-training='{tid}'] a")
    nodes = page.locator("[data-testid=training-nodes] tr[data-node]")
    sync_api.expect(nodes).to_have_count(2)
    sync_api.expect(page.locator("[data-testid=training-nodes]")).to_contain_text("controller")
    sync_api.expect(page.locator("[data-testid=training-nodes]")).to_contain_text("worker")
    sync_api.expect(page.locator("[data-testid=training-autoterm]")).to_contain_text(
        "Auto-terminate: runtime 1 h → stop"
    )
    sync_api.expect(page.locator("[data-testid=sinfo]")).to_contain_text("gpu")
    page.screenshot(path=str(shots / "console-training-detail.png"), full_page=True)
    page.click("[data-training-action=delete]")

    def deleted() -> bool:
        with server.client() as c:
            status = c.get(f"{TRAINING}{tid}/", params=params)
        return status.status_code == 404 or status.json()["data"]["status"] in {
            "deleting",
            "deleted",
        }

    # The page's DELETE (after its confirmation) is on its way: wait for it to land.
    deadline = time.monotonic() + 30
    while not deleted():
        assert time.monotonic() < deadline, "the page's delete never reached the API"
        time.sleep(0.2)


def ssh_public_key(tmp_path: Path) -> str:
    path = tmp_path / "console"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "console", "-f", str(path)],
        check=True,
    )
    return (tmp_path / "console.pub").read_text().strip()


def test_account_page_members_and_invitation(page: Any, server: ServerProcess) -> None:
    shots = base.artifacts_dir()
    with server.client() as c:
        me = c.get("/v1/me").json()["data"]
    page.click("nav a[href='#/account']")
    members = page.locator("[data-testid=members] tr[data-member]")
    sync_api.expect(members).to_have_count(1)
    sync_api.expect(members.first).to_contain_text(me["user"]["email"])
    sync_api.expect(page.locator("[data-testid=quotas]")).to_contain_text("Running clusters")

    page.fill("#inv-email", "new.person@example.com")
    page.select_option("#inv-role", "viewer")
    page.click("[data-testid=invite] button[type=submit]")
    token = page.locator("[data-testid=invitation-token] code").inner_text()
    assert len(token) >= 20
    sync_api.expect(page.locator("tr[data-invitation='new.person@example.com']")).to_contain_text(
        "pending"
    )
    page.screenshot(path=str(shots / "console-account.png"), full_page=True)
    # The token is shown once: the list and a fresh page do not hold it.
    with server.client() as c:
        account = me["acting"]["account_id"]
        listed = c.get(f"/v1/accounts/{account}/invitations").text
    assert token not in listed
    base.open_app(page)  # reloaded
    page.wait_for_selector("tr[data-invitation='new.person@example.com']")
    assert token not in page.content()

    # The audit events, filtered by the API's own filters.
    with server.client() as c:  # another kind of event to filter out
        assert c.post("/v1/api-keys", json={"name": "audit-probe"}).status_code == 201
    filters = page.locator("[data-testid=audit-filters]")
    audit = page.locator("[data-testid=audit] tr[data-audit]")
    filters.get_by_label("Action").fill("invitation.*")
    filters.locator("button[type=submit]").click()
    sync_api.expect(audit).to_have_count(1)
    assert audit.first.get_attribute("data-audit") == "invitation.create"
    filters.get_by_label("Action").fill("key.create")
    filters.get_by_label("Who").fill(me["user"]["email"])
    filters.locator("button[type=submit]").click()
    keys_made = page.locator("[data-testid=audit] tr[data-audit='key.create']")
    sync_api.expect(keys_made).not_to_have_count(0)
    sync_api.expect(audit).to_have_count(keys_made.count())
    filters.get_by_label("Who").fill("nobody@example.com")
    filters.locator("button[type=submit]").click()
    sync_api.expect(audit).to_have_count(0)


def test_operator_hosts_page_cordons(page: Any, server: ServerProcess) -> None:
    shots = base.artifacts_dir()
    page.click("nav a[href='#/hosts']")
    host = page.locator("[data-testid=hosts] .host").first
    sync_api.expect(host.locator("[data-host-status]")).to_have_text("active")
    for bar in ("GPUs", "vCPU", "Memory", "Disk"):
        sync_api.expect(host.locator(f"[data-capacity={bar}] meter")).to_have_count(1)
    assert "this machine" in host.inner_text()
    page.screenshot(path=str(shots / "console-hosts.png"), full_page=True)
    name = host.get_attribute("data-host")

    host.locator("[data-host-action=cordon]").click()
    sync_api.expect(host.locator("[data-host-status]")).to_have_text("cordoned")
    with server.client() as c:
        hosts = c.get("/v1/hosts").json()["data"]["hosts"]
        assert next(h for h in hosts if h["name"] == name)["status"] == "cordoned"
    host.locator("[data-host-action=uncordon]").click()
    sync_api.expect(host.locator("[data-host-status]")).to_have_text("active")
    with server.client() as c:
        hosts = c.get("/v1/hosts").json()["data"]["hosts"]
        assert next(h for h in hosts if h["name"] == name)["status"] == "active"


def test_a_read_key_sees_no_changes_on_the_new_pages(
    browser: Any, server: ServerProcess, recorder: base.Recorder
) -> None:
    with server.client() as c:
        cid = create_cluster(c)
    viewer = base.new_page(browser, server, recorder)
    base.sign_in(viewer, base.read_key(server))
    # The operator's pages are not offered to a read key (its scope is not admin).
    assert viewer.locator("nav a[href='#/hosts']").is_hidden()
    assert viewer.locator("nav a[href='#/accounts']").is_hidden()
    viewer.goto(f"{server.url}/#/clusters/{cid}")
    viewer.wait_for_selector("[data-testid=snapshots]")
    assert viewer.locator("[data-testid=take-snapshot]").count() == 0
    viewer.goto(f"{server.url}/#/account")
    viewer.wait_for_selector("[data-testid=members] tr[data-member]")
    assert viewer.locator("[data-testid=invite]").count() == 0
    assert viewer.locator("[data-member-role]").count() == 0
    viewer.goto(f"{server.url}/#/training")
    viewer.wait_for_selector("[data-testid=training-table]")
    assert viewer.locator("[data-testid=new-training]").count() == 0
    viewer.context.close()
    with server.client() as c:
        terminate(c, cid)


# Each page, and what shows it has rendered its data.
PHONE_PAGES = {
    "#/clusters": "[data-testid=cluster-table]",
    "#/clusters/new": "[data-testid=create-submit]",
    "#/training": "[data-testid=training-table]",
    "#/keys": "main table.list tbody tr",
    "#/billing": "main p.total:not(:empty)",
    "#/account": "[data-testid=members] tr[data-member]",
    "#/hosts": "[data-testid=hosts]",
    "#/accounts": "[data-testid=accounts]",
}


def tab_to(page: Any, selector: str, most: int = 60) -> None:
    """Press Tab until the focused element matches ``selector``."""
    for _ in range(most):
        page.keyboard.press("Tab")
        if page.evaluate("(s) => document.activeElement.matches(s)", selector):
            return
    raise AssertionError(f"Tab never reached {selector}")


def overflow_px(page: Any) -> int:
    """How far the page is wider than the screen (0: it fits)."""
    wider: int = page.evaluate(
        "document.documentElement.scrollWidth - document.documentElement.clientWidth"
    )
    return wider


def test_phone_width_and_keyboard_only(
    browser: Any, server: ServerProcess, recorder: base.Recorder
) -> None:
    with server.client() as c:
        cid = create_cluster(c)
    context = browser.new_context(viewport={"width": 375, "height": 740})
    phone = context.new_page()
    phone.set_default_timeout(30_000)
    recorder.attach(phone)
    watch(phone)
    base.open_app(phone, server.url + "/")
    phone.wait_for_selector("#api-key")

    # Signed in with the keyboard alone.
    tab_to(phone, "#api-key")
    phone.keyboard.type(server.key)
    phone.keyboard.press("Enter")
    phone.wait_for_selector("[data-testid=cluster-table]")

    pages = {**PHONE_PAGES, f"#/clusters/{cid}": "[data-testid=events]"}
    for route, ready in pages.items():
        phone.goto(f"{server.url}/{route}")
        phone.wait_for_selector(ready)
        assert overflow_px(phone) <= 1, f"{route} is wider than a phone: {overflow_px(phone)} px"

    # The create form is reached and its fields are reached with the keyboard.
    phone.goto(f"{server.url}/#/clusters")
    phone.wait_for_selector("[data-testid=cluster-table]")
    tab_to(phone, "[data-testid=new-cluster]")
    phone.keyboard.press("Enter")
    phone.wait_for_selector("#f-docker_image")
    tab_to(phone, "#f-docker_image")
    context.close()
    with server.client() as c:
        terminate(c, cid)


def in_viewport(page: Any, selector: str) -> bool:
    box = page.locator(selector).bounding_box()
    height = page.viewport_size["height"]
    return box is not None and box["y"] >= 0 and box["y"] + box["height"] <= height


def test_errors_show_beside_what_caused_them(page: Any, server: ServerProcess) -> None:
    page.goto(server.url + "/#/clusters/new")
    page.wait_for_selector("[data-testid=create-submit]")
    # The image field offers the images already on the hosts (the engine's real list).
    assert page.locator(f"#host-images option[value='{DEV_IMAGE}']").count() == 1
    # Validation: each refused field gets a line beside it, in words.
    page.fill("#f-docker_image", "")
    page.fill("#f-cpu_cores", "0")
    page.click("[data-testid=create-submit]")
    image_error = page.locator("label:has(#f-docker_image) .field-error")
    sync_api.expect(image_error).to_have_text("Image: required")
    cpu_error = page.locator("label:has(#f-cpu_cores) .field-error")
    sync_api.expect(cpu_error).to_have_text("vCPU: at least 1")
    # A refusal for capacity is about no field: it is shown at the Create button, in view.
    page.fill("#f-docker_image", DEV_IMAGE)
    page.fill("#f-cpu_cores", "1")
    page.fill("#f-memory_gb", "16000")
    page.select_option("#f-gpu_type", "")
    page.click("[data-testid=create-submit]")
    note = page.locator("[data-testid=form-error]")
    sync_api.expect(note).to_be_visible()
    assert "memory" in note.inner_text().lower() or "capacity" in note.inner_text().lower()
    assert page.locator("label:has(#f-docker_image) .field-error").count() == 0
    assert in_viewport(page, "[data-testid=form-error]")
    assert in_viewport(page, "[data-testid=create-submit]")
    page.screenshot(path=str(base.artifacts_dir() / "create-capacity-error.png"))


def test_deep_link_survives_sign_in(browser: Any, server: ServerProcess, recorder: Any) -> None:
    p = base.new_page(browser, server, recorder)
    base.open_app(p, server.url + "/#/keys")
    p.wait_for_selector("#api-key")
    p.fill("#api-key", server.key)
    p.click("form button[type=submit]")
    p.wait_for_selector("[data-testid=key-in-use]")
    assert p.url.endswith("#/keys")
    p.context.close()


def test_revoking_the_key_in_use_asks_first_then_signs_out(
    browser: Any, server: ServerProcess, recorder: Any
) -> None:
    with server.client() as c:
        r = c.post("/v1/api-keys", json={"name": "doomed", "scope": "write"})
        assert r.status_code == 201, r.text
        key = r.json()["data"]["key"]
    # A page of its own (base.new_page accepts every confirmation): the first is refused.
    p = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    asked: list[str] = []

    def answer(d: Any) -> None:
        asked.append(d.message)
        if len(asked) == 1:
            d.dismiss()
        else:
            d.accept()

    p.on("dialog", answer)
    recorder.attach(p)
    watch(p)
    base.open_app(p, server.url + "/#/keys")
    p.fill("#api-key", key)
    p.click("form button[type=submit]")
    row = p.locator("tr:has([data-testid=key-in-use])")
    sync_api.expect(row).to_contain_text("doomed")
    row.get_by_role("button", name="Revoke this key").click()
    p.wait_for_timeout(300)
    assert asked and "signed in with it" in asked[0]
    assert p.locator("[data-testid=key-in-use]").count() == 1  # refused: still there
    row.get_by_role("button", name="Revoke this key").click()
    p.wait_for_selector("#api-key")
    assert p.url.endswith("#/signin")
    p.context.close()


def test_detail_shows_env_masked_and_ports_with_addresses(page: Any, server: ServerProcess) -> None:
    with server.client() as c:
        cid = create_cluster(
            c,
            env={"HF_TOKEN": "hunter2-secret", "MODE": "train"},
            ports=[{"internal_port": 8080, "protocol": "http", "visibility": "public"}],
        )
        wait_status(c, cid, {"running"})
    try:
        page.goto(f"{server.url}/#/clusters/{cid}")
        env = page.locator("[data-testid=env]")
        sync_api.expect(env).to_contain_text("MODE = train")
        sync_api.expect(env).to_contain_text("HF_TOKEN = •••••••• (secret)")
        assert "hunter2" not in page.content()
        port = page.locator("[data-testid=ports] [data-port-row='8080']")
        sync_api.expect(port).to_contain_text("8080/http · public · http")
        # Utilisation charts: CPU drawn from the samples (taken every 30 s, the page
        # rereads them as often), GPU says there is no data on a CPU-only cluster.
        cpu_line = page.locator("[data-chart=CPU] svg polyline")
        sync_api.expect(cpu_line).to_have_count(1, timeout=70_000)
        sync_api.expect(page.locator("[data-chart=GPU] figcaption")).to_have_text(
            "GPU: no GPU data"
        )
        page.screenshot(path=str(base.artifacts_dir() / "detail-env-ports.png"), full_page=True)
    finally:
        with server.client() as c:
            terminate(c, cid)
