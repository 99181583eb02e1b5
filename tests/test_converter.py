"""Converter: turn alignment, masking, drift splitting and status classification.

Uses Harbor's real TrialResult / AgentContext models; the token streams are hand-built so every
expected value is known exactly."""

import pytest

from slime_harbor.converter import split_into_segments, trial_to_episode
from slime_harbor.episode import episode_end
from slime_harbor.samples import SampleStatus, TrainingSample, read_jsonl, write_jsonl
from helpers.trial_results import C0, C1, L0, L1, linear_detail, make_result, OBS0, P0


def test_linear_episode_is_one_sample_with_observations_masked():
    segments, drift = split_into_segments(linear_detail())
    assert drift == 0 and len(segments) == 1
    seg = segments[0]
    assert seg.prompt_ids == P0
    assert seg.response_ids == C0 + OBS0 + C1
    assert seg.loss_mask == [1, 1, 0, 0, 0, 1]
    assert seg.logprobs == L0 + [0.0, 0.0, 0.0] + L1


def test_drift_splits_into_samples_sharing_rollout_id():
    detail = linear_detail()
    # Turn 1's prompt re-tokenized the first completion differently ([10, 11] -> [77]).
    detail["prompt_token_ids"][1] = P0 + [77] + OBS0
    samples = trial_to_episode(make_result(detail, {"reward": 1.0}), group_index=0, index=5).samples
    assert len(samples) == 2
    assert {s.rollout_id for s in samples} == {5}
    assert samples[0].tokens == P0 + C0 and samples[0].loss_mask == [1, 1]
    assert samples[1].tokens == P0 + [77] + OBS0 + C1 and samples[1].response_length == 1
    assert all(s.metadata["drift_count"] == 1 for s in samples)
    for s in samples:
        s.check()


def test_an_agents_own_rollout_details_train_when_its_gateway_session_saw_no_call(tmp_path):
    """An agent that samples the policy itself and fills Harbor's rollout_details (terminus-2 with
    collect_rollout_details, a user's agent) was handed a gateway session it never called: its own
    record is the episode's tokens, drift split as before. A session with calls owns the tokens."""
    from slime_harbor.gateway.session import GatewaySession
    from slime_harbor.policy.sampling import SamplingParams

    detail = linear_detail()
    detail["prompt_token_ids"][1] = P0 + [77] + OBS0
    unused = GatewaySession(None, "unused", tmp_path / "gw", SamplingParams(), None, None, 4096, api_key="unused")
    samples = trial_to_episode(make_result(detail, {"reward": 1.0}), group_index=0, index=5, recorded=unused).samples
    assert len(samples) == 2 and not any(s.remove_sample for s in samples)
    assert samples[0].tokens == P0 + C0 and samples[1].tokens == P0 + [77] + OBS0 + C1
    assert all(s.metadata["drift_count"] == 1 and s.metadata["gateway"]["calls"] == 0 for s in samples)


def test_mismatched_logprobs_are_rejected():
    detail = linear_detail()
    detail["logprobs"][0] = [-0.1]
    with pytest.raises(ValueError, match="logprobs"):
        split_into_segments(detail)


@pytest.mark.parametrize(
    "kwargs, status, removed",
    [
        (dict(rewards={"reward": 1.0}), SampleStatus.COMPLETED, False),
        (dict(rewards={"reward": 0.0}, exit_status="step_limit"), SampleStatus.TRUNCATED, False),
        (dict(rewards={"reward": 0.0}, exc_type="AgentTimeoutError"), SampleStatus.TRUNCATED, False),
        (dict(rewards=None, exc_type="RewardFileNotFoundError"), SampleStatus.FAILED, True),
        (dict(rewards=None, exc_type="PolicyServerError"), SampleStatus.ABORTED, True),
        (dict(rewards=None, exc_type="CancelledError"), SampleStatus.ABORTED, True),
        (dict(rewards={"reward": 1.0}, exit_status="aborted"), SampleStatus.ABORTED, True),
        # Permanent: an image that does not build fails the same way every time (never retried).
        (dict(rewards=None, exc_type="SandboxBuildFailedError"), SampleStatus.FAILED, True),
        (dict(rewards=None, exc_type="DockerfileError"), SampleStatus.FAILED, True),
    ],
)
def test_status_and_removal(kwargs, status, removed):
    samples = trial_to_episode(make_result(linear_detail(), **kwargs), group_index=0, index=0).samples
    assert samples[0].status == status
    assert samples[0].remove_sample is removed
    if removed:
        # Infra failures never carry a reward that could be trained as a penalty.
        assert samples[0].reward is None
    else:
        assert samples[0].reward == kwargs["rewards"]["reward"]


