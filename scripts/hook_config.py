"""examples/harbor/configs/harbor_grpo.yaml, generated from slime_harbor.hooks.HookSettings: every
plugin setting at its default, its docstring as the comment above it. A tool of the repository,
not of the package.

    .venv/bin/python scripts/hook_config.py      # rewrites the YAML
"""

from __future__ import annotations

import dataclasses
import json
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as a script from anywhere

from slime_harbor.config_docs import field_docs  # noqa: E402
from slime_harbor.hooks import DEFAULTS, HookSettings  # noqa: E402

CONFIG = REPO / "examples" / "harbor" / "configs" / "harbor_grpo.yaml"
HEADER = """\
# slime-harbor plugin settings for SLiME's --custom-config-path (scripts/run_harbor_grpo.sh).
# SLiME sets every key onto its args; slime_harbor.hooks reads them. Relative paths resolve
# against the directory training runs in (the repository root, via run_harbor_grpo.sh).
# Generated from slime_harbor.hooks.HookSettings by scripts/hook_config.py: change the settings there.
"""


def yaml_value(value) -> str:
    """A default as YAML spells it (JSON is YAML; null, true, false, numbers, lists as they are; a
    string YAML would read as something else, such as on / off, quoted)."""
    import yaml

    return value if isinstance(value, str) and yaml.safe_load(value) == value else json.dumps(value)


def hook_config_yaml() -> str:
    docs = field_docs(HookSettings)
    blocks = [HEADER]
    for f in dataclasses.fields(HookSettings):
        comment = textwrap.fill(docs[f.name], width=98, initial_indent="# ", subsequent_indent="# ")
        blocks.append(f"{comment}\n{f.name}: {yaml_value(DEFAULTS[f.name])}\n")
    return "\n".join(blocks)


if __name__ == "__main__":
    CONFIG.write_text(hook_config_yaml())
    print(f"wrote {CONFIG.relative_to(REPO)}")
