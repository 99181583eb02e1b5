"""TrainingSamples in tests: a made-up one for the code that reads only their scores, statuses and
metadata; checks on real ones (logprobs against a fresh forward pass, the masked and sampled spans)."""

from __future__ import annotations

import torch

from slime_harbor.episode import SCORED_STATUSES, Episode, EpisodeEnd, Segment
from slime_harbor.samples import SampleStatus, TrainingSample


def trainer_view(model_dir):
    """The model in fp32, eval mode: the trainer's view, for recomputing logprobs (read-only)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def make_sample(reward: float | None = 1.0, status: SampleStatus | str = SampleStatus.COMPLETED, group: int = 0,
                index: int = 0, *, weight_versions: list[str] = (), metadata: dict | None = None) -> TrainingSample:
    """Episode `index` of group `group` (its rollout_id too), with `reward` and `status`: a one-token
    prompt and two sampled tokens, for tests of what reads scores, statuses and metadata, not tokens."""
    return TrainingSample(tokens=[1, 2, 3], response_length=2, loss_mask=[1, 1], rollout_log_probs=[-0.1, -0.2],
                          reward=reward, status=SampleStatus(status), group_index=group, index=index, rollout_id=index,
                          weight_versions=list(weight_versions), metadata=dict(metadata or {}))


def make_episode(reward: float | None = 1.0, status: SampleStatus | str = SampleStatus.COMPLETED, group: int = 0,
                 index: int = 0, *, task_name: str = "t", segments: int = 1, exit_status: str | None = None,
                 weight_versions: list[str] = (), metadata: dict | None = None, hack_flags=None,
                 hack_action: str | None = None, reward_mapping: str = "raw") -> Episode:
    """Episode `index` of group `group` (its rollout_id too) that ended `status` with `reward` (and
    `exit_status`), of `segments` segments shaped like make_sample's, its calls' `weight_versions`
    dealt to its segments in turn, for tests of what reads the outcome, not tokens. `hack_flags`:
    its grading's flags, acted on by `hack_action` in the reward's one decision, as the converter
    makes it (reward.REWARD_RULES, `reward` taken as already mapped)."""
    from slime_harbor.reward import RewardCase, decide_reward

    status = SampleStatus(status)
    end = EpisodeEnd(status, reward if status in SCORED_STATUSES else None, exit_status, status.value)
    case = None if hack_flags is None else RewardCase(
        rewards=None, scored=end.reward is not None, mapping=reward_mapping, hack_flags=tuple(hack_flags),
        hack_action=hack_action, given=end.reward)
    decided = decide_reward(case) if case is not None else None
    metadata = {**(metadata or {}), **(decided.metadata if decided else {})}
    return Episode(task_name=task_name, group_index=group, index=index, end=end,
                   reward=decided.reward if decided else end.reward,
                   segments=[Segment(prompt_ids=[1], response_ids=[2, 3], loss_mask=[1, 1], logprobs=[-0.1, -0.2],
                                     turns=[0], weight_versions=list(weight_versions[k::segments]))
                             for k in range(segments)],
                   metadata=metadata, rollout_id=index, reward_case=case,
                   masked_by=decided.masked_by if decided and decided.reward is not None else None)


def recompute_logprobs(model, tokens: list[int], temperature: float) -> torch.Tensor:
    """log p(token_i | tokens_<i) for every position after the first, one forward pass, fp32."""
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0, :-1].float() / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(tokens[1:])[:, None])[:, 0]


def check_sample_against_model(sample, model, temperature: float) -> float:
    """Layout invariants + sampled-token logprobs equal a fresh forward pass. Returns mean abs diff."""
    sample.check()
    n = sample.response_length
    assert n == len(sample.loss_mask) == len(sample.rollout_log_probs) > 0
    assert sample.tokens[:-n] == sample.prompt_ids
    lp = recompute_logprobs(model, sample.tokens, temperature)[-n:]
    mask = torch.tensor(sample.loss_mask, dtype=torch.bool)
    rollout = torch.tensor(sample.rollout_log_probs)
    assert mask.any()
    return (lp[mask] - rollout[mask]).abs().mean().item()


def masked_spans(sample) -> list[list[int]]:
    spans, current = [], []
    for tok, m in zip(sample.response_ids, sample.loss_mask):
        if m == 0:
            current.append(tok)
        elif current:
            spans.append(current)
            current = []
    if current:
        spans.append(current)
    return spans


def call_runs(sample: TrainingSample) -> list[list[int]]:
    """Response positions of each model call, in order: the runs of loss_mask 1."""
    runs, current = [], []
    for i, m in enumerate(sample.loss_mask):
        if m:
            current.append(i)
        elif current:
            runs, current = runs + [current], []
    return runs + ([current] if current else [])


def check_trains(samples, model, temperature=1.0) -> list:
    trained = [s for s in samples if not s.remove_sample]
    assert trained, [s.metadata.get("status_reason") for s in samples]
    diffs = [check_sample_against_model(s, model, temperature) for s in trained]
    assert sum(diffs) / len(diffs) < 1e-4, diffs
    return trained


def check_token_versions(tokens: list[int], n_response: int, logprobs, spans, models: dict, bound: float = 1e-3) -> dict:
    """Every sampled token (the spans (version, start, end) over the last n_response of `tokens`)
    has the logprob its own version's weights give it (`models`: version -> model), within `bound`,
    and is farther from every other version's wherever the two versions' logprobs for it differ by
    more than `bound`. Returns {version: (tokens, max own gap, min gap
    to another version)}."""
    recomputed = {v: recompute_logprobs(m, tokens, 1.0)[-n_response:] for v, m in models.items()}
    served = torch.tensor([float(x) for x in logprobs])
    figures = {}
    for version, start, end in spans:
        if end == start:
            continue
        own = (recomputed[version][start:end] - served[start:end]).abs()
        assert own.max().item() < bound, (version, start, end, own.max().item())
        others = [(recomputed[v][start:end] - served[start:end]).abs() for v in models if v != version]
        for v, other in zip([v for v in models if v != version], others):
            # Where two versions give a token the same logprob (within the bound: a token both are
            # sure of), no logprob can tell them apart; everywhere else its own version is nearer.
            apart = (recomputed[v][start:end] - recomputed[version][start:end]).abs() > bound
            assert (other > own)[apart].all(), (version, start, end, (other - own)[apart].min().item())
        n, worst, nearest = figures.get(version, (0, 0.0, float("inf")))
        figures[version] = (n + end - start, max(worst, own.max().item()),
                            min([nearest] + [o.min().item() for o in others]))
    return figures
