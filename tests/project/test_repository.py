"""What the repository itself holds: no large or built files outside the places meant for them."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from tests.paths import REPO_ROOT

ROOT = REPO_ROOT
LIMIT = 1_000_000  # bytes
# pictures a person looks at: the README's screenshots and the bench's charts
ALLOWED = ("resources/",)
ALLOWED_SUFFIXES_IN_BENCH = (".png",)


def _tracked() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [p for p in out.stdout.decode().split("\0") if p]


def _allowed(path: str) -> bool:
    return path.startswith(ALLOWED) or (path.startswith("bench/")
                                        and path.endswith(ALLOWED_SUFFIXES_IN_BENCH))


def test_no_tracked_file_over_a_megabyte_outside_resources_and_bench_pictures():
    large = [(p, (ROOT / p).stat().st_size) for p in _tracked()
             if (ROOT / p).is_file() and (ROOT / p).stat().st_size > LIMIT and not _allowed(p)]
    assert not large, f"large tracked files (keep built things out of git): {large}"


def test_the_rule_sees_a_large_file(tmp_path):
    """The check above reads sizes of real files: a built binary at an unexpanded make path
    would be caught, a screenshot would not."""
    assert not _allowed("$(HOME)/.cache/kvprimer/servers/x/llama-server")
    assert not _allowed("bench/results.json")
    assert _allowed("resources/screenshot.png") and _allowed("bench/results.png")
