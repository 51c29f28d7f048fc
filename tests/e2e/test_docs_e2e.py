"""Every command in README.md and the guide runs as written.

Each ```sh / ```bash / ```console / ```python block of README.md and of every guide page
(in the order mkdocs.yml lists them) is run, in order per page, in one bash script per
page with ``set -euo pipefail`` (so a variable a block sets is there in the next), from
the checkout's root, against a real ``gpuyard serve`` started from a fresh GPUYARD_HOME
with the settings the README tells a user of a machine without GPUs to declare. The
server's port reaches the blocks as GPUYARD_PORT (``gpuyard env`` turns it into
GPUYARD_URL); the text of the docs is never rewritten.

A block that cannot run here says why: ``{skip="reason"}`` on its fence line, or a
``<!-- docs-test: skip (reason) -->`` comment on the line before it. The test prints how
many blocks ran and how many were skipped, with the reasons.
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.test_server_e2e import running_server
from tests.required_parts import need_tools

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "guide"

# What the README's tour tells a user without GPUs to export before `make run`.
DOCS_ENV = {
    "GPUYARD_LOCAL_GPUS": "NVIDIA RTX A6000:4",
    "GPUYARD_LOCAL_VCPUS": "32",
    "GPUYARD_LOCAL_MEMORY_GB": "128",
    "GPUYARD_ALLOW_UNENFORCED_DISK": "true",
}

FENCE = re.compile(r"^```(sh|bash|console|python)\b\s*(?:\{skip=\"([^\"]+)\"\})?\s*$")
COMMENT = re.compile(r"^<!--\s*docs-test:\s*skip\s*\((.+)\)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    lang: str
    text: str
    skip: str | None


def blocks_of(path: Path) -> list[Block]:
    """The page's runnable blocks, with the skip reason each carries (or None)."""
    lines = path.read_text().splitlines()
    page = str(path.relative_to(ROOT))
    found: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if lines[i].startswith("```") and not m:
            # Another language's block: skip to its end, its body is not ours to read.
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                i += 1
            i += 1
            continue
        if m is None:
            i += 1
            continue
        prev = lines[i - 1] if i else ""
        comment = COMMENT.match(prev)
        skip = m.group(2) or (comment.group(1) if comment else None)
        start, body = i + 1, []
        i += 1
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        i += 1
        text = "\n".join(body)
        if m.group(1) == "console":
            text = "\n".join(ln[2:] for ln in body if ln.startswith("$ "))
        found.append(Block(page, start, m.group(1), text, skip))
    return found


def pages() -> list[Path]:
    """README.md, then the guide's pages in the order of mkdocs.yml's nav."""
    nav = re.findall(r":\s*([\w/.-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M)
    listed = [GUIDE / n for n in nav]
    assert all(p.is_file() for p in listed), listed
    unlisted = sorted(set(GUIDE.rglob("*.md")) - set(listed))
    return [ROOT / "README.md", *listed, *unlisted]


def script_of(blocks: list[Block]) -> str:
    """One bash script for a page: a marker line before each block, python blocks run
    by the checkout's interpreter from a quoted here-document."""
    parts = ["set -euo pipefail"]
    for n, b in enumerate(blocks):
        parts.append(f"echo '::docs-block {n}::' >&2")
        if b.lang == "python":
            parts.append(f".venv/bin/python - <<'DOCS_PY_{n}'\n{b.text}\nDOCS_PY_{n}")
        else:
            parts.append(b.text)
    return "\n".join(parts) + "\n"


def test_the_readme_declares_what_this_test_declares() -> None:
    readme = (ROOT / "README.md").read_text()
    for name, value in DOCS_ENV.items():
        assert re.search(rf"\b{name}=\"?{re.escape(value)}\"?(\s|$)", readme), name


def test_every_block_runs_as_written(
    tmp_path: Path, engine_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    need_tools("curl", how="apt-get install curl")
    # The docs name .venv/bin/gpuyard.
    need_tools(str(ROOT / ".venv" / "bin" / "gpuyard"), how="make venv")
    skipped: collections.Counter[str] = collections.Counter()
    ran = 0
    took: dict[str, float] = {}
    with running_server(tmp_path / "home", engine_url, env=DOCS_ENV) as server:
        env = {k: v for k, v in os.environ.items() if k not in ("GPUYARD_URL", "GPUYARD_API_KEY")}
        env |= DOCS_ENV | {
            "GPUYARD_HOME": str(server.home),
            "GPUYARD_PORT": str(server.port),
            "GPUYARD_ENGINE_URL": engine_url,
        }
        for path in pages():
            all_blocks = blocks_of(path)
            for b in all_blocks:
                if b.skip:
                    skipped[b.skip] += 1
            todo = [b for b in all_blocks if not b.skip]
            if not todo:
                continue
            began = time.monotonic()
            r = subprocess.run(
                ["bash", "-c", script_of(todo)],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=240,
            )
            if r.returncode != 0:
                markers = re.findall(r"::docs-block (\d+)::", r.stderr)
                failed = todo[int(markers[-1])] if markers else todo[0]
                pytest.fail(
                    f"{failed.page}:{failed.line}: a {failed.lang} block failed "
                    f"(exit {r.returncode}):\n{failed.text}\n--- stdout ---\n"
                    f"{r.stdout[-3000:]}\n--- stderr ---\n{r.stderr[-3000:]}\n"
                    f"--- server log ---\n{server.log_tail(2000)}"
                )
            ran += len(todo)
            took[str(path.relative_to(ROOT))] = time.monotonic() - began
    with capsys.disabled():
        print(f"\ndocs blocks: {ran} ran, {sum(skipped.values())} skipped")
        for reason, n in skipped.most_common():
            print(f"  skipped {n}: {reason}")
        slowest = sorted(took.items(), key=lambda kv: -kv[1])[:5]
        print("  slowest pages: " + ", ".join(f"{page} {s:.0f} s" for page, s in slowest))
    assert ran >= 10
