"""The embedded engine's cache, layer kind by layer kind: which architectures the engine serves, and
how the rows of each kind of transformers cache layer are stacked when requests join the running
batch, narrowed when rows leave (decode.Batch), and cleared where a prefill left padding (the
engine): all three through LAYER_KINDS, for every layer of the cache; nothing else looks at a
layer's class.

The batch is laid out in columns: each row's tokens are right-aligned, its first columns padding
(mask 0). A cache layer holds its rows one of three ways:

  * by column (attention keys and values; the DSA indexer's keys): an entry per column. A row that
    joins a wider batch is left-padded with zeros, which the mask hides at every later step; a
    narrower batch drops the columns that are padding for all its rows.
  * by column, windowed (sliding-window attention): only the last sliding_window - 1 columns, as
    transformers' DynamicSlidingWindowLayer keeps them, and its count of columns seen set to the
    batch's width. Rows are right-aligned, so those columns are each row's own last tokens (or
    padding, in a row shorter than the window) whatever the rows' lengths; the sliding mask counts
    in columns, and within a row columns and positions advance together.
  * by row (linear attention's and Mamba's conv and recurrent states): one state per row, whatever
    its length. Rows are stacked, never padded.

Prefill: a model whose layers are all by column has the requests it admits prefilled together,
left-padded; a model with by-row layers has each prefilled alone, then merged. Padding is harmless
to attention, which masks it at every step, but a recurrence keeps whatever reaches it. The models
zero the padding tokens' hidden states (apply_mask_to_padding_states), which leaves each row its own
state (to 1e-7 on the tiny models) only while nothing between that mask and the recurrence adds to
them: Nemotron-H with use_bias (a bias on its in_proj) is 1.7e-2 off in the logits. Alone, a row
has no padding.

No prefix is reused: every request is prefilled whole. A recurrent layer could not reuse one
anyway: its cache keeps only the state after the last token, not the state at a prefix's end.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from transformers.cache_utils import (
    DummyLayer,
    DynamicCache,
    DynamicIndexedLayer,
    DynamicLayer,
    DynamicSlidingWindowLayer,
    LinearAttentionLayer,
)

from slime_harbor.exits import ConfigError

SERVED_ARCHITECTURES: dict[str, str] = {
    "qwen2": "attention",
    "qwen3": "attention",
    "qwen3_moe": "attention, MoE",
    "llama": "attention",
    "glm4_moe": "attention, MoE",
    "deepseek_v3": "multi-head latent attention, MoE",
    "minimax_m2": "attention, MoE",
    "gpt_oss": "sliding-window and full attention with sinks, MoE",
    "qwen3_5_text": "Gated DeltaNet linear attention and full attention",
    "qwen3_5_moe_text": "Gated DeltaNet linear attention and full attention, MoE",
    "qwen3_next": "Gated DeltaNet linear attention and full attention, MoE",
    "nemotron_h": "Mamba2, attention, MLP and MoE blocks",
    "glm_moe_dsa": "multi-head latent attention with a sparse-attention (DSA) indexer, MoE",
}
"""config.model_type (of the text model) -> what its layers are: the architectures whose forward
the engine was checked against a plain forward pass (tests/test_engine.py,
tests/test_engine_architectures.py, tests/test_model_formats.py). Others are refused at start."""


@dataclass(frozen=True)
class LayerKind:
    """How the running batch holds one class of transformers cache layer."""

    columns: tuple[tuple[str, int], ...] = ()
    """Attributes with an entry per column, and the dimension the columns run along (dim 0 is rows)."""
    states: tuple[str, ...] = ()
    """Attributes holding per-row state, {state index: tensor [rows, ...]}: stacked, never padded."""
    window: bool = False
    """Keeps only the last sliding_window - 1 columns."""
    seen: str | None = None
    """The attribute counting the columns the layer has seen, set to the batch's width."""

    @property
    def padded_prefill(self) -> bool:
        """Whether rows of this layer may be prefilled together, left-padded (see the module doc)."""
        return not self.states

    def width(self, layer, batch_width: int) -> int:
        """How many of the batch's last columns the layer holds."""
        return min(batch_width, layer.sliding_window - 1) if self.window else batch_width


KEYS_VALUES = (("keys", 2), ("values", 2))  # [rows, heads, columns, head_dim]

LAYER_KINDS: dict[type, LayerKind] = {
    DynamicLayer: LayerKind(columns=KEYS_VALUES),
    DynamicSlidingWindowLayer: LayerKind(columns=KEYS_VALUES, window=True, seen="cumulative_length"),
    # The DSA indexer's keys are [rows, columns, dim]; "shared" indexer layers leave them None.
    # (indexer_position_ids, which glm_moe_dsa never sets, is not handled.)
    DynamicIndexedLayer: LayerKind(columns=(*KEYS_VALUES, ("indexer_keys", 1))),
    # Gated DeltaNet (Qwen3.5, Qwen3-Next) and Mamba2 (Nemotron-H): a conv window and a recurrent state per row.
    LinearAttentionLayer: LayerKind(states=("conv_states", "recurrent_states"), seen="cumulative_length_linear"),
    DummyLayer: LayerKind(),  # a block with no cache (Nemotron-H's MLP and MoE blocks)
}
"""Keyed by exact class: a subclass (a hybrid layer, a quantized or static one) is another kind."""


