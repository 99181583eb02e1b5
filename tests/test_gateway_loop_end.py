"""A loop's shared gateway (the SLiME hook's, one per process and event loop) is closed when that
loop ends under asyncio.run, in the loop itself: its port is freed and nothing is left for the
interpreter's exit to collect unclosed."""

from __future__ import annotations

import asyncio

from helpers.rollout import config
from helpers.servers import port_is_free

from slime_harbor import rollout as rollout_module


def test_a_shared_gateway_is_closed_when_its_loop_ends(tmp_path, policy_server, tiny_model_dir):
    cfg = config(tmp_path, policy_server, tiny_model_dir, n_samples=1)

    async def use_the_gateway():
        gateway = await rollout_module.shared_gateway(cfg)
        return gateway, asyncio.get_running_loop()

    gateway, loop = asyncio.run(use_the_gateway())  # no close_shared_gateways: the loop's end does it
    assert loop not in rollout_module._SHARED_GATEWAYS and loop not in rollout_module._LOOP_ENDS
    assert port_is_free(gateway.port)
    assert gateway.upstream._session is None or gateway.upstream._session.closed
