#!/usr/bin/env python3
"""Render the tool-calling golden conversations with transformers' own `apply_chat_template`
over the official Qwen3.6 template (tests/oracle/templates/qwen36-35b-a3b.chat_template.jinja)
and write them, with their inputs, to tests/oracle/tool_goldens.json.

The Rust test `chat_template::goldens` renders every case with our renderer and asserts equality
byte for byte. transformers compiles the template in an ImmutableSandboxedEnvironment with
trim_blocks / lstrip_blocks, its own `tojson` (json.dumps, ensure_ascii=False) and
`raise_exception` — using the library itself means we do not restate that configuration.

    python3 -m venv target/venv-goldens
    target/venv-goldens/bin/pip install -r tests/oracle/requirements-goldens.txt
    target/venv-goldens/bin/python3 tests/oracle/make_tool_goldens.py

Offline: the tokenizer is built from the tiny fixture's tokenizer.json (the template does not
depend on the vocabulary). Deterministic: rerunning writes identical bytes.
"""

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from transformers import PreTrainedTokenizerFast  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "tests/oracle/templates/qwen36-35b-a3b.chat_template.jinja"
TOKENIZER = ROOT / "tests/fixtures/models/tiny/tokenizer.json"
OUT = ROOT / "tests/oracle/tool_goldens.json"

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city. Unicode: °C, «quotes», \"escapes\" \\ and <tags>.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7.5},
            },
            "required": ["city"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search_files",
        "parameters": {
            "type": "object",
            "properties": {
                "pattern": {"type": "string"},
                "limit": {"type": "number"},
                "recursive": {"type": "boolean"},
                "options": {"type": "object"},
                "paths": {"type": "array", "items": {"type": "string"}},
                "cursor": {"type": "null"},
            },
        },
        "strict": False,
    },
}
NO_PARAMS = {"type": "function", "function": {"name": "now", "description": "The time."}}


def call(name, args, wrapped=True):
    fn = {"name": name, "arguments": args}
    return {"id": f"call_{name}", "type": "function", "function": fn} if wrapped else fn


CASES = [
    ("tools_only", [{"role": "user", "content": "Weather in Paris?"}], [WEATHER, SEARCH, NO_PARAMS], {}),
    (
        "tools_with_system",
        [{"role": "system", "content": "  You are terse.\n"}, {"role": "user", "content": "hi"}],
        [WEATHER],
        {},
    ),
    ("tools_with_empty_system", [{"role": "system", "content": " "}, {"role": "user", "content": "hi"}], [WEATHER], {}),
    ("no_tools_empty_list", [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}], [], {}),
    (
        "call_string_arg_then_result",
        [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [call("get_weather", {"city": "Paris"})]},
            {"role": "tool", "tool_call_id": "call_get_weather", "content": "18°C, sunny"},
        ],
        [WEATHER],
        {},
    ),
    (
        "call_typed_args",
        [
            {"role": "user", "content": "find"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    call(
                        "search_files",
                        {
                            "pattern": "fn main\n  {",
                            "limit": 2.5,
                            "recursive": True,
                            "options": {"case": False, "depth": 3, "glob": "*.rs", "é": None},
                            "paths": ["src", "tests/ä"],
                            "cursor": None,
                            "count": 10,
                            "exact": False,
                            "tiny": 1e-07,
                            "big": 1e16,
                            "whole": 3.0,
                        },
                    )
                ],
            },
            {"role": "tool", "content": "[]"},
        ],
        [SEARCH],
        {},
    ),
    (
        "content_and_two_calls_consecutive_results",
        [
            {"role": "user", "content": "Paris and Rome?"},
            {
                "role": "assistant",
                "content": "I will check both.  ",
                "reasoning_content": "\nTwo cities, two calls.\n",
                "tool_calls": [
                    call("get_weather", {"city": "Paris", "unit": "celsius"}),
                    call("get_weather", {"city": "Rome", "days": 3}),
                ],
            },
            {"role": "tool", "content": "Paris: 18"},
            {"role": "tool", "content": "  Rome: 24\n"},
            {"role": "assistant", "content": "Paris 18, Rome 24.", "reasoning_content": "Both known."},
        ],
        [WEATHER],
        {"add_generation_prompt": False},
    ),
    (
        "unwrapped_call_and_no_arguments",
        [
            {"role": "user", "content": "time?"},
            {"role": "assistant", "content": "", "tool_calls": [call("now", {}, wrapped=False), {"name": "now"}]},
            {"role": "tool", "content": "12:00"},
        ],
        [NO_PARAMS],
        {},
    ),
    (
        "multi_step_agent_loop",
        [
            {"role": "system", "content": "Agent."},
            {"role": "user", "content": "Old question"},
            {"role": "assistant", "content": "Old answer", "reasoning_content": "old thoughts"},
            {"role": "user", "content": "Weather in Oslo, then search."},
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": "step one",
                "tool_calls": [call("get_weather", {"city": "Oslo"})],
            },
            {"role": "tool", "content": "-3"},
            {
                "role": "assistant",
                "content": "Now searching.",
                "reasoning_content": "step two",
                "tool_calls": [call("search_files", {"pattern": "oslo", "recursive": False})],
            },
            {"role": "tool", "content": "none"},
        ],
        [WEATHER, SEARCH],
        {},
    ),
    (
        "multi_step_preserve_thinking",
        [
            {"role": "user", "content": "Old question"},
            {"role": "assistant", "content": "Old answer", "reasoning_content": "old thoughts"},
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": "", "reasoning_content": "look it up", "tool_calls": [call("get_weather", {"city": "Oslo"})]},
            {"role": "tool", "content": "-3"},
        ],
        [WEATHER],
        {"preserve_thinking": True},
    ),
    (
        "thinking_off",
        [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": "", "tool_calls": [call("get_weather", {"city": "Bern"})]},
            {"role": "tool", "content": "5"},
        ],
        [WEATHER],
        {"enable_thinking": False},
    ),
    (
        "inline_reasoning_with_calls",
        [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "<think>\nhmm\n</think>\n\n", "tool_calls": [call("now", {})]},
            {"role": "tool", "content": "t"},
        ],
        [NO_PARAMS],
        {},
    ),
    (
        "tool_response_user_message_is_not_a_query",
        [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "", "reasoning_content": "r1", "tool_calls": [call("now", {})]},
            {"role": "user", "content": "<tool_response>\nt\n</tool_response>"},
        ],
        [NO_PARAMS],
        {},
    ),
    (
        "tool_message_after_system",
        [{"role": "system", "content": "s"}, {"role": "tool", "content": "orphan"}, {"role": "user", "content": "q"}],
        [],
        {},
    ),
    (
        "empty_calls_list",
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "tool_calls": []}, {"role": "user", "content": "r"}],
        [WEATHER],
        {},
    ),
]


def main():
    template = TEMPLATE.read_text(encoding="utf-8")
    tok = PreTrainedTokenizerFast(tokenizer_file=str(TOKENIZER))
    out = []
    for name, messages, tools, kwargs in CASES:
        opts = {"add_generation_prompt": True, **kwargs}
        rendered = tok.apply_chat_template(
            messages, tools=tools or None, chat_template=template, tokenize=False, **opts
        )
        out.append({"name": name, "messages": messages, "tools": tools, "kwargs": opts, "rendered": rendered})
    text = json.dumps({"template": str(TEMPLATE.relative_to(ROOT)), "cases": out}, ensure_ascii=False, indent=1) + "\n"
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {len(out)} cases to {OUT.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