def test_a_limit_the_gateway_enforced_truncates_unless_the_agent_says_otherwise():
    """The gateway's step or context limit (its session's exit_reason) is the episode's exit where
    the agent reports no limit of its own: verified, scored, truncated. An agent's own abort or
    limit is never overwritten by it: an aborted episode stays aborted and unscored."""
    for limit in ("step_limit", "context_exceeded"):
        ended = episode_end(make_result(linear_detail(), {"reward": 1.0}), gateway_exit=limit)
        assert (ended.status, ended.reward, ended.exit_status) == (SampleStatus.TRUNCATED, 1.0, limit)
    aborted = episode_end(make_result(linear_detail(), {"reward": 1.0}, exit_status="aborted"), gateway_exit="step_limit")
    assert (aborted.status, aborted.reward, aborted.exit_status) == (SampleStatus.ABORTED, None, "aborted")
    own = episode_end(make_result(linear_detail(), {"reward": 0.0}, exit_status="context_exceeded"),
                      gateway_exit="step_limit")
    assert (own.status, own.reward, own.exit_status) == (SampleStatus.TRUNCATED, 0.0, "context_exceeded")
    plain = episode_end(make_result(linear_detail(), {"reward": 1.0}), gateway_exit=None)
    assert (plain.status, plain.reward, plain.exit_status) == (SampleStatus.COMPLETED, 1.0, "submitted")


def test_reward_mapping_and_multi_key_rewards():
    result = make_result(linear_detail(), {"reward": 0.0})
    assert trial_to_episode(result, reward_mapping="pm1").samples[0].reward == -1.0
    assert episode_end(make_result(linear_detail(), {"a": 1.0, "b": 0.0})).reward == 0.5
    with pytest.raises(ValueError):
        trial_to_episode(result, reward_mapping="bogus").samples


def test_agent_without_tokens_reports_reward_but_is_not_trained():
    samples = trial_to_episode(make_result(None, {"reward": 1.0}), group_index=1, index=4).samples
    assert len(samples) == 1
    s = samples[0]
    assert s.reward == 1.0 and s.status == SampleStatus.COMPLETED and s.remove_sample
    assert s.tokens == [] and s.response_length == 0


def test_jsonl_round_trip(tmp_path):
    samples = trial_to_episode(make_result(linear_detail(), {"reward": 1.0}), group_index=0, index=0).samples
    write_jsonl(tmp_path / "s.jsonl", samples)
    back = read_jsonl(tmp_path / "s.jsonl")
    assert back == samples
    assert isinstance(back[0], TrainingSample) and back[0].status is SampleStatus.COMPLETED


# Top-p replay, per turn as the native agent records it: flat kept ids and len(completion) + 1 offsets.
K0_IDS, K0_OFF = [10, 5, 11], [0, 2, 3]  # token 10 kept {10, 5}; token 11 kept {11}
K1_IDS, K1_OFF = [7, 12, 8], [0, 3]  # token 12 kept {7, 12, 8}


def top_p_detail():
    detail = linear_detail()
    detail["extra"] = {"top_p_token_ids": [K0_IDS, K1_IDS], "top_p_token_offsets": [K0_OFF, K1_OFF],
                       "weight_version": [3, "4"]}  # the engine's int, SLiME's string: both kept as strings
    return detail


def test_top_p_sets_span_the_response_with_empty_sets_for_observations():
    (s,) = trial_to_episode(make_result(top_p_detail(), {"reward": 1.0}), index=0).samples
    s.check()
    assert s.rollout_top_p_token_ids == K0_IDS + K1_IDS
    # C0 (2 sampled) | OBS0 (3 masked: offset repeats) | C1 (1 sampled)
    assert s.rollout_top_p_token_offsets == [0, 2, 3, 3, 3, 3, 6]
    (plain,) = trial_to_episode(make_result(linear_detail(), {"reward": 1.0}), index=0).samples
    assert plain.rollout_top_p_token_ids is None and plain.rollout_top_p_token_offsets is None
    assert s.weight_versions == ["3", "4"] and plain.weight_versions == []  # no versions reported: none


def test_top_p_drift_pieces_each_start_at_offset_zero():
    detail = top_p_detail()
    detail["prompt_token_ids"][1] = P0 + [77] + OBS0
    first, second = trial_to_episode(make_result(detail, {"reward": 1.0}), index=0).samples
    assert (first.rollout_top_p_token_ids, first.rollout_top_p_token_offsets) == (K0_IDS, K0_OFF)
    assert (second.rollout_top_p_token_ids, second.rollout_top_p_token_offsets) == (K1_IDS, K1_OFF)
    first.check()
    second.check()


