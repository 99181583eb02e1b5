"""The tensors of the engine's decode loop (engine.SamplingEngine): the running batch (rows, cache,
attention mask, next positions; merged when requests join, narrowed when they leave: each cache
layer as cache_layers.py says for its kind) and sampling under top-k / top-p truncation with the
kept ids SLiME's top-p replay needs.
"""

from __future__ import annotations

import torch

from slime_harbor.policy import cache_layers


class Batch:
    """The running rows and their shared cache, in left-padded columns (worker-only state)."""

    def __init__(self, rows=(), cache=None, mask=None, next_pos=None):
        self.rows: list = list(rows)  # engine._Request, in batch order
        self.rows_pending_prefill: list = []  # admitted, not yet merged (failure cleanup)
        self.cache = cache  # a transformers DynamicCache, laid out as cache_layers.py says
        self.mask = mask if mask is not None else torch.zeros((0, 0), dtype=torch.long)
        self.next_pos = next_pos if next_pos is not None else torch.zeros(0, dtype=torch.long)

    def merge(self, other: Batch) -> Batch:
        """Stack two batches, left-padding the narrower one's columns with masked zeros."""
        if not self.rows:
            return other
        width = max(self.mask.shape[1], other.mask.shape[1])
        cache = cache_layers.merge(self.cache, other.cache, width)
        mask = torch.cat([cache_layers.left_pad(self.mask, width, 1), cache_layers.left_pad(other.mask, width, 1)])
        return Batch(self.rows + other.rows, cache, mask, torch.cat([self.next_pos, other.next_pos]))

    def select(self, keep: list[int]) -> Batch:
        """Keep rows `keep`, dropping the columns that are padding for all of them."""
        if not keep:
            return Batch()
        index = torch.tensor(keep, dtype=torch.long)
        mask = self.mask[index]
        start = int((mask.sum(0) > 0).nonzero()[0])
        cache = cache_layers.select(self.cache, index, mask.shape[1] - start)
        return Batch([self.rows[i] for i in keep], cache, mask[:, start:], self.next_pos[index])


class Truncation:
    """Which tokens each row's top-k then top-p filter keeps.

    logprobs [B, V]; top_k [B] (<= 0: off); top_p [B] (1: off). Only rows with a filter are
    worked on (`rows`); for the j-th of them, `order[j]` lists token ids most likely first and
    `keep[j]` marks the ones kept.
    """

    def __init__(self, logprobs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor):
        self.vocab = logprobs.shape[-1]
        self.rows = ((top_k > 0) | (top_p < 1)).nonzero()[:, 0]
        self.order = self.keep = None
        self._position: dict[int, int] = {}
        if not len(self.rows):
            return
        k = top_k[self.rows]
        # Only the k most likely tokens can survive; a full sort (slow on CPU) only for top-p alone.
        width = self.vocab if bool((k <= 0).any()) else min(int(k.max()), self.vocab)
        sorted_probs, self.order = logprobs[self.rows].exp().topk(width, dim=-1)
        keep = (k[:, None] <= 0) | (torch.arange(width)[None, :] < k[:, None])
        kept = sorted_probs * keep
        # Drop a token once the mass before it reaches top_p of the top-k mass (the first is kept).
        keep &= (kept.cumsum(-1) - kept) < top_p[self.rows, None] * kept.sum(-1, keepdim=True)
        self.keep = keep
        self._position = {int(row): j for j, row in enumerate(self.rows)}

    def allowed(self) -> torch.Tensor:
        """[len(rows), V] bool: the kept tokens of each filtered row, in vocab order."""
        return torch.zeros((len(self.rows), self.vocab), dtype=torch.bool).scatter_(-1, self.order, self.keep)

    def kept(self, row: int) -> torch.Tensor:
        """The kept token ids of batch row `row` (which must have a filter), most likely first."""
        j = self._position[row]
        return self.order[j][self.keep[j]]


def sample_tokens(logprobs, exponentials, truncation: Truncation) -> torch.Tensor:
    """Sample one token per row among the tokens its filter keeps, by the exponential race.

    exponentials [B, V] ~ Exp(1). argmax(p_i / E_i) is a sample from p (Gumbel-max). Unlike
    inverse-CDF sampling, a ~1e-6 change in the logits (another batch shape) almost never changes
    the winner, so a seeded request samples the same tokens whatever shares its batch.
    """
    scores = logprobs - exponentials.log()
    if len(truncation.rows):
        rows = truncation.rows
        scores[rows] = scores[rows].masked_fill(~truncation.allowed(), float("-inf"))
    return scores.argmax(-1)


def eos_token_ids(model, tokenizer) -> frozenset[int]:
    """Every token id that ends a sequence: the model's generation config, its config and the tokenizer's."""
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        ids.update([value] if isinstance(value, int) else value or [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return frozenset(ids)
