"""One SLiME `generate` call in a process of its own (tests/test_quiet_exit.py reads its stderr).

argv: policy URL, model dir, trials dir, agent."""

import asyncio
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).parent))
from helpers.slime import SampleLike  # noqa: E402

from slime_harbor import hooks  # noqa: E402
from slime_harbor.run_config import DEFAULT_TASKS  # noqa: E402

url, model, trials, agent = sys.argv[1:5]
host, port = url.removeprefix("http://").split(":")
args = SimpleNamespace(sglang_router_ip=host, sglang_router_port=int(port), hf_checkpoint=model,
                       harbor_agent=agent, harbor_step_limit=2, harbor_trials_dir=trials)
task = DEFAULT_TASKS / "dedupe-lines"
sample = SampleLike(group_index=0, index=1, prompt="p", label=task.name, metadata={"task_dir": str(task)})
out = asyncio.run(hooks.generate(args, sample, {"temperature": 1.0, "max_new_tokens": 32}))
print("statuses", [s.status.value for s in out])
