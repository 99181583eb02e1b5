"""The grading watch (issue 46): an audit hook in every Python process of a verifier run and its
host-side report.

    runtime/        what runs inside the sandbox: sitecustomize.py, the audit hook (stdlib only),
                    loaded from a read-only dir of ours
    report.py       the host side: the channel the hook reports on, and what its records say
    verifier.py     one trial's verifier run with the hook; what it saw of the agent's code becomes
                    the hack flag reads_grader (watched / unwatched counts)
"""
