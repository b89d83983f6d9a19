"""Anthropic tool use with the official `anthropic` client against `hostd serve` (tiny fixture:
random weights). A forced `tool_choice` makes the server decode under the tool-call grammar, so
the reply is a valid `tool_use` block even from noise; the client sends the assistant content
back with a `tool_result`, and its stream accumulator rebuilds the same `input` from the
`input_json_delta` events."""

import pytest
from schemas import WEATHER_ARGUMENTS

GREEDY = {"extra_body": {"temperature": 0}}
NO_THINKING = {"type": "disabled"}
TOOLS = [
    {
        "name": "get_weather",
        "description": "Weather of a city.",
        "input_schema": WEATHER_ARGUMENTS,
    },
    {
        "name": "get_time",
        "input_schema": {
            "type": "object",
            "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
            "required": ["zone"],
        },
    },
]
QUESTION = [{"role": "user", "content": "What's the weather in Oslo?"}]
CHOICES = {
    "any": {"type": "any", "disable_parallel_tool_use": True},
    "tool": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
}


def _check_input(block) -> None:
    assert block.type == "tool_use" and block.id.startswith("toolu_")
    if block.name == "get_weather":
        assert isinstance(block.input["city"], str) and len(block.input["city"]) <= 12
        assert isinstance(block.input["days"], int) and 1 <= block.input["days"] <= 7
    else:
        assert block.name == "get_time" and block.input["zone"] in ("UTC", "CET")


def _tool_uses(message):
    return [b for b in message.content if b.type == "tool_use"]


@pytest.mark.parametrize("choice", sorted(CHOICES))
def test_forced_tool_use_round_trip(anthropic_client, model, choice):
    kw = dict(model=model, max_tokens=200, tools=TOOLS, tool_choice=CHOICES[choice], thinking=NO_THINKING, **GREEDY)
    m = anthropic_client.messages.create(messages=QUESTION, **kw)
    assert m.stop_reason == "tool_use"
    calls = _tool_uses(m)
    assert len(calls) == 1
    _check_input(calls[0])
    if choice == "tool":
        assert calls[0].name == "get_weather"

    # The assistant content goes back as the SDK returned it, then the tool's result.
    history = QUESTION + [
        {"role": "assistant", "content": m.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": calls[0].id, "content": "Sunny, 18 C."}]},
    ]
    follow = anthropic_client.messages.create(model=model, max_tokens=8, tools=TOOLS, messages=history, thinking=NO_THINKING, **GREEDY)
    assert follow.stop_reason in ("end_turn", "max_tokens", "tool_use")
    counted = anthropic_client.messages.count_tokens(model=model, tools=TOOLS, messages=history, thinking=NO_THINKING)
    assert counted.input_tokens == follow.usage.input_tokens + (follow.usage.cache_read_input_tokens or 0)


@pytest.mark.parametrize("choice", sorted(CHOICES))
def test_streamed_tool_use_accumulates_the_same_input(anthropic_client, model, choice):
    kw = dict(model=model, max_tokens=200, messages=QUESTION, tools=TOOLS, tool_choice=CHOICES[choice], thinking=NO_THINKING, **GREEDY)
    whole = anthropic_client.messages.create(**kw)
    with anthropic_client.messages.stream(**kw) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert "input_json" in kinds, kinds  # the SDK's event for each input_json_delta
    assert final.stop_reason == "tool_use"
    streamed, whole_calls = _tool_uses(final), _tool_uses(whole)
    assert len(streamed) == 1
    _check_input(streamed[0])
    assert [(c.name, c.input) for c in streamed] == [(c.name, c.input) for c in whole_calls]
    assert final.usage.output_tokens == whole.usage.output_tokens
