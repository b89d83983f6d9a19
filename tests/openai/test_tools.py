"""Tool calling through the official openai SDK against `hostd serve` on the tiny fixture.

With random weights the model does not call tools on its own, so these tests check what a real
client can see: tools requests are accepted, the agent loop's history round trip
(`messages.append(message.model_dump())` plus a `tool` result) is accepted, streamed and whole
replies agree, and forced tool choices are refused for now. Parsing the model's calls (including
calls split across chunks) is tested on fed text in Rust (hostd/src/tool_calls/tests.rs).
"""

import json

import openai
import pytest
from openai.types.chat import ChatCompletionMessage, ChatCompletionMessageToolCall
from openai.types.chat.chat_completion_message_tool_call import Function

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
        "strict": False,
    },
}
USER = [{"role": "user", "content": "What is the weather in Oslo?"}]


def check_reply_shape(choice):
    msg = choice.message
    assert msg.role == "assistant"
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    if msg.tool_calls:
        assert choice.finish_reason in ("tool_calls", "length")
        for call in msg.tool_calls:
            assert call.id.startswith("call_") and call.type == "function"
            assert call.function.name == "get_weather"
            assert isinstance(json.loads(call.function.arguments), dict)
    else:
        assert isinstance(msg.content, str)


def test_tools_request_is_accepted(client, model):
    for choice in ("auto", "none", None):
        kw = {} if choice is None else {"tool_choice": choice}
        r = client.chat.completions.create(
            model=model, messages=USER, tools=[WEATHER], parallel_tool_calls=False, max_tokens=8, temperature=0, **kw
        )
        check_reply_shape(r.choices[0])


def test_agent_loop_history_round_trip(client, model):
    messages = list(USER)
    first = client.chat.completions.create(model=model, messages=messages, tools=[WEATHER], max_tokens=4, temperature=0)
    check_reply_shape(first.choices[0])
    # What an agent appends after a call: the SDK's message object, dumped with every field
    # (annotations, audio, function_call, refusal as None; arguments as a JSON string).
    called = ChatCompletionMessage(
        role="assistant",
        content=None,
        tool_calls=[
            ChatCompletionMessageToolCall(
                id="call_abc", type="function", function=Function(name="get_weather", arguments='{"city": "Oslo", "days": 2}')
            )
        ],
    )
    messages.append(called.model_dump())
    messages.append({"role": "tool", "tool_call_id": "call_abc", "content": "-3 °C, snow"})
    second = client.chat.completions.create(model=model, messages=messages, tools=[WEATHER], max_tokens=4, temperature=0)
    check_reply_shape(second.choices[0])
    # The real reply appended as is (tool_calls None or a list), then a new user turn.
    messages.append(second.choices[0].message.model_dump())
    messages.append({"role": "user", "content": "And tomorrow?"})
    third = client.chat.completions.create(model=model, messages=messages, tools=[WEATHER], max_tokens=4, temperature=0)
    check_reply_shape(third.choices[0])
    # An empty tool_calls list in history is accepted too.
    messages.append({"role": "assistant", "content": "ok", "tool_calls": []})
    messages.append({"role": "user", "content": "thanks"})
    client.chat.completions.create(model=model, messages=messages, tools=[WEATHER], max_tokens=2)


def test_streamed_reply_accumulates_like_the_whole_one(client, model):
    # The SDK's stream helper only takes strict tools (strict is accepted, not enforced: see
    # docs/tool-calling.md).
    strict = {"type": "function", "function": dict(WEATHER["function"], strict=True)}
    strict["function"]["parameters"] = dict(WEATHER["function"]["parameters"], additionalProperties=False, required=["city", "days"])
    kw = dict(model=model, messages=USER, tools=[strict], max_tokens=16, temperature=0, seed=7)
    whole = client.chat.completions.create(**kw).choices[0]
    with client.chat.completions.stream(**kw) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion().choices[0]
    assert final.finish_reason == whole.finish_reason
    assert (final.message.content or "") == (whole.message.content or "")
    names = lambda m: [(c.function.name, c.function.arguments) for c in (m.tool_calls or [])]  # noqa: E731
    assert names(final.message) == names(whole.message)


def test_forced_and_invalid_tool_choices_are_refused(client, model):
    cases = [
        (dict(tools=[WEATHER], tool_choice="required"), "tool_choice"),
        (dict(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}}), "tool_choice"),
        (dict(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice"),
        (dict(tools=[{"type": "function", "function": {"name": "bad name"}}]), "tools[0].function.name"),
        (dict(tools=[{"type": "custom", "custom": {"name": "x"}}]), "tools[0].type"),
    ]
    for kw, param in cases:
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model=model, messages=USER, max_tokens=2, **kw)
        assert info.value.body["param"] == param, info.value.body
    bad_args = list(USER) + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": "[1]"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "x"},
    ]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=model, messages=bad_args, tools=[WEATHER], max_tokens=2)
    assert info.value.body["param"] == "messages[1].tool_calls[0].function.arguments"
