"""Task sources: code that writes Harbor task dirs, and what the package reads of one.

    task_dir.py        which dirs of a tasks dir are tasks; where a task's agent works

    families.py        procedural task families with disjoint train / held-out splits
    swebench.py        SWE-bench instance records -> Harbor task dirs (`slime-harbor swebench-tasks`)
    swebench_grade.py  the verifier's grader, copied into each task: swebench's own grading, offline
    datasets.py        Harbor datasets named from a registry (NAME@VERSION), downloaded by Harbor
"""
