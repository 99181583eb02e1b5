"""MkDocs hook: docs/reference.md's tables, generated at build time from the code itself.

Every subcommand's flags come from slime_harbor.cli.build_parser() (train-local's from
trainers/local.py's build_parser), the SLiME hook's YAML keys and the config fields from the
dataclasses' own field docs (slime_harbor.hooks.HookSettings, RolloutConfig, ...). A flag or key
added to the code appears here on the next build; tests/test_docs.py checks that every flag of
every `--help` is in the built page.
"""

from __future__ import annotations

import argparse
import dataclasses
import re

MARKER = re.compile(r"<!-- generated: (\w[\w-]*) -->")


def _cell(text) -> str:
    return " ".join(str(text).split()).replace("|", "\\|") if text not in (None, "") else ""


def _default(action: argparse.Action) -> str:
    if action.default in (None, argparse.SUPPRESS) or isinstance(action, argparse._StoreTrueAction):
        return ""
    return f"`{action.default}`"


def parser_table(parser: argparse.ArgumentParser) -> str:
    rows = ["| flag | default | what it does |", "|---|---|---|"]
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        names = ", ".join(f"`{o}`" for o in action.option_strings) or f"`{action.dest}` (positional)"
        choices = f" One of: {', '.join(map(str, action.choices))}." if action.choices else ""
        text = re.sub(r"\(default: [^)]*\)$", "", action.help or "").strip()
        rows.append(f"| {names} | {_default(action)} | {_cell(text + choices)} |")
    return "\n".join(rows)


def commands() -> str:
    from slime_harbor.cli import build_parser
    from slime_harbor.trainers.local import build_parser as train_local_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    helps = {c.dest: c.help for c in sub._choices_actions}
    out = []
    for name, parser in sub.choices.items():
        out.append(f"### `slime-harbor {name}`\n\n{_cell(helps.get(name))}\n")
        out.append(parser_table(train_local_parser() if name == "train-local" else parser) + "\n")
    return "\n".join(out)


def hook_keys() -> str:
    """The hook's YAML keys: slime_harbor.hooks.HookSettings' fields."""
    from slime_harbor.hooks import HookSettings

    return dataclass_table(HookSettings).replace("| field |", "| key |", 1)


def dataclass_table(cls) -> str:
    from slime_harbor.config_docs import field_docs

    docs = field_docs(cls)
    rows = ["| field | default | what it is |", "|---|---|---|"]
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else "")
        rows.append(f"| `{f.name}` | `{default}` | {_cell(docs.get(f.name, ''))} |")
    return "\n".join(rows)


def rollout_config() -> str:
    from slime_harbor.run_config import RolloutConfig

    return dataclass_table(RolloutConfig)


def learning_config() -> str:
    from slime_harbor.trainers.demo import LearningConfig

    return dataclass_table(LearningConfig)


GENERATORS = {"commands": commands, "hook-keys": hook_keys, "rollout-config": rollout_config,
              "learning-config": learning_config}


def on_page_markdown(markdown: str, page, config, files) -> str:
    return MARKER.sub(lambda m: GENERATORS[m.group(1)](), markdown)