def test_a_turn_without_top_p_data_leaves_the_episode_without_it_and_bad_offsets_raise():
    detail = top_p_detail()
    detail["extra"]["top_p_token_ids"][1] = detail["extra"]["top_p_token_offsets"][1] = None
    (s,) = trial_to_episode(make_result(detail, {"reward": 1.0}), index=0).samples
    assert s.rollout_top_p_token_offsets is None
    detail = top_p_detail()
    detail["extra"]["top_p_token_offsets"][0] = [0, 2]  # one offset short
    with pytest.raises(ValueError, match="top-p offsets"):
        split_into_segments(detail)


@pytest.mark.parametrize(
    "ids, offsets, message",
    [
        (K0_IDS + K1_IDS, [0, 2, 3, 3, 3, 6], "top-p layout"),  # one offset short
        (K0_IDS + K1_IDS, [0, 2, 3, 3, 3, 3, 5], "top-p layout"),  # does not end at len(ids)
        (K0_IDS + K1_IDS, [0, 2, 3, 4, 4, 4, 6], "masked response token 2"),  # observation keeps an id
        ([5, 11] + K1_IDS, [0, 1, 2, 2, 2, 2, 5], "sampled response token 0"),  # sampled id not kept
        (K0_IDS + K1_IDS, None, "both"),
    ],
)
def test_check_rejects_a_broken_top_p_layout(ids, offsets, message):
    (s,) = trial_to_episode(make_result(top_p_detail(), {"reward": 1.0}), index=0).samples
    s.rollout_top_p_token_ids, s.rollout_top_p_token_offsets = ids, offsets
    with pytest.raises(ValueError, match=message):
        s.check()


def test_to_slime_carries_top_p_and_the_response_text(tokenizer):
    types = pytest.importorskip("slime.utils.types", reason="slime is not importable (PYTHONPATH=/work/slime)")
    (s,) = trial_to_episode(make_result(top_p_detail(), {"reward": 1.0}), index=0).samples
    assert s.response == ""  # no tokenizer given, none named by the trial's agent
    out = s.to_slime(tokenizer=tokenizer)
    assert out.rollout_top_p_token_ids == K0_IDS + K1_IDS
    assert list(out.rollout_top_p_token_offsets) == [0, 2, 3, 3, 3, 3, 6]
    assert out.response == tokenizer.decode(C0 + OBS0 + C1)
    out._validate_response_metadata_lengths()  # SLiME's own layout check
    assert out.weight_versions == ["3", "4"]  # one per model call, as SLiME's generate appends them
    round_trip = TrainingSample.from_dict(s.to_dict())
    assert round_trip.rollout_top_p_token_offsets == s.rollout_top_p_token_offsets
    assert round_trip.weight_versions == ["3", "4"]


def test_the_agents_tokenizer_decodes_when_the_caller_gives_none(tiny_model_dir, tokenizer):
    from harbor.models.trial.config import AgentConfig

    result = make_result(linear_detail(), {"reward": 1.0})
    result.config.agent = AgentConfig(import_path="slime_harbor.agents.native:NativeAgent",
                                      kwargs={"tokenizer_path": str(tiny_model_dir)})
    (s,) = trial_to_episode(result, index=0).samples
    assert s.response == tokenizer.decode(C0 + OBS0 + C1) and s.prompt == tokenizer.decode(P0)


def test_terminus2s_end_is_read_by_its_module_where_it_says_nothing():
    """terminus-2 reports no exit status: agents/host.report_exit_status reads it (max_turns used:
    step_limit) into the metadata every agent reports it in, and the converter ends the episode
    there, truncated; a host agent that says how it ended is left as it said."""
    from harbor.models.trial.config import AgentConfig

    from slime_harbor.agents.host import report_exit_status

    result = make_result(rewards={"reward": 0.0}, exit_status=None)
    result.agent_info.name = "terminus-2"
    result.config.agent = AgentConfig(name="terminus-2", kwargs={"max_turns": 2})
    result.agent_result.metadata["n_episodes"] = 2
    assert episode_end(result).status == SampleStatus.COMPLETED  # unread, it looks finished
    report_exit_status(result)
    ended = episode_end(result)
    assert (ended.status, ended.exit_status) == (SampleStatus.TRUNCATED, "step_limit")
    said = make_result(rewards={"reward": 0.0}, exit_status="submitted")
    said.agent_info.name = "terminus-2"
    report_exit_status(said)
    assert episode_end(said).exit_status == "submitted"
