"""Does the tiny model learn an agent's format by SFT? The demo's warm start in mini-swe-agent's own
format (slime_harbor/trainers/agent_sft.py), with what the demo's single figure (P(oracle episode))
hides: every --every steps, the probe episodes' command-reply and submit-reply token
probabilities, the lowest command token probability over the probe episodes (a file name the
model has to copy from the task), and the mean log P of the whole episode.

    PYTHONPATH=$PWD .venv/bin/python bench/agent_sft.py [--agent mini-swe-agent|native] [--steps 1200] [--layers N] [--native-first 700]

`--agent native` runs the same on the native agent's episodes, for comparison. `--native-first N`
first trains N steps on the native agent's episodes, as the demo's first SFT stage does
(`--sft-native-steps`). It also prints where
the task's instruction sits in the prompt and how far the reply is from it.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path

import torch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--agent", default="mini-swe-agent", choices=["mini-swe-agent", "native"])
    p.add_argument("--env", default="local")
    p.add_argument("--steps", type=int, default=1200)
    p.add_argument("--every", type=int, default=50)
    p.add_argument("--sft-instances", type=int, default=150)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layers", type=int, default=None, help="a tiny model with this many layers instead of the default's")
    p.add_argument("--native-first", type=int, default=0, metavar="STEPS",
                   help="first SFT this many steps on the native agent's episodes of the same instances")
    a = p.parse_args()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from slime_harbor.policy.tiny_model import TinyModelConfig, build_tiny_model, ensure_tiny_model
    from slime_harbor.tasks import families as task_families
    from slime_harbor.trainers.demo import demo_defaults, sft_episodes
    from slime_harbor.trainers.sft import SFTConfig, sft_sequences

    torch.manual_seed(a.seed)
    torch.set_num_threads(2)
    if a.layers is None:
        base = ensure_tiny_model(a.seed)
    else:  # the same tokenizer and recipe, deeper
        base = build_tiny_model(Path(tempfile.mkdtemp(prefix="tiny-model-")), seed=a.seed,
                                config=TinyModelConfig(num_hidden_layers=a.layers))
    tokenizer = AutoTokenizer.from_pretrained(base)
    # The demo's SFT data (demo.sft_episodes), probed on two training instances per family.
    cfg = dataclasses.replace(demo_defaults(a.agent), env=a.env, seed=a.seed, sft_instances=a.sft_instances)
    probe = [inst for f in cfg.families for inst in task_families.instances(f, 2, a.seed, "train", strict=False)]
    sequences, probes, _ = sft_episodes(cfg, base, tokenizer, probe,
                                        Path(tempfile.mkdtemp(prefix="agent-sft-")) / "format")
    tokens, mask = probes[0]
    # The instruction's tokens but the first two and the last (they may merge with their neighbours in the prompt).
    words = tokenizer.encode(probe[0].instruction, add_special_tokens=False)[2:-1]
    end = next((i + len(words) for i in range(len(tokens)) if tokens[i:i + len(words)] == words), None)
    where = f"the instruction ends at token {end}, {mask.index(1) - end} tokens before" if end else "the instruction is not found before"
    print(f"{a.agent}: {len(sequences)} episodes of ~{len(tokens)} tokens; {where} the first reply "
          f"(token {mask.index(1)})", flush=True)

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    started = time.monotonic()
    if a.native_first:
        native, _, _ = sft_episodes(dataclasses.replace(cfg, agent="native"), base, tokenizer, probe, Path(tempfile.mkdtemp()))
        sft_sequences(model, native, SFTConfig(steps=a.native_first, lr=a.lr, batch_size=a.batch_size, seed=a.seed),
                      pad_id=tokenizer.pad_token_id or 0)
        print(f"native-format SFT: {a.native_first} steps in {time.monotonic() - started:.0f} s", flush=True)

    def report(step: int, m) -> bool:
        if step % a.every:
            return False
        m.eval()
        command, submit, lowest, episode_lp = [], [], [], []
        with torch.no_grad():
            for toks, msk in probes:
                logits = m(torch.tensor([toks])).logits[0, :-1].float()
                lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(toks[1:])[:, None])[:, 0]
                trained = [k for k, bit in enumerate(msk) if bit]
                first = [k for j, k in enumerate(trained) if k - trained[0] == j]  # the command reply
                second = [k for k in trained if k not in first]
                command.append(lp[[k - 1 for k in first]].exp())
                submit.append(lp[[k - 1 for k in second]].exp())
                lowest.append(command[-1].min().item())
                episode_lp.append(lp[[k - 1 for k in trained]].sum().item())
        m.train()
        print(f"step {step:5d} ({time.monotonic() - started:5.0f} s): command-reply token p {torch.cat(command).mean():.3f}, "
              f"lowest command token p {min(lowest):.3f}, submit-reply token p {torch.cat(submit).mean():.3f}, "
              f"log P(episode) {sum(episode_lp) / len(episode_lp):.1f}", flush=True)
        return False

    sft_sequences(model, sequences, SFTConfig(steps=a.steps, lr=a.lr, batch_size=a.batch_size, seed=a.seed),
                  pad_id=tokenizer.pad_token_id or 0, until=report)


if __name__ == "__main__":
    main()
