"""Sandboxes a Harbor trial runs in: Harbor `BaseEnvironment`s usable by import path.

    bubblewrap.py   BubblewrapEnvironment: the local sandbox (no Docker needed), replays the
                    task's Dockerfile (dockerfile.py) onto a per-trial root dir
"""
