"""A recording model gateway: any agent that speaks an LLM API, trained token-exact.

    agent --its API--> a dialect (chat.py, ...) --TurnRequest--> GatewayTurn (turn.py) --SGLang /generate--> policy
                              |
                              +-- GatewaySession (session.py): branches of exact tokens, calls.jsonl,
                                  rollout_details() for the converter, an ATIF trajectory

Whose parts: rendering messages to token ids, bridging to the next turn and parsing replies
(<tool_call> JSON, <think> blocks) are PyPI `renderers` (PrimeIntellect), one renderer per model
family (policy/renderer.py); the upstream call is our PolicyClient (SGLang /generate, or
vLLM-style /v1/completions); the session matching that keeps an append-only conversation ONE
sample is ours.

The dialects, on the same sessions: OpenAI Chat Completions (chat.py, most agents), Anthropic
Messages (anthropic.py, Claude Code), OpenAI Responses (responses.py, Codex) and Google Gemini
generateContent (gemini.py, gemini-cli). Each is one wire.Dialect class: it declares its routes,
translates its request into one TurnRequest and writes the reply; `Gateway.complete(request,
session, asked, dialect)` serves it as one GatewayTurn (turn.py: admission, sampling, delivery),
so rendering, branches, sampling and recording are shared.

    server.py       the HTTP server (Gateway): the agents' APIs in, token ids out; its sessions
                    and its upstream
    turn.py         one turn from admission to delivery (TurnRequest in, GatewayTurn): limits,
                    sampling, the upstream call
    session.py      one trial's conversation: branches of exact tokens, the calls, the files
    wire.py         what the dialects share: the Dialect base class, one subclass per API
    chat.py         OpenAI Chat Completions (LiteLLM, aider, OpenHands, opencode, ...)
    anthropic.py    Anthropic Messages (Claude Code)
    responses.py    OpenAI Responses (Codex)
    gemini.py       Google Gemini generateContent (gemini-cli)
"""
