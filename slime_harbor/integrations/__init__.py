"""Entry points for other trainers' frameworks (verifiers / prime-rl).

    verifiers_env.py    slime-harbor as a verifiers v1 environment: the plugin prime-rl's
                        orchestrator (and `vf-eval`) loads
    verifiers_trace.py  our episode of one Harbor trial -> a verifiers v1 Trace, the form prime-rl
                        trains on
"""
