"""The docs: the site builds with `mkdocs build --strict` (any warning fails), its reference holds
every flag of every subcommand's --help (generated from the parsers, so it cannot drift), and the
README stays a front door whose links resolve."""

from __future__ import annotations

import argparse
import html
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def command_flags() -> dict[str, set[str]]:
    """The flags `slime-harbor <command> --help` lists, for every command (train-local's own parser)."""
    from slime_harbor.cli import build_parser
    from slime_harbor.trainers.local import build_parser as train_local_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    flags = {}
    for name, parser in sub.choices.items():
        parser = train_local_parser() if name == "train-local" else parser
        flags[name] = {o for a in parser._actions for o in a.option_strings if o.startswith("--")} - {"--help"}
        assert all(f in parser.format_help() for f in flags[name])
    return flags


def test_the_site_builds_strictly_and_its_reference_has_every_flag(site):
    reference = html.unescape((site / "reference" / "index.html").read_text())
    flags = command_flags()
    assert {"rollout", "demo", "train-local", "calibrate"} <= flags.keys() and len(flags["train-local"]) > 30
    missing = {name: sorted(f for f in names if f"<code>{f}</code>" not in reference) for name, names in flags.items()}
    assert {k: v for k, v in missing.items() if v} == {}
    for name in flags:  # one section per command
        assert f"slime-harbor {name}" in reference
    from slime_harbor import hooks

    assert all(f"<code>{key}</code>" in reference for key in hooks.DEFAULTS)


def test_the_readme_is_a_front_door(site):
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    # The two commands a fresh machine needs, the second being what CI runs.
    assert "bash scripts/setup.sh && .venv/bin/slime-harbor demo" in readme
    assert "bash scripts/test.sh" in readme and "bash scripts/test.sh" in (REPO / ".ci" / "run").read_text()
    links = re.findall(r"\]\(((?!https?://)[^)#]+)\)", readme)
    assert links and all((REPO / link).exists() for link in links), [l for l in links if not (REPO / l).exists()]
    for link in links:  # every docs page it links is a page of the built site
        if link.startswith("docs/") and link.endswith(".md"):
            page = link.removeprefix("docs/").removesuffix(".md")
            assert (site / ("" if page == "index" else page) / "index.html").exists(), link


def test_the_agent_table_is_generated_from_the_recipes():
    """docs/gateway.md's agent table is what the recipes and the measured figures give now."""
    from scripts.agent_table import MEASURED, agent_table
    from slime_harbor.agents.installed.catalog import RECIPES, UNAVAILABLE

    page = (REPO / "docs" / "gateway.md").read_text()
    assert agent_table(MEASURED) in page, "regenerate it: .venv/bin/python scripts/agent_table.py"
    assert all(f"| {name} |" in page for name in (*RECIPES, *UNAVAILABLE))


def test_the_chain_page_maps_every_module():
    """docs/chain.md is the newcomer's map from task to loss: every module of the package is on it
    (a module added without a place there fails here)."""
    chain = (REPO / "docs" / "chain.md").read_text()
    package = REPO / "slime_harbor"
    modules = [p for p in package.rglob("*.py") if p.name != "__init__.py" and "cpu_shims" not in p.parts]
    assert len(modules) > 40
    missing = [str(p.relative_to(package)) for p in modules if p.name not in chain]
    assert not missing, f"docs/chain.md does not place: {missing}"
