"""Tool calling through the official openai SDK against `hostd serve` on the tiny fixture.

With random weights the model does not call tools on its own, so these tests check what a real
client can see: tools requests are accepted, the agent loop's history round trip
(`messages.append(message.model_dump())` plus a `tool` result) is accepted, streamed and whole
replies agree, and forced tool choices (`required`, a named function) produce valid calls even from
random weights, because constrained decoding writes them. Parsing the model's free calls
(including calls split across chunks) is tested on fed text in Rust (hostd/src/tool_calls/tests.rs).
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
    # An empty tool_calls list in history is accepted, and means the same as none: the same
    # prompt (token count) and, greedy, the same reply as the turn written without the field.
    tail = [{"role": "user", "content": "thanks"}]
    empty = messages + [{"role": "assistant", "content": "ok", "tool_calls": []}] + tail
    absent = messages + [{"role": "assistant", "content": "ok"}] + tail
    with_empty = client.chat.completions.create(model=model, messages=empty, tools=[WEATHER], max_tokens=2, temperature=0)
    without = client.chat.completions.create(model=model, messages=absent, tools=[WEATHER], max_tokens=2, temperature=0)
    check_reply_shape(with_empty.choices[0])
    assert with_empty.usage.prompt_tokens == without.usage.prompt_tokens
    assert with_empty.choices[0].message == without.choices[0].message


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


# Bounded parameters (string length, integer range, enums), so random weights finish the call
# within max_tokens; constrained decoding enforces each bound.
BOUNDED_WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
            "required": ["city"],
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}, "verbose": {"type": "boolean"}},
            "required": ["zone", "verbose"],
        },
    },
}
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}


def check_forced_calls(calls, allowed):
    assert calls, "a forced tool_choice must produce a call"
    for call in calls:
        assert call.function.name in allowed
        args = json.loads(call.function.arguments)
        if call.function.name == "get_weather":
            assert isinstance(args["city"], str) and len(args["city"]) <= 12
            assert set(args) <= {"city", "days"}
            assert "days" not in args or (isinstance(args["days"], int) and 1 <= args["days"] <= 7)
        else:
            assert args["zone"] in ("UTC", "CET") and isinstance(args["verbose"], bool)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_forced_tool_choices_give_valid_calls_from_random_weights(client, model, seed):
    named = {"type": "function", "function": {"name": "get_time"}}
    for choice, allowed, extra in [("required", {"get_weather", "get_time"}, NO_THINKING), (named, {"get_time"}, NO_THINKING), (named, {"get_time"}, {})]:
        r = client.chat.completions.create(
            model=model, messages=USER, tools=[BOUNDED_WEATHER, CLOCK], tool_choice=choice, parallel_tool_calls=False, max_tokens=400, temperature=0.8, seed=seed, extra_body=extra
        )
        c = r.choices[0]
        assert c.finish_reason == "tool_calls", (choice, c)
        check_forced_calls(c.message.tool_calls, allowed)


def test_forced_tool_call_streams_as_deltas(client, model):
    kw = dict(model=model, messages=USER, tools=[BOUNDED_WEATHER, CLOCK], tool_choice="required", parallel_tool_calls=False, max_tokens=400, temperature=0.8, seed=5, extra_body=NO_THINKING)
    whole = client.chat.completions.create(**kw).choices[0]
    calls, finish = {}, None
    for chunk in client.chat.completions.create(stream=True, **kw):
        for ch in chunk.choices:
            finish = ch.finish_reason or finish
            for d in ch.delta.tool_calls or []:
                entry = calls.setdefault(d.index, {"name": "", "arguments": ""})
                entry["name"] += (d.function.name or "") if d.function else ""
                entry["arguments"] += (d.function.arguments or "") if d.function else ""
    assert finish == "tool_calls"
    assert [(c["name"], json.loads(c["arguments"])) for _, c in sorted(calls.items())] == [
        (t.function.name, json.loads(t.function.arguments)) for t in whole.message.tool_calls
    ]


def test_invalid_tool_choices_are_refused(client, model):
    cases = [
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