def layer_kinds(config) -> list[LayerKind]:
    """The kind of each layer of the cache of a model with `config`; ConfigError (one line) if the
    engine does not serve its architecture or does not know one of its cache layers."""
    model_type = config.get_text_config(decoder=True).model_type
    if model_type not in SERVED_ARCHITECTURES:
        raise _not_served(model_type)
    kinds = []
    for layer in new_cache(config).layers:
        if type(layer) not in LAYER_KINDS:
            raise ConfigError(f"the embedded engine cannot batch the {type(layer).__name__} cache layers of this "
                              f"{model_type!r} model")
        kinds.append(LAYER_KINDS[type(layer)])
    return kinds


def check_checkpoint(model_dir) -> None:
    """layer_kinds of the checkpoint at `model_dir`, from its config alone (before any weight is
    read); a model_type transformers cannot build either (remote code, a newer release) is refused
    the same way, not with transformers' own error."""
    from transformers import AutoConfig, PretrainedConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = PretrainedConfig.get_config_dict(model_dir)[0].get("model_type")
    if model_type not in CONFIG_MAPPING:
        raise _not_served(model_type)
    layer_kinds(AutoConfig.from_pretrained(model_dir))


def _not_served(model_type) -> ConfigError:
    return ConfigError(f"the embedded engine does not serve the {model_type!r} architecture; it serves "
                       f"{', '.join(sorted(SERVED_ARCHITECTURES))}")


def new_cache(config) -> DynamicCache:
    """An empty cache of the model's own layer kinds, as transformers would make for it."""
    return DynamicCache(config=config)


def merge(first: DynamicCache, second: DynamicCache, width: int) -> DynamicCache:
    """The rows of `first` then those of `second`, in a batch `width` columns wide."""
    layers = []
    for a, b in zip(first.layers, second.layers, strict=True):
        kind = LAYER_KINDS[type(a)]
        merged = copy.copy(a)
        for name, dim in kind.columns:
            if getattr(a, name) is not None:
                keep = kind.width(a, width)
                setattr(merged, name, torch.cat([left_pad(getattr(a, name), keep, dim),
                                                 left_pad(getattr(b, name), keep, dim)]))
        for name in kind.states:
            setattr(merged, name, {i: None if s is None else torch.cat([s, getattr(b, name)[i]])
                                   for i, s in getattr(a, name).items()})
        layers.append(_seen(merged, kind, width))
    return _cache_of(first, layers)


def select(cache: DynamicCache, rows: torch.Tensor, width: int) -> DynamicCache:
    """Rows `rows` of `cache`, in a batch narrowed to its last `width` columns."""
    layers = []
    for layer in cache.layers:
        kind = LAYER_KINDS[type(layer)]
        narrowed = copy.copy(layer)
        for name, dim in kind.columns:
            if (t := getattr(layer, name)) is not None:
                keep = kind.width(layer, width)
                setattr(narrowed, name, t[rows.to(t.device)].narrow(dim, t.shape[dim] - keep, keep))
        for name in kind.states:
            setattr(narrowed, name, {i: None if s is None else s[rows.to(s.device)]
                                     for i, s in getattr(layer, name).items()})
        layers.append(_seen(narrowed, kind, width))
    return _cache_of(cache, layers)


def zero_padding(cache: DynamicCache, mask: torch.Tensor) -> None:
    """Zero the padding columns (mask 0) of every by-column tensor: a prefill leaves there what
    fully masked rows computed, which must never leak into a row that later shares the column."""
    for layer in cache.layers:
        for name, dim in LAYER_KINDS[type(layer)].columns:
            if (t := getattr(layer, name)) is not None:
                shape = [1] * t.dim()
                shape[0], shape[dim] = t.shape[0], t.shape[dim]
                pad = (mask[:, mask.shape[1] - t.shape[dim]:] == 0).reshape(shape).to(t.device)
                setattr(layer, name, t.masked_fill(pad, 0))


def _seen(layer, kind: LayerKind, width: int):
    if kind.seen is not None:
        old = getattr(layer, kind.seen)
        # A fresh tensor: transformers counts decode steps into it in place.
        setattr(layer, kind.seen, torch.tensor(width, dtype=old.dtype, device=old.device)
                if isinstance(old, torch.Tensor) else width)
    return layer


def _cache_of(template: DynamicCache, layers: list) -> DynamicCache:
    cache = copy.copy(template)
    cache.layers = layers
    return cache


def left_pad(t: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """`t` widened to `width` along `dim` with zeros before it (the batch's padding columns)."""
    missing = width - t.shape[dim]
    if missing == 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([t.new_zeros(shape), t], dim=dim)
