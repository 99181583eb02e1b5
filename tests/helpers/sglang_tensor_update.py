"""Run by SGLang's own Python (tests/test_real_engines.py): SGLang's offline Engine on BASE takes
the weights of MOVED as tensors (begin_weight_update, update_weights_from_tensor,
end_weight_update: the colocated trainer's path), and the mean |served - float32| prompt logprob
gap to MOVED's weights is printed, before and after, as one JSON line.

Usage: python sglang_tensor_update.py BASE MOVED
"""

import json
import sys

import sglang
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

PROBE = "You are a coding agent in a Linux sandbox. Fix the failing test in /app, run it, and say what it printed."


def main(base: str, moved_dir: str) -> None:
    moved = AutoModelForCausalLM.from_pretrained(moved_dir, dtype=torch.float32).eval()
    ids = AutoTokenizer.from_pretrained(base).encode(PROBE)
    with torch.no_grad():
        logits = moved(torch.tensor([ids])).logits[0, :-1]
    want = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
    engine = sglang.Engine(model_path=base, device="cpu", attention_backend="torch_native", sampling_backend="pytorch",
                           disable_overlap_schedule=True, disable_cuda_graph=True, max_total_tokens=4096,
                           max_running_requests=4, skip_server_warmup=True, dtype="float32", log_level="error")
    try:
        def gap() -> float:
            out = engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 1}, return_logprob=True,
                                  logprob_start_len=0)
            got = torch.tensor([pair[0] for pair in out["meta_info"]["input_token_logprobs"][1:]])
            return (got - want).abs().mean().item()

        before = gap()
        engine.begin_weight_update()
        ok, message = engine.update_weights_from_tensor([(name, p.detach()) for name, p in moved.named_parameters()])
        engine.end_weight_update()
        if not ok:
            raise SystemExit(f"update_weights_from_tensor failed: {message}")
        print(json.dumps({"before": before, "after": gap()}))
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:3])
