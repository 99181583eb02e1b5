"""The native agent speaks its model family's chat format through the renderer the gateway uses
(policy/renderer.py): its next prompt is the gateway's bridge, and a family no renderer speaks
is refused in one line instead of being sent ChatML."""

from __future__ import annotations

import asyncio
import json
import shutil
from types import SimpleNamespace

import pytest
from harbor.models.agent.context import AgentContext

import slime_harbor.agents.native as agent_module
from slime_harbor.agents.native import initial_messages, NativeAgent
from slime_harbor.exits import ConfigError
from slime_harbor.policy.renderer import bridge_ids
from slime_harbor.policy.sampling import Generation


class TwoTurnPolicy:
    """Stands in for PolicyClient: turn 1 is cut by max_new_tokens inside an open <think>; turn 2
    submits. Keeps every prompt it is sent."""

    tokenizer = None
    prompts: list[list[int]] = []

    def __init__(self, *args, **kwargs):
        pass

    async def generate(self, ids, params, routing_key=None) -> Generation:
        TwoTurnPolicy.prompts.append(list(ids))
        first = len(TwoTurnPolicy.prompts) == 1
        text = "<think>\nI should list" if first else "THOUGHT: done.\n```bash\nsubmit\n```<|im_end|>"
        tokens = self.tokenizer.encode(text, add_special_tokens=False)
        return Generation(token_ids=tokens, logprobs=[-0.5] * len(tokens), text="",
                          finish_reason="length" if first else "stop", rid="r", weight_version="0")

    async def aclose(self) -> None:
        pass


class Sandbox:
    async def exec(self, command, timeout_sec=None):
        return SimpleNamespace(stdout="", stderr="", return_code=0)


def test_a_reply_cut_inside_reasoning_is_closed_as_the_gateway_closes_it(tmp_path, tiny_model_dir, renderer,
                                                                          monkeypatch):
    agent = NativeAgent(tmp_path / "agent", model_name="tiny", policy_url="http://127.0.0.1:9",
                        tokenizer_path=str(tiny_model_dir))
    TwoTurnPolicy.tokenizer, TwoTurnPolicy.prompts = agent.tokenizer, []
    monkeypatch.setattr(agent_module, "PolicyClient", TwoTurnPolicy)
    context = AgentContext()
    asyncio.run(agent.run("List the files.", Sandbox(), context))

    first, second = TwoTurnPolicy.prompts
    detail = context.rollout_details[0]
    cut_reply = detail["completion_token_ids"][0]
    messages = initial_messages("List the files.") + [
        {"role": "assistant", "content": agent.tokenizer.decode(cut_reply, skip_special_tokens=True)},
        {"role": "user", "content": agent_module.DEFAULT_PROMPTS.format_error_template.format(n_blocks=0)}]
    assert second == bridge_ids(renderer, first, cut_reply, messages[-1:])
    # The turn's reasoning is closed before the turn is (a bare <|im_end|> would leave it open).
    closing = agent.tokenizer.decode(second[len(first) + len(cut_reply):])
    assert closing.startswith("</think><|im_end|>\n<|im_start|>user\n")
    assert second[: len(first) + len(cut_reply)] == first + cut_reply  # still one growing token list
    assert context.metadata["exit_status"] == "submitted"


def test_a_model_family_without_a_renderer_is_refused_in_one_line(tmp_path, tiny_model_dir):
    model_dir = shutil.copytree(tiny_model_dir, tmp_path / "model")
    (model_dir / "slime_harbor.json").unlink(missing_ok=True)  # no recorded format: model_type decides
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "model_type": "my_own_lm"}))
    with pytest.raises(ConfigError, match="no chat format known for model_type 'my_own_lm'.*--renderer NAME") as error:
        NativeAgent(tmp_path / "agent", model_name="tiny", policy_url="http://127.0.0.1:9",
                    tokenizer_path=str(model_dir))
    assert "\n" not in str(error.value)


def test_a_prompts_file_of_the_users_replaces_the_agents_prompts(tmp_path, tiny_model_dir, monkeypatch):
    """The option `prompts` (as mini-swe-agent's -c): the keys a user's YAML gives replace
    native.yaml's, the others stay; the model is sent the user's system prompt, and the user's
    submit command ends the episode. A file that is not a mapping of those keys is one line."""
    prompts = tmp_path / "prompts.yaml"
    prompts.write_text("system_template: You are a terse shell agent. Say done when done.\nsubmit_command: done\n")
    agent = NativeAgent(tmp_path / "agent", model_name="tiny", policy_url="http://127.0.0.1:9",
                        tokenizer_path=str(tiny_model_dir), prompts=str(prompts))
    assert agent.prompts.instance_template == agent_module.DEFAULT_PROMPTS.instance_template

    class SubmitsDone(TwoTurnPolicy):
        async def generate(self, ids, params, routing_key=None) -> Generation:
            TwoTurnPolicy.prompts.append(list(ids))
            tokens = self.tokenizer.encode(agent_module.format_reply("all set.", "done") + "<|im_end|>",
                                           add_special_tokens=False)
            return Generation(token_ids=tokens, logprobs=[-0.5] * len(tokens), text="", finish_reason="stop", rid="r",
                              weight_version="0")

    TwoTurnPolicy.tokenizer, TwoTurnPolicy.prompts = agent.tokenizer, []
    monkeypatch.setattr(agent_module, "PolicyClient", SubmitsDone)
    context = AgentContext()
    asyncio.run(agent.run("List the files.", Sandbox(), context))
    (first,) = TwoTurnPolicy.prompts
    assert "You are a terse shell agent." in agent.tokenizer.decode(first)
    assert "coding agent working in a Linux shell" not in agent.tokenizer.decode(first)
    assert context.metadata["exit_status"] == "submitted" and context.metadata["turns"] == 1

    prompts.write_text("system_prompt: a key the agent does not have\n")
    with pytest.raises(ValueError, match=r"prompts\.yaml: a mapping of format_error_template, .* to strings") as error:
        NativeAgent(tmp_path / "agent2", model_name="tiny", policy_url="http://127.0.0.1:9",
                    tokenizer_path=str(tiny_model_dir), prompts=str(prompts))
    assert "\n" not in str(error.value)
