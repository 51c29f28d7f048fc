"""``GET /v1/host-images``: the image names on the hosts' engines, for the create form;
a tenant's key reads names and host counts only, never whose clusters use them."""

from __future__ import annotations

from gpuyard.testing.fake_runtime import FakeRuntime
from tests.helpers import LiveServer, account_with_members


def test_images_present_on_the_hosts_are_listed_by_name(
    srv: LiveServer, fake_runtime: FakeRuntime
) -> None:
    fake_runtime.images.update({"localhost/tools:1", "docker.io/library/ubuntu:24.04"})
    _, _, keys = account_with_members(srv, "tenant@example.com", ())
    with srv.client(keys["owner"]) as c:
        r = c.get("/v1/host-images")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["success"] is True
    names = [i["name"] for i in body["data"]["images"]]
    assert "localhost/tools:1" in names and "docker.io/library/ubuntu:24.04" in names
    assert names == sorted(names)  # one host: all held by one, so by name
    for item in body["data"]["images"]:
        assert set(item) == {"name", "hosts"} and item["hosts"] == 1
    assert body["data"]["hosts_unanswered"] == 0


def test_host_images_need_a_key(srv: LiveServer) -> None:
    with srv.client("gy_not_a_key") as c:
        assert c.get("/v1/host-images").status_code == 401
