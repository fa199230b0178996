"""The documentation site builds offline with ``mkdocs build --strict``: a broken link, a missing
page or an unresolved API reference fails the suite (mkdocs.yml sets every link check to warn,
and --strict turns a warning into a failure)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _build(config: Path, site: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                           "-f", str(config), "-d", str(site)],
                          cwd=config.parent, env=env, capture_output=True, text=True,
                          timeout=300)


def test_site_builds_strict(tmp_path: Path):
    pytest.importorskip("mkdocs")
    out = _build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert out.returncode == 0, out.stdout + out.stderr
    cli = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    assert "--target-p" in cli and "rapt sap tune" in cli


def test_broken_link_fails_the_build(tmp_path: Path):
    """The same validation settings on a two-page site with one broken link: the build fails."""
    pytest.importorskip("mkdocs")
    config = (ROOT / "mkdocs.yml").read_text().split("\nnav:", 1)[0]
    keep = [line for line in config.splitlines()
            if "benchmarks/docs_hook.py" not in line and "hooks:" not in line]
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# Home\n\nSee [the page](page.md).\n")
    (tmp_path / "docs" / "page.md").write_text("# Page\n\nSee [nothing](missing.md).\n")
    (tmp_path / "mkdocs.yml").write_text("\n".join(keep) + "\nnav: [index.md, page.md]\n")
    out = _build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert out.returncode != 0 and "missing.md" in out.stdout + out.stderr
