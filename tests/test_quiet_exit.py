"""A process that used the SLiME hook with a gateway agent (terminus-2: our gateway's client
session and litellm's) exits quietly: no "Unclosed client session", no shutdown traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_a_process_that_used_the_hook_exits_quietly(tmp_path, policy_server, tiny_model_dir):
    proc = subprocess.run([sys.executable, str(Path(__file__).parent / "hook_process.py"), policy_server,
                           str(tiny_model_dir), str(tmp_path / "trials"), "terminus-2"],
                          capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0 and "statuses" in proc.stdout, proc.stderr[-3000:]
    for noise in ("Unclosed", "Traceback", "Exception ignored"):
        assert noise not in proc.stderr, proc.stderr[-3000:]
