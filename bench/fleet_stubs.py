"""The fleet-scale bench's stand-ins (bench/fleet_scale.py; this folder on the import path of the
rollout process and its Ray workers), each named as a stub, so that the bench measures the control
plane (runner, fleet, gateway, grading, conversion) and not a model or a container:

    StubEngine          SGLang's /generate (and what a probe asks) with a fixed latency per token,
                        the same reply every call; its own process (stub_engine_main)
    StubSandbox         a Harbor environment that runs commands as host processes in a temp dir,
                        the sandbox's /logs, /tests, /app ... mapped under it: no container, no
                        isolation (never for a policy's commands)
    ScriptedGatewayAgent  a host-side agent of `turns` chat calls through its trial's gateway session
                        (its key sent as the bearer token), one command in the sandbox after each
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from pathlib import Path

from harbor.agents.base import BaseAgent
from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.models.agent.context import AgentContext

REPLY = "Listing the files.<|im_end|>"
SANDBOX_ROOTS = ("/logs", "/tests", "/solution", "/app", "/installed-agent", "/tmp/harbor")
"""The sandbox paths Harbor and the tasks use; the stub maps each under its own dir."""


# ---- the engine -------------------------------------------------------------------------------

def stub_engine_main(model_dir: str, port: int, ms_per_token: float) -> None:
    """Serve the stub engine on 127.0.0.1:port until killed."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route
    from transformers import AutoTokenizer

    reply_ids = AutoTokenizer.from_pretrained(model_dir).encode(REPLY, add_special_tokens=False)
    delay = ms_per_token * len(reply_ids) / 1000

    async def generate(request: Request) -> JSONResponse:
        body = await request.json()
        await asyncio.sleep(delay)
        meta = {"id": body.get("rid"), "finish_reason": {"type": "stop", "matched": reply_ids[-1]},
                "prompt_tokens": len(body.get("input_ids") or []), "completion_tokens": len(reply_ids),
                "cached_tokens": 0, "weight_version": "0", "e2e_latency": delay,
                "output_token_logprobs": [[-0.5, t, None] for t in reply_ids]}
        return JSONResponse({"text": REPLY, "output_ids": reply_ids, "meta_info": meta})

    async def server_info(request: Request) -> JSONResponse:
        return JSONResponse({"engine": "stub-engine", "max_total_num_tokens": 1 << 20, "weight_version": "0"})

    async def model_info(request: Request) -> JSONResponse:
        return JSONResponse({"model_path": model_dir, "weight_version": "0"})

    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": "policy", "object": "model", "max_model_len": 32768}]})

    async def ok(request: Request) -> JSONResponse:
        return JSONResponse({})

    app = Starlette(routes=[Route("/generate", generate, methods=["POST"]),
                            Route("/server_info", server_info), Route("/get_server_info", server_info),
                            Route("/model_info", model_info), Route("/get_model_info", model_info),
                            Route("/v1/models", models), Route("/health", ok),
                            Route("/abort_request", ok, methods=["POST"])])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


# ---- the sandbox ------------------------------------------------------------------------------

class StubSandbox(BaseEnvironment):
    """Commands run as host processes under a temp dir (see the module docstring): a stub."""

    @staticmethod
    def type() -> str:
        return "stub-sandbox"

    def _validate_definition(self):
        pass

    def _host(self, path: str) -> str:
        for root in SANDBOX_ROOTS:
            if path == root or path.startswith(root + "/"):
                return str(self.root) + path
        return path

    def _mapped(self, command: str) -> str:
        """The command with each sandbox path (one of SANDBOX_ROOTS, not inside a longer path) under the dir."""
        import re

        roots = "|".join(re.escape(root) for root in SANDBOX_ROOTS)
        return re.sub(rf"(?<![\w./-])({roots})(?=[/\s'\";)]|$)", lambda m: f"{self.root}{m.group(1)}", command)

    async def start(self, force_build: bool) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="fleet-stub-"))
        for root in SANDBOX_ROOTS:
            (self.root / root.lstrip("/")).mkdir(parents=True, exist_ok=True)
        for sub in ("agent", "verifier", "artifacts"):
            (self.root / "logs" / sub).mkdir(parents=True, exist_ok=True)

    async def stop(self, delete: bool):
        shutil.rmtree(getattr(self, "root", ""), ignore_errors=True)

    async def upload_file(self, source_path, target_path: str):
        Path(self._host(target_path)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source_path, self._host(target_path))

    async def upload_dir(self, source_dir, target_dir: str):
        shutil.copytree(source_dir, self._host(target_dir), dirs_exist_ok=True)

    async def download_file(self, source_path: str, target_path):
        Path(target_path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(self._host(source_path), target_path)

    async def download_dir(self, source_dir: str, target_dir):
        if Path(self._host(source_dir)).is_dir():
            shutil.copytree(self._host(source_dir), target_dir, dirs_exist_ok=True)

    async def exec(self, command: str, cwd: str | None = None, env: dict[str, str] | None = None,
                   timeout_sec: int | None = None, user=None) -> ExecResult:
        proc = await asyncio.create_subprocess_shell(
            self._mapped(command), cwd=self._host(cwd) if cwd else str(self.root / "app"),
            env={**os.environ, **(env or {}), "STUB_ROOT": str(self.root)}, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), timeout_sec)
        return ExecResult(stdout=out.decode(errors="replace"), stderr=err.decode(errors="replace"),
                          return_code=proc.returncode)


# ---- the agent --------------------------------------------------------------------------------

class ScriptedGatewayAgent(BaseAgent):
    """`turns` chat calls through the trial's gateway session, one sandbox command after each."""

    def __init__(self, logs_dir, model_name: str | None = None, api_base: str | None = None,
                 api_key: str | None = None, turns: int = 3, **kwargs):
        super().__init__(logs_dir, model_name=model_name, **kwargs)
        self.api_base, self.api_key, self.turns = api_base, api_key, turns

    @staticmethod
    def name() -> str:
        return "scripted-gateway-agent"

    def version(self) -> str | None:
        return "0"

    async def setup(self, environment: BaseEnvironment) -> None:
        pass

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext) -> None:
        import httpx

        import json
        import time

        messages = [{"role": "user", "content": instruction}]
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        seen = []  # each call's time as this agent sees it (the bench subtracts the stub's own delay)
        async with httpx.AsyncClient(timeout=600) as http:
            for turn in range(self.turns):
                t = time.perf_counter()
                reply = await http.post(self.api_base + "/chat/completions", headers=headers,
                                        json={"model": "policy", "messages": messages, "max_tokens": 16})
                seen.append(time.perf_counter() - t)
                reply.raise_for_status()
                content = reply.json()["choices"][0]["message"]["content"] or ""
                result = await environment.exec(f"echo turn {turn}")
                messages += [{"role": "assistant", "content": content},
                             {"role": "user", "content": result.stdout.strip() or "ok"}]
        (Path(self.logs_dir) / "call_seconds.json").write_text(json.dumps(seen))
        context.metadata = {"exit_status": "submitted"}
