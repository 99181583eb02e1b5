"""A sampling engine over a Hugging Face causal LM, with continuous batching.

It is the part of an SGLang server that slime-harbor needs in order to run without one: requests
submitted from any thread or event loop join one running batch and are decoded together, one
shared forward pass per step, over one cache (attention keys and values, recurrent states). A
background worker thread owns the model:

    loop:  admit queued requests (prefill them, merge their cache into the running batch)
           ->  one decode step for every running row  ->  retire the rows that finished
           (resolving their futures).

Architectures (cache_layers.py, the one table of them): attention-only models (Qwen3, Llama,
GLM-4.5, DeepSeek-V3's MLA, MiniMax-M2), sliding-window attention (gpt-oss), Gated DeltaNet linear
attention (Qwen3.5/3.6, Qwen3-Next), Mamba2 (Nemotron-H) and sparse attention with an indexer
(GLM-5). Requests of attention-only models are prefilled together, left-padded; those of a model
with recurrent layers (linear attention, Mamba) each alone, because a recurrence keeps any padding
that reaches it. A model of any other architecture, or whose cache holds a kind of layer the table
does not know, is refused at start in one line. No prefix is reused: every request is prefilled
whole (a recurrent layer's state at the end of a prefix is not kept, so one could not be).

Logprob semantics are those of SGLang and vLLM, because the trainer compares against them: the
logprob of a sampled token is log_softmax(logits / temperature) over the whole vocabulary, taken
BEFORE top-k / top-p truncation; with temperature 0 decoding is greedy and the logprob is that of
the raw logits. A trainer recomputing log_softmax(model(tokens).logits / T) in one forward pass
gets the same numbers (fp32: ~1e-6).

Top-p replay (SLiME's SGLang patch, `custom_params.return_top_p_token_ids`): the request also gets,
per output token, the ids the top-k / top-p filter kept (most likely first; the sampled token is
always among them; greedy keeps only the argmax), and its sampled tokens' logprobs are then
renormalised over that kept set, log(p_i / sum_kept p), as the patched SGLang reports them and as
SLiME's trainer recomputes them under the replayed keep-mask. A request without any filter
(top_p 1, top_k off, temperature > 0) gets no kept ids, like the patched SGLang.

Weights: `update_model(model, version)` serves `model` from the next request on and sets
`weight_version`: it admits no new request until the rows running now have finished (they wait
in the queue), then swaps, so every request is sampled entirely by one version and its
Generation says which (the version it was admitted under). `paused()` holds the engine between
steps while a trainer edits weights in place. `pause_generation()` / `continue_generation()` are
SGLang's: abort every request in flight and admit nothing until continued (a trainer updating
weights meanwhile; the callers re-issue what was aborted). Over HTTP the same is done the way
SGLang takes weights: `update_weights_from_disk(path)` (a full HF checkpoint, swapped in once
running requests have finished) and `load_lora_adapter(name, path)` /
`unload_lora_adapter(name)` (peft adapters on the served base; a request picks one by name, rows
with different adapters share a batch, and a request naming none samples the base model).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import threading
import time
import uuid
from dataclasses import dataclass, field

import torch

# The decode loop's tensors (the running batch, truncated sampling) live in decode.py.
from slime_harbor.policy import cache_layers
from slime_harbor.policy.decode import Batch, eos_token_ids, sample_tokens, Truncation
from slime_harbor.policy.sampling import Generation, SamplingParams
from slime_harbor.policy.weights import peft_quietly


def _cache_argument() -> str:
    """What a causal LM's forward calls its KV cache: `cache` in newer transformers, which warn on
    every call given `past_key_values`; `past_key_values` in older ones (requirements allow 4.51)."""
    import inspect

    from transformers.models.qwen3.modeling_qwen3 import Qwen3ForCausalLM

    return "cache" if "cache" in inspect.signature(Qwen3ForCausalLM.forward).parameters else "past_key_values"


CACHE_ARGUMENT = _cache_argument()


def position_seed(seed: int, position: int) -> int:
    """The seed of the noise a request seeded `seed` draws for the token at `position` (prompt
    included): splitmix64 of the pair, so neighbouring seeds and positions share no draws."""
    x = (seed * 0x9E3779B97F4A7C15 + position + 1) % 2**64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) % 2**64
    return (x ^ (x >> 31)) % 2**63


@dataclass
class EngineConfig:
    """How the engine runs the model."""

    device: str = "cpu"
    dtype: str = "float32"  # torch dtype name; fp32 keeps logprobs comparable to the trainer's
    max_batch_size: int = 32  # rows decoded together; later requests wait in the queue
    batch_window_s: float = 0.005  # when idle, wait this long for more arrivals before prefilling
    context_length: int | None = None  # prompt + output limit; None = max_position_embeddings
    seed: int = 0  # seeds the RNG of requests that bring no seed of their own


@dataclass
class EngineStats:
    """Counters that show what the batching did."""

    requests: int = 0
    generated_tokens: int = 0
    decode_steps: int = 0
    prefills: int = 0  # prefill forward passes: one per admission, or per request (recurrent models)
    rows_per_decode_step: collections.Counter = field(default_factory=collections.Counter)

    @property
    def max_rows_per_step(self) -> int:
        return max(self.rows_per_decode_step, default=0)


class _Request:
    """A submitted request and its decoding state (owned by the worker once admitted)."""

    def __init__(self, rid, prompt_ids, params, stop_token_ids, seed: int, lora=None):
        self.rid: str = rid
        self.lora: str | None = lora  # the LoRA adapter (by name) this request samples from; None = base
        self.prompt_ids: list[int] = prompt_ids
        self.params: SamplingParams = params
        self.stop_token_ids: frozenset[int] = stop_token_ids
        self.seed = seed
        self.generator = torch.Generator()  # reseeded per token (position_seed)
        self.future: concurrent.futures.Future[Generation] = concurrent.futures.Future()
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        # Kept ids per token, flat with offsets (Generation's layout), for requests that asked and
        # whose sampling truncates at all.
        top_p = params.return_top_p_token_ids and params.truncates
        self.top_p_token_ids: list[int] | None = [] if top_p else None
        self.top_p_token_offsets: list[int] | None = [0] if top_p else None
        self.finish_reason: str | None = None  # stop | length | abort, once finished
        self.matched_stop: int | str | None = None  # the stop token id / string that ended it
        self.abort_requested = False
        self.weight_version: int | None = None  # set when admitted: the weights that sample it
        self.submitted_at = time.monotonic()
        # Enough trailing tokens to contain any stop string: every token decodes to >= 1 byte.
        self.stop_window = max((len(s.encode()) for s in params.stop), default=0) + 2


class SamplingEngine:
    """Continuous-batching sampler. Thread-safe; use as a context manager or call close()."""

    def __init__(self, model, tokenizer, config: EngineConfig | None = None):
        self.config = config or EngineConfig()
        self.tokenizer = tokenizer
        self.device = torch.device(self.config.device)
        self.dtype = getattr(torch, self.config.dtype)
        self._prefill_together = self._batchable(model)
        self.model = self._prepare(model)
        self.context_length = self.config.context_length or self.model.config.max_position_embeddings
        self.eos_token_ids = eos_token_ids(self.model, tokenizer)
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos_token_ids)
        self.weight_version = 0
        self.stats = EngineStats()
        self._rng = torch.Generator().manual_seed(self.config.seed)
        self.lora_adapters: dict[str, str] = {}  # adapters loaded over load_lora_adapter: name -> path

        self._cond = threading.Condition()  # guards _queue, _active, _closing
        self._queue: collections.deque[_Request] = collections.deque()
        self._active: dict[str, _Request] = {}  # rid -> request, queued or running
        self._closing = False
        self._weights_lock = threading.Lock()  # held by the worker for each step
        self._pause_waiters = 0
        self._draining = 0  # update_model calls waiting for the running rows: admit nothing new
        self._generation_paused = False  # pause_generation: admit nothing until continue_generation
        self._batch = Batch()  # worker-only
        self._worker = threading.Thread(target=self._work, name="sampling-engine", daemon=True)
        self._worker.start()

    @classmethod
    def from_pretrained(cls, model_dir, config: EngineConfig | None = None) -> SamplingEngine:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        config = config or EngineConfig()
        cache_layers.check_checkpoint(model_dir)  # refused before its weights are loaded
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, config.dtype))
        return cls(model, tokenizer, config)

    # ----- public API -------------------------------------------------------------------------

    def submit(self, prompt_ids: list[int], params: SamplingParams | None = None, rid: str | None = None,
               lora: str | None = None):
        """Queue a request; returns a concurrent.futures.Future[Generation]. `lora`: the name of a
        loaded LoRA adapter to sample from (None: the base model)."""
        params = params or SamplingParams()
        prompt_ids = [int(t) for t in prompt_ids]
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        if len(prompt_ids) >= self.context_length:
            raise ValueError(
                f"the prompt has {len(prompt_ids)} tokens; this model's maximum context length is "
                f"{self.context_length} tokens"
            )
        vocab_size = self.model.get_input_embeddings().num_embeddings
        if max(prompt_ids) >= vocab_size or min(prompt_ids) < 0:
            raise ValueError(f"prompt token ids must be in [0, {vocab_size})")
        stop_ids = frozenset() if params.ignore_eos else self.eos_token_ids | frozenset(params.stop_token_ids)
        with self._cond:  # also serialises draws from the shared seed generator
            # A request that samples nothing (max_new_tokens 0: the weight check's prefill) draws no
            # seed, so it leaves the samples of every other request as they would have been.
            unseeded = params.sampling_seed is None and params.max_new_tokens > 0
            seed = int(torch.randint(2**62, (1,), generator=self._rng)) if unseeded else params.sampling_seed or 0
            request = _Request(rid or uuid.uuid4().hex, prompt_ids, params, stop_ids, seed, lora)
            if lora is not None and lora not in self.lora_adapters:
                raise ValueError(f"LoRA adapter {lora!r} is not loaded (loaded: {sorted(self.lora_adapters)})")
            if self._closing:
                raise RuntimeError("the engine is closed")
            if request.rid in self._active:
                raise ValueError(f"a request with rid {request.rid!r} is already running")
            self._active[request.rid] = request
            self.stats.requests += 1
            if params.max_new_tokens == 0:
                self._finish_unstarted(request, "length")
            else:
                self._queue.append(request)
                self._cond.notify_all()
        return request.future

    def generate(self, prompt_ids, params=None, rid=None, timeout: float | None = None) -> Generation:
        """Blocking submit-and-wait."""
        return self.submit(prompt_ids, params, rid).result(timeout)

    async def agenerate(self, prompt_ids, params=None, rid=None, lora: str | None = None) -> Generation:
        """Submit and await; cancelling the awaiting task aborts the request."""
        rid = rid or uuid.uuid4().hex
        future = self.submit(prompt_ids, params, rid, lora)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            self.abort(rid)
            raise

    def prompt_logprobs(self, prompt_ids: list[int], lora: str | None = None) -> list[float]:
        """log p(token i | tokens before it) for every token of `prompt_ids` but the first, at
        temperature 1 (raw logits), from one prefill with the weights served now: what SGLang's
        input_token_logprobs and vLLM's prompt_logprobs report, and what the weight check
        (policy/weight_check.py) compares with the trainer's. Runs between decode steps."""
        prompt_ids = [int(t) for t in prompt_ids]
        if len(prompt_ids) < 2:
            raise ValueError("prompt logprobs need at least two tokens")
        if len(prompt_ids) > self.context_length:
            raise ValueError(f"the prompt has {len(prompt_ids)} tokens; this model's maximum context length is "
                             f"{self.context_length} tokens")
        if lora is not None and lora not in self.lora_adapters:
            raise ValueError(f"LoRA adapter {lora!r} is not loaded (loaded: {sorted(self.lora_adapters)})")
        ids = torch.tensor([prompt_ids], dtype=torch.long, device=self.device)
        extra = {"adapter_names": [lora or "__base__"]} if self.lora_adapters else {}
        with self.paused(), torch.inference_mode():
            logits = self.model(**extra, input_ids=ids, use_cache=False).logits[0, :-1].float()
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, ids[0, 1:, None].cpu().to(logits.device))[:, 0]
        return logprobs.cpu().tolist()

    def abort(self, rid: str) -> bool:
        """End a queued or running request with finish_reason abort (keeping its tokens so far)."""
        with self._cond:
            request = self._active.get(rid)
            if request is None:
                return False
            self._abort_locked(request)
            return True

    def abort_all(self) -> int:
        with self._cond:
            requests = list(self._active.values())
            for request in requests:
                self._abort_locked(request)
            return len(requests)

    def num_pending(self) -> tuple[int, int]:
        """(running rows, queued requests)."""
        with self._cond:
            queued = len(self._queue)
            return len(self._active) - queued, queued

    def update_model(self, model, version: int | None = None, timeout_s: float = 600.0) -> int:
        """Serve `model` as weight version `version` (default: the current one + 1); returns it.
        Requests running now finish on the old weights and new ones wait in the queue meanwhile,
        so a request is never sampled by two versions. `model` may be the module served now
        (weights edited in place under paused(), or nothing changed): the version still advances."""
        prefill_together = self._batchable(model)
        model = self._prepare(model)
        with self._cond:
            self._draining += 1
        try:
            deadline = time.monotonic() + timeout_s
            while self.num_pending()[0]:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"requests still running after {timeout_s}s")
                time.sleep(0.002)
            with self.paused():
                self.model, self._prefill_together = model, prefill_together
                self.weight_version = self.weight_version + 1 if version is None else int(version)
                return self.weight_version
        finally:
            with self._cond:
                self._draining -= 1
                self._cond.notify_all()

    def pause_generation(self) -> int:
        """SGLang's pause_generation (mode abort): abort every request in flight (each returns with
        finish_reason abort and its tokens so far) and admit none until continue_generation;
        requests submitted meanwhile wait in the queue. Returns how many were aborted."""
        with self._cond:
            self._generation_paused = True
        return self.abort_all()

    def continue_generation(self) -> None:
        with self._cond:
            self._generation_paused = False
            self._cond.notify_all()

    def update_weights_from_disk(self, model_path: str, *, abort_all: bool = False, timeout_s: float = 600.0,
                                 version: int | None = None) -> int:
        """SGLang's update_weights_from_disk: load the HF checkpoint at `model_path` (same
        architecture) and serve it once the requests running now have finished (or abort them
        first); returns the new weight version (`version`, as SLiME passes weight_version, or the
        current one + 1). The old weights stay on any error."""
        from transformers import AutoModelForCausalLM

        if self.lora_adapters:
            raise ValueError(f"unload the LoRA adapters first: {sorted(self.lora_adapters)}")
        new = AutoModelForCausalLM.from_pretrained(model_path, dtype=self.dtype)
        if type(new.config) is not type(self.model.config) or new.config.vocab_size != self.model.config.vocab_size:
            raise ValueError(f"{model_path} is a {type(new.config).__name__} with vocab {new.config.vocab_size}; "
                             f"the engine serves a {type(self.model.config).__name__} with vocab "
                             f"{self.model.config.vocab_size}")
        if abort_all:
            self.abort_all()
        return self.update_model(new, version, timeout_s)

    def load_lora_adapter(self, name: str, path: str) -> None:
        """SGLang's load_lora_adapter: add the peft adapter at `path` under `name` (base unchanged)."""
        from peft import PeftModel

        if name in self.lora_adapters:
            raise ValueError(f"a LoRA adapter named {name!r} is already loaded")
        with self.paused(), peft_quietly():
            if isinstance(self.model, PeftModel):
                self.model.load_adapter(path, adapter_name=name)
            else:
                self.model = PeftModel.from_pretrained(self.model, path, adapter_name=name)
            self.model = self._prepare(self.model)
            self.lora_adapters[name] = str(path)

    def unload_lora_adapter(self, name: str) -> None:
        """SGLang's unload_lora_adapter; refused while a request is using the adapter."""
        if name not in self.lora_adapters:
            raise ValueError(f"LoRA adapter {name!r} is not loaded")
        with self._cond:
            users = sum(r.lora == name for r in self._active.values())
        if users:
            raise ValueError(f"LoRA adapter {name!r} is in use by {users} running request(s)")
        with self.paused():
            if len(self.lora_adapters) == 1:
                self.model = self.model.unload()  # the last adapter: back to the plain base model
            else:
                self.model.delete_adapter(name)
            del self.lora_adapters[name]

    @contextlib.contextmanager
    def paused(self):
        """Hold the engine between two steps (e.g. while editing weights in place).

        The engine runs the model as it finds it: put it back in eval() mode before releasing.
        """
        with self._cond:
            self._pause_waiters += 1
        try:
            with self._weights_lock:
                yield self
        finally:
            with self._cond:
                self._pause_waiters -= 1
                self._cond.notify_all()

    def close(self) -> None:
        """Abort everything still pending and stop the worker thread."""
        with self._cond:
            if self._closing:
                return
            self._closing = True
            for request in list(self._active.values()):
                self._abort_locked(request)
            self._cond.notify_all()
        self._worker.join()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ----- worker -----------------------------------------------------------------------------

    def _prepare(self, model):
        return model.to(device=self.device, dtype=self.dtype).eval()

    @staticmethod
    def _batchable(model) -> bool:
        """Whether requests of `model` may be prefilled together, left-padded (else each alone:
        cache_layers.LayerKind.padded_prefill); ConfigError (one line) for a model the engine
        cannot batch at all."""
        return all(kind.padded_prefill for kind in cache_layers.layer_kinds(model.config))

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._closing and not (self._queue and self._admitting()) and not self._batch.rows:
                    self._cond.wait()
                if self._closing and not self._batch.rows:
                    return
                idle = not self._batch.rows
            if idle and self.config.batch_window_s > 0:
                time.sleep(self.config.batch_window_s)  # let simultaneous arrivals share a prefill
            while self._pause_waiters:  # the lock is not fair: step aside for a waiting trainer
                time.sleep(0.001)
            with self._weights_lock:
                try:
                    self._step()
                except Exception as error:  # a failed forward pass must not hang the callers
                    self._fail_running(error)

    def _admitting(self) -> bool:
        """Whether queued requests may start (under self._cond): not while a weight update waits
        for the running rows, nor while generation is paused."""
        return not self._draining and not self._generation_paused

    def _step(self) -> None:
        with self._cond:
            room = self.config.max_batch_size - len(self._batch.rows) if self._admitting() else 0
            admitted = [self._queue.popleft() for _ in range(min(room, len(self._queue)))]
            for request in admitted:
                request.weight_version = self.weight_version
        with torch.inference_mode():
            if admitted:
                self._admit(admitted)
            self._retire()
            if self._batch.rows:
                self._decode_step()
                self._retire()

    def _admit(self, requests: list[_Request]) -> None:
        """Prefill `requests` (together, or each alone for a model with recurrent layers) and merge
        them into the running batch."""
        for group in [requests] if self._prefill_together else [[r] for r in requests]:
            self._batch.rows_pending_prefill = requests  # a failed prefill fails them with the running rows
            self._batch = self._batch.merge(self._prefill(group))  # a new Batch: none pending

    def _prefill(self, requests: list[_Request]) -> Batch:
        """One forward pass over the prompts of `requests`, left-padded; their first tokens sampled."""
        width = max(len(r.prompt_ids) for r in requests)
        input_ids = torch.full((len(requests), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(requests), width), dtype=torch.long)
        for i, request in enumerate(requests):
            input_ids[i, width - len(request.prompt_ids) :] = torch.tensor(request.prompt_ids)
            mask[i, width - len(request.prompt_ids) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        logits, cache = self._forward(input_ids, mask, positions, None, requests)
        self.stats.prefills += 1
        cache_layers.zero_padding(cache, mask)
        new = Batch(requests, cache, mask, positions[:, -1] + 1)
        self._sample(new, logits)
        return new

    def _decode_step(self) -> None:
        batch = self._batch
        rows = len(batch.rows)
        mask = torch.cat([batch.mask, torch.ones((rows, 1), dtype=torch.long)], dim=1)
        last = torch.tensor([r.token_ids[-1] for r in batch.rows], dtype=torch.long)[:, None]
        logits, cache = self._forward(last, mask, batch.next_pos[:, None], batch.cache, batch.rows)
        batch.cache, batch.mask, batch.next_pos = cache, mask, batch.next_pos + 1
        self.stats.decode_steps += 1
        self.stats.rows_per_decode_step[rows] += 1
        self._sample(batch, logits)

    def _forward(self, input_ids, mask, positions, past, rows):
        # Adapters loaded over HTTP: each row runs with its own (peft mixed-adapter batch).
        extra = {"adapter_names": [r.lora or "__base__" for r in rows]} if self.lora_adapters else {}
        out = self.model(
            **extra,
            input_ids=input_ids.to(self.device),
            attention_mask=mask.to(self.device),
            position_ids=positions.to(self.device),
            **{CACHE_ARGUMENT: past if past is not None else cache_layers.new_cache(self.model.config)},
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1, :].float().cpu(), out[CACHE_ARGUMENT]

    def _sample(self, batch: Batch, logits: torch.Tensor) -> None:
        """Pick each row's next token, record its logprob, and decide whether the row is done."""
        rows = batch.rows
        temperatures = torch.tensor([r.params.temperature for r in rows], dtype=torch.float32)
        greedy = temperatures == 0
        scaled = logits / torch.where(greedy, torch.ones_like(temperatures), temperatures)[:, None]
        logprobs = torch.log_softmax(scaled, dim=-1)  # reported: before any truncation
        # Each row draws its noise from its own generator, seeded by the request's seed and the
        # token's position (as SGLang's multinomial_with_seed keys it): a seeded request's draws
        # depend neither on what else shares the batch nor on where a request begins, so a call
        # continued from its kept tokens (policy/client.py) draws what it would have drawn.
        exponentials = torch.empty_like(logprobs)
        for i, request in enumerate(rows):
            position = len(request.prompt_ids) + len(request.token_ids)
            request.generator.manual_seed(position_seed(request.seed, position))
            exponentials[i].exponential_(generator=request.generator)
        top_k = torch.tensor([r.params.top_k for r in rows], dtype=torch.long)
        top_p = torch.tensor([r.params.top_p for r in rows], dtype=torch.float32)
        truncation = Truncation(logprobs, top_k, top_p)
        tokens = sample_tokens(logprobs, exponentials, truncation)
        tokens = torch.where(greedy, logprobs.argmax(-1), tokens)
        token_logprobs = logprobs.gather(-1, tokens[:, None])[:, 0].tolist()
        for i, (request, token) in enumerate(zip(rows, tokens.tolist(), strict=True)):
            if request.top_p_token_ids is not None:
                if request.params.temperature == 0:
                    kept = [token]  # greedy keeps the argmax alone; its logprob stays the raw one
                else:
                    kept_ids = truncation.kept(i)
                    kept = kept_ids.tolist()
                    token_logprobs[i] -= float(torch.logsumexp(logprobs[i, kept_ids], dim=-1))
                request.top_p_token_ids.extend(kept)
                request.top_p_token_offsets.append(len(request.top_p_token_ids))
            request.token_ids.append(token)
            request.logprobs.append(token_logprobs[i])
            self._check_finished(request)
        self.stats.generated_tokens += len(rows)

    def _check_finished(self, request: _Request) -> None:
        """Set the request's finish_reason (and matched_stop) if its last token ends it."""
        token = request.token_ids[-1]
        # A stop token at the last allowed position still ends the turn: report stop, not length.
        if token in request.stop_token_ids:
            request.finish_reason, request.matched_stop = "stop", token
            return
        if request.params.stop:
            tail = self.tokenizer.decode(request.token_ids[-request.stop_window :], skip_special_tokens=False)
            for stop in request.params.stop:
                if stop in tail:
                    request.finish_reason, request.matched_stop = "stop", stop
                    return
        if (len(request.token_ids) >= request.params.max_new_tokens
                or len(request.prompt_ids) + len(request.token_ids) >= self.context_length):
            request.finish_reason = "length"

    def _retire(self) -> None:
        """Resolve finished or aborted rows and drop them from the batch."""
        batch = self._batch
        with self._cond:
            for request in batch.rows:
                if request.abort_requested and request.finish_reason is None:
                    request.finish_reason = "abort"
        keep = [i for i, r in enumerate(batch.rows) if r.finish_reason is None]
        if len(keep) == len(batch.rows):
            return
        for request in batch.rows:
            if request.finish_reason is not None:
                self._resolve(request)
        self._batch = batch.select(keep)

    def _resolve(self, request: _Request) -> None:
        generation = self._generation(request, self._text(request), time.monotonic() - request.submitted_at)
        with self._cond:
            self._active.pop(request.rid, None)
        if not request.future.done():
            request.future.set_result(generation)

    def _generation(self, request: _Request, text: str, latency_s: float) -> Generation:
        """The finished request as a Generation (its own copies of the lists)."""
        top_p = request.top_p_token_ids is not None
        return Generation(
            token_ids=list(request.token_ids),
            logprobs=list(request.logprobs),
            text=text,
            finish_reason=request.finish_reason,
            rid=request.rid,
            matched_stop=request.matched_stop,
            # The weights that sampled it: the engine's version when it was admitted.
            weight_version=str(self.weight_version if request.weight_version is None else request.weight_version),
            top_p_token_ids=list(request.top_p_token_ids) if top_p else None,
            top_p_token_offsets=list(request.top_p_token_offsets) if top_p else None,
            prompt_ids=request.prompt_ids,
            latency_s=latency_s,
        )

    def _text(self, request: _Request) -> str:
        params, matched, ids = request.params, request.matched_stop, request.token_ids
        stopped = request.finish_reason == "stop" and not params.no_stop_trim
        if stopped and isinstance(matched, int):
            ids = ids[:-1]
        text = self.tokenizer.decode(
            ids,
            skip_special_tokens=params.skip_special_tokens,
            spaces_between_special_tokens=params.spaces_between_special_tokens,
        )
        if stopped and isinstance(matched, str):
            cut = text.find(matched)
            text = text[:cut] if cut >= 0 else text
        return text

    def _abort_locked(self, request: _Request) -> None:
        """Abort under self._cond: a queued request ends now, a running one at the next step."""
        if request in self._queue:
            self._queue.remove(request)
            self._finish_unstarted(request, "abort")
        else:
            request.abort_requested = True

    def _finish_unstarted(self, request: _Request, reason: str) -> None:
        request.finish_reason = reason
        self._active.pop(request.rid, None)
        request.future.set_result(self._generation(request, "", 0.0))

    def _fail_running(self, error: Exception) -> None:
        failed = self._batch.rows + self._batch.rows_pending_prefill
        self._batch = Batch()
        with self._cond:
            for request in failed:
                self._active.pop(request.rid, None)
        for request in failed:
            if not request.future.done():
                request.future.set_exception(error)


