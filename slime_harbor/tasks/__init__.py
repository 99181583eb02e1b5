"""Task sources: code that writes Harbor task dirs, and what the package reads of one.

    task_dir.py        which dirs of a tasks dir are tasks; where a task's agent works
    manifest.py        a `slime-harbor calibrate` manifest: the tasks it marks, skipped by every runner

    families.py        procedural task families with disjoint train / held-out splits
    swebench.py        SWE-bench instance records -> Harbor task dirs (`slime-harbor swebench-tasks`)
    swebench_grade.py  the verifier's grader, copied into each task: swebench's own grading, offline
    swebench_guard.py  the pytest plugin the grader loads into the tests' run (copied into each task)
    datasets.py        Harbor datasets named from a registry (NAME@VERSION), downloaded by Harbor
"""
