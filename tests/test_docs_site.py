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


# Every concept of the product spec (../shared/SPEC.md) and where a newcomer finds it: a page of
# the navigation and, unless the page is the concept, a heading of that page (## or ###: the
# page's table of contents shows it, so it is one click from the navigation). docs/index.md's
# "Concepts" table links each one.
CONCEPTS = {
    "the two parties (user, provider)": ("THREAT_MODEL.md", "Who we protect you from"),
    "dχ text-to-text privatization": ("privacy.md", "The mechanism: dχ privatization"),
    "P, η and empirical privacy": ("privacy.md", "P and empirical privacy"),
    "privacy noise and seeds": ("THREAT_MODEL.md", "Randomness: the rule behind every guarantee"),
    "the privacy rule": ("privacy.md", "The privacy rule"),
    "the attack table": ("privacy.md", "The attack table"),
    "tuning methods: prompt, prefix, LoRA": ("tuning.md", "Which method, and what to expect"),
    "RAPT and privatized token reconstruction":
        ("tuning.md", "RAPT: privatized token reconstruction (`--reconstruction`)"),
    "Split-and-Privatize": ("sap.md", "The split and its messages"),
    "contributing-token identification (CTI)":
        ("sap.md", "Contributing-token identification (CTI)"),
    "PromptDPSGD": ("dp-pate.md", "PromptDPSGD (`rapt tune --dp-epsilon`)"),
    "PromptPATE": ("dp-pate.md", "PromptPATE (`rapt pate`)"),
    "embedding inversion": ("privacy.md", "Embedding inversion (nearest neighbour)"),
    "attribute inference": ("privacy.md", "Attribute inference"),
    "contextual reconstruction": ("THREAT_MODEL.md", "Contextual reconstruction (the channel)"),
    "channel models (denoiser, adapter)": ("tuning.md", "Channel models"),
    "privacy per kind of token, canaries": ("THREAT_MODEL.md", "Privacy per kind of token"),
    "noise by kind of token": ("privacy.md", "Noise by kind of token (`--protect rare`)"),
    "label inference in split learning": ("sap.md", "Label inference and label DP"),
    "membership inference on prompts": ("dp-pate.md", "Membership inference (`rapt mia`)"),
    "the local model": ("users-side.md", "The local model"),
    "user-side fusion": ("users-side.md", "Fusion"),
    "the output denoiser": ("users-side.md", "The output denoiser"),
    "when rapt is worth it": ("users-side.md", "When rapt is worth it"),
    "backbones": ("getting-started.md", "Backbones and model weights"),
    "the service's HTTP API and job store": ("service.md", "The HTTP API"),
    "API keys": ("service.md", "API keys"),
    "tenancy and deletes": ("service.md", "Your data, your deletes"),
    "the console": ("service.md", "The console"),
    "metrics": ("service.md", "Metrics for operators"),
    "the client": ("service.md", "The client"),
    "scaling out: PostgreSQL and Ray": ("SCALING.md", None),
    "the command line": ("reference/cli.md", None),
    "the Python API": ("reference/api.md", None),
    "benchmarks": ("benchmarks.md", None),
    "threat model": ("THREAT_MODEL.md", None),
}


def _nav_pages(nav) -> set[str]:
    """Every page file named in mkdocs.yml's nav (nested sections included)."""
    if isinstance(nav, str):
        return {nav}
    if isinstance(nav, list):
        return set().union(*(_nav_pages(item) for item in nav))
    return set().union(*(_nav_pages(v) for v in nav.values()))


def _toc_headings(page: Path) -> set[str]:
    """The ## and ### headings of a page outside code fences: what its table of contents shows."""
    out, fenced = set(), False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith(("## ", "### ")):
            out.add(line.split(" ", 1)[1].strip())
    return out


def test_every_spec_concept_is_one_click_from_the_nav():
    yaml = pytest.importorskip("yaml")
    slugify = pytest.importorskip("markdown.extensions.toc").slugify
    nav = _nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    index = (ROOT / "docs" / "index.md").read_text()
    for concept, (page, heading) in CONCEPTS.items():
        assert page in nav, f"{concept}: {page} is not in mkdocs.yml's nav"
        target = page
        if heading is not None:
            assert heading in _toc_headings(ROOT / "docs" / page), \
                f"{concept}: no heading '## {heading}' on {page}"
            target += "#" + slugify(heading.replace("`", ""), "-")
        assert f"]({target})" in index, f"{concept}: docs/index.md's Concepts table lacks {target}"
