"""``/guide``: the built MkDocs site served by gpuyard, readable offline; a short
'run make docs' page when it is not built."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx
from fastapi import FastAPI
from fastapi.testclient import TestClient

from gpuyard.api.console import guide_page
from gpuyard.core.tls_trust import trusted_tls
from tests.helpers import LiveServer

ROOT = Path(__file__).resolve().parents[2]


def _built_site(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(site)],
        cwd=ROOT,
        check=True,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
    )
    return site


def test_guide_serves_the_built_site_with_offline_assets(tmp_path: Path) -> None:
    app = FastAPI()
    guide_page.install(app, _built_site(tmp_path))
    client = TestClient(app)
    assert client.get("/guide", follow_redirects=False).headers["location"] == "/guide/"
    for page in ("/guide/", "/guide/user/clusters/", "/guide/operator/configuration/"):
        r = client.get(page)
        assert r.status_code == 200 and "gpuyard" in r.text, page
        # Everything the page loads comes from gpuyard: no outside fonts, scripts, styles.
        loaded = re.findall(r'<(?:script|link|img)[^>]*(?:src|href)="([^"]+)"', r.text)
        assert loaded and not [u for u in loaded if re.match(r"(https?:)?//", u)], loaded
        assert "fonts.googleapis" not in r.text
    css = re.findall(r'href="([^"]+\.css)"', client.get("/guide/").text)
    assert css and client.get("/guide/" + css[0].lstrip("./")).status_code == 200


def test_guide_not_built_says_how_to_build_it(srv: LiveServer, tmp_path: Path) -> None:
    app = FastAPI()
    guide_page.install(app, tmp_path / "missing")
    r = TestClient(app).get("/guide/user/clusters/")
    assert r.status_code == 404 and "make docs" in r.text
    # The real server answers /guide either way, never a bare 404.
    assert httpx.get(srv.url + "/guide/", verify=trusted_tls()).status_code in (200, 404)
