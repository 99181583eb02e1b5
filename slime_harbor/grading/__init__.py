"""A trial's grading: every defence between the agent's last command and the reward.

    grade.py            one trial's grading: the stages in the order they run, one GradingReport
    isolation.py        a plain task's verifier starts clean in the agent's sandbox
    grader_watch/       the grading watch: an audit hook in every Python process of a verifier
    impossible_twin.py  a task's impossible twin, built and gold-checked once per task
    twin_grading.py     a passing trial graded again against its twin (passes_impossible)
    hack_monitor.py     the hack monitor's detectors over what the agent changed and ran
"""
