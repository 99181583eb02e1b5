"""Runs inside vLLM's worker processes, never in ours: a worker extension (vLLM's
`--worker-extension-cls slime_harbor.policy.vllm_worker.WeightReload`, which `slime-harbor serve
--engine vllm` passes) whose methods vLLM's dev-mode /collective_rpc calls by name. It imports
nothing but torch and vLLM, so vLLM's own environment loads it with slime-harbor on its path
(pip install --no-deps slime-harbor, or the package dir on PYTHONPATH).

Why: vLLM 0.32's in-place `reload_weights` skips the LM head of a model whose config ties it to
the embeddings (Qwen3 0.6B to 4B, and the tiny model), logs `ParallelLMHead: Failed to load
weights`, and puts the head's old tensors back. On a CPU those tensors are not the weights
themselves but the packed copy the CPU matmul runs on (made once, when the head was processed
after loading), so the head goes on computing with the weights the engine started with while
every other layer moves: a model that never existed, served under the new version's label.
`slime_harbor_reload_weights` runs vLLM's reload, then points the head at the reloaded
embedding and processes it again, as loading does, so the head follows the embeddings.
"""

from __future__ import annotations


class WeightReload:
    """Mixed into vLLM's worker class (vLLM checks that no name clashes with the worker's own)."""

    def slime_harbor_reload_weights(self, weights_path: str) -> dict:
        """vLLM's own in-place reload from `weights_path`, then the tied LM head re-tied and
        re-processed. Returns what it did, for the caller's log."""
        self.reload_weights(weights_path=weights_path)  # the worker's own: vLLM's layerwise reload
        model = self.model_runner.get_model()
        head = getattr(model, "lm_head", None)
        embedding = getattr(getattr(model, "model", None), "embed_tokens", None)
        tied = getattr(getattr(model, "config", None), "tie_word_embeddings", False)
        if not tied or head is None or embedding is None or not hasattr(head, "tie_weights"):
            return {"retied": False}
        head = head.tie_weights(embedding)  # as the model ties them when it is built
        head.quant_method.process_weights_after_loading(head)  # as loading does: the CPU repacks here
        return {"retied": True}
