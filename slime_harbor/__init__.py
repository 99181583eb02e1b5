"""slime-harbor: Harbor tasks, agents and sandboxes as the rollout of SLiME GRPO training.

The chain: tasks -> rollout (Harbor Trials) -> trajectory -> Episode -> samples -> GRPO loss -> a
trainer (docs/chain.md draws it whole). Each module and folder, in the order of the chain:

    tasks/              task sources: procedural families, SWE-bench records, Harbor datasets
    run_config.py       a run's settings, declared once (RunSettings, RolloutConfig), and their checks
    trial_setup.py      a trial's sandbox, the agent's installs before it starts, its hard timeout
    rollout.py          a GRPO group = n real Harbor Trials of one task, bounded concurrency
    retries.py          the transient-failure retry budget (RetryBudget), for every runner
    fleet.py            where each attempt runs: this process, or a Ray worker per rollout node
    agents/             every kind of agent a trial can run (native, Harbor's host and installed agents)
    gateway/            the recording model gateway every agent but native samples through
    policy/             the policy as the rollout sees it: clients, the embedded server, the engines
    environments/       the sandboxes (bubblewrap, Docker) as Harbor environments
    grading/            a trial's grading: the verifier's runtime, the grading watch, the twin, the detectors
    verifier_runtime.py what the verifier runs to grade is the image's: changes to it are found
    verifier_reward.py  what a verifier reports: its rewards dict, the scalar, tampering keys
    http_api.py         what the policy server and the gateway share (bodies, errors)
    converter.py        Harbor's trajectory -> Episode, its tokens aligned into segments
    episode.py          the episode, the one owner of its outcome (EpisodeEnd, episode_end)
    samples.py          the training sample one trajectory (or segment) becomes
    reward.py           the reward, decided in one place: one ordered list of rules
    filters.py          which episodes the loss may see (limits, staleness, no signal, hacks)
    grpo.py             group advantages and the clipped policy loss with a KL penalty
    hooks.py            SLiME's hooks: its rollout, run on our rollout core
    trainers/           the local trainer, SFT, evaluation, the demo (SLiME's is hooks.py)
    integrations/       entry points for other frameworks (the verifiers plugin prime-rl loads)
    calibrate.py        which tasks can grade a policy (gold, empty answer, blind attacks)
    canaries.py         impossible task variants mixed into training to measure hacking
    error_kinds.py      the errors table: whose each exception is, and whether its episode is retried
    exits.py            one-line errors for bad input, orderly shutdown on SIGINT and SIGTERM
    harbor_job.py       a rollout's trials dir as a Harbor job dir (`harbor view` reads it)
    cache.py            the machine's cache outside any checkout
    config_docs.py      a config field's docstring as its flag's help and the reference docs
    cli.py              the `slime-harbor` command line

The policy is served by SGLang in production and by policy/server.py (policy/tiny_model.py) here.
"""

import os

# LiteLLM (used by Harbor's terminus-2) downloads its model-cost map on import unless told to use
# the copy it ships; rollouts must not reach the internet for that.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

__version__ = "0.1.0"
