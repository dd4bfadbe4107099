"""The twelve chat requests agent frameworks send, each a body for ``/v1/chat/completions``
on the ``tiny`` model; stock vLLM (``--enable-auto-tool-choice --tool-call-parser hermes``) takes all."""

from __future__ import annotations

USER = [{"role": "user", "content": "What is the weather in Paris?"}]
# strict, with an enum argument: the only kind of tool call a random model finishes (vllm-serving-layer.md)
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "strict": True,
        "parameters": {
            "type": "object",
            "additionalProperties": False,
            "required": ["city"],
            "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
        },
    },
}
SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["answer"],
    "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
}
BASE = {"model": "tiny", "messages": USER, "max_tokens": 40}

TWELVE: dict[str, dict] = {
    "tools, tool_choice auto": BASE | {"tools": [TOOL], "tool_choice": "auto"},
    "tools, tool_choice required": BASE | {"tools": [TOOL], "tool_choice": "required", "max_tokens": 400},
    "tools, a named tool": BASE
    | {"tools": [TOOL], "max_tokens": 400, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
    "response_format json_schema": BASE
    | {
        "max_tokens": 400,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "verdict", "schema": SCHEMA, "strict": True},
        },
    },
    "response_format json_object": BASE | {"response_format": {"type": "json_object"}},
    "logprobs with top_logprobs": BASE | {"logprobs": True, "top_logprobs": 3, "max_tokens": 5},
    "n: 2": BASE | {"n": 2, "max_tokens": 5},
    "parallel_tool_calls": BASE | {"tools": [TOOL], "tool_choice": "auto", "parallel_tool_calls": True},
    "metadata with store": BASE | {"metadata": {"run": "r1"}, "store": False, "max_tokens": 5},
    "content as a list of parts": BASE
    | {
        "max_tokens": 5,
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "What is the weather"}, {"type": "text", "text": "in Paris?"}],
            }
        ],
    },
    "an assistant tool call, then a tool message": BASE
    | {
        "tools": [TOOL],
        "max_tokens": 5,
        "messages": USER
        + [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
        ],
    },
    "prompt_cache_key": BASE | {"prompt_cache_key": "session-42", "max_tokens": 5},
}
