"""Sandboxes a Harbor trial runs in: Harbor `BaseEnvironment`s usable by import path.

    bubblewrap.py   BubblewrapEnvironment: the local sandbox (no Docker needed), replays the
                    task's Dockerfile (dockerfile.py) onto a per-trial root dir
    bubblewrap_files.py  files into and out of it: the Dockerfile's build steps replayed, Harbor's
                    upload and download
    bubblewrap_host.py  what it does on the host: per-trial dirs (swept when their owner died),
                    the root skeleton, finding and signalling the agent's processes
    docker.py       DockerEnvironment: one container per trial on the Docker Engine API; images
                    built once per task; execs through an in-container shell server (docker_exec.py)
    docker_exec.py  commands in a running container without a process or API call per command
    docker_images.py  the Docker daemon's side: the client, which run owns a container (and the
                    sweep of a dead run's), task images built once per content hash, tool layers
    abilities.py    what our sandboxes can do beyond Harbor's BaseEnvironment (install agents first,
                    end the agent's processes, report its changes from the host, keep its state),
                    declared as classes a sandbox inherits; Sandbox, their shared base and kwargs
    agent_changes.py  what the agent changed, read from the host (each sandbox's side; where a
                    sandbox keeps its files is its own declaration)
    common.py       what both share: a command's result and timeout error, who is root, owner
                    stamps, tar archives, network rule
    dockerfile.py   the one Dockerfile reader: the recipe bubblewrap replays, and the FROM line
                    that docker_images.py rebuilds on and tasks/swebench.py inserts its grader after
    gateway_reach.py  what both use to let a no-network sandbox reach the model gateway (and only
                    it) at 127.0.0.1:<gateway_port>
    watch_dir.py    where the grading watch's files live on the host, one dir per sandbox, bound
                    read-only inside it
"""
