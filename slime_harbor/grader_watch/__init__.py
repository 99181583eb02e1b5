"""The grading watch (issue 46): an audit hook in every Python process of a verifier run
(runtime/sitecustomize.py, mounted into the sandbox) and its host-side report (report.py)."""
