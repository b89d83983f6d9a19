"""The official `anthropic` client against `hostd serve`'s Anthropic Messages API (tiny fixture:
random weights, so text is noise, but greedy runs are deterministic). Started by
tests/openai/run.sh; the client's base URL is the server's root."""

import anthropic
import pytest

USER = [{"role": "user", "content": "Say something."}]
NO_THINKING = {"type": "disabled"}
# This SDK's create() has no `temperature` argument (newer Claude models fix it); the API field
# is still accepted, so greedy decoding goes in the body.
GREEDY = {"extra_body": {"temperature": 0}}


def _text(message) -> str:
    return "".join(b.text for b in message.content if b.type == "text")


def _thinking(message) -> str:
    return "".join(b.thinking for b in message.content if b.type == "thinking")


def test_create_message_shape(anthropic_client, model):
    m = anthropic_client.messages.create(model=model, max_tokens=12, messages=USER, **GREEDY)
    assert m.type == "message" and m.role == "assistant" and m.model == model
    assert m.id.startswith("msg_")
    assert m.stop_reason in ("end_turn", "max_tokens")
    assert m.stop_sequence is None
    assert 1 <= m.usage.output_tokens <= 12
    # Thinking is on by default (--default-thinking): the reasoning is a thinking block, first.
    kinds = [b.type for b in m.content]
    assert kinds in (["thinking"], ["thinking", "text"], []), kinds
    assert m._request_id  # the SDK reads the `request-id` header


def test_system_and_thinking_off(anthropic_client, model):
    m = anthropic_client.messages.create(
        model=model, max_tokens=6, **GREEDY, system="You are terse.", messages=USER, thinking=NO_THINKING,
    )
    assert all(b.type == "text" for b in m.content)
    with_system = anthropic_client.messages.count_tokens(model=model, system="You are terse.", messages=USER, thinking=NO_THINKING)
    without = anthropic_client.messages.count_tokens(model=model, messages=USER, thinking=NO_THINKING)
    assert with_system.input_tokens > without.input_tokens
    # count_tokens renders exactly what create prefilled or read from the cache.
    assert with_system.input_tokens == m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0)


@pytest.mark.parametrize("thinking", [None, NO_THINKING], ids=["default-thinking", "thinking-off"])
def test_stream_equals_create(anthropic_client, model, thinking):
    kw = dict(model=model, max_tokens=16, messages=USER, **GREEDY)
    if thinking:
        kw["thinking"] = thinking
    whole = anthropic_client.messages.create(**kw)
    with anthropic_client.messages.stream(**kw) as stream:
        streamed_text = "".join(stream.text_stream)
        final = stream.get_final_message()
    if thinking:
        assert streamed_text, "thinking off: the reply is all text"
    assert streamed_text == _text(whole)
    assert _text(final) == _text(whole) and _thinking(final) == _thinking(whole)
    assert [b.type for b in final.content] == [b.type for b in whole.content]
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0) == whole.usage.input_tokens + (
        whole.usage.cache_read_input_tokens or 0
    )


def test_raw_stream_event_order(anthropic_client, model):
    events = list(anthropic_client.messages.create(model=model, max_tokens=8, messages=USER, **GREEDY, stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"], kinds
    assert events[-2].delta.stop_reason in ("end_turn", "max_tokens")
    # Every block opens, gets deltas, and closes before the next one opens.
    open_index = None
    for e in events[1:-2]:
        if e.type == "content_block_start":
            assert open_index is None
            open_index = e.index
        elif e.type == "content_block_delta":
            assert e.index == open_index
        elif e.type == "content_block_stop":
            assert e.index == open_index
            open_index = None
    assert open_index is None


def test_stop_sequence_is_reported(anthropic_client, model):
    kw = dict(model=model, messages=USER, **GREEDY, thinking=NO_THINKING)
    full = _text(anthropic_client.messages.create(max_tokens=24, **kw))
    candidates = [full[i:i + 2] for i in range(2, len(full) - 1) if full[i:i + 2].isprintable() and full[i:i + 2].strip()]
    # The fixture's greedy reply is fixed: a reply without a printable piece is a failure to
    # look at, not a case to skip.
    assert candidates, f"the greedy reply has no printable two-character piece: {full!r}"
    stop = candidates[0]
    m = anthropic_client.messages.create(max_tokens=24, stop_sequences=[stop], **kw)
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop
    assert _text(m) == full[: full.index(stop)]


def test_errors_are_anthropic_errors(anthropic_client, model):
    with pytest.raises(anthropic.NotFoundError) as e:
        anthropic_client.messages.create(model="no-such-model", max_tokens=4, messages=USER)
    assert e.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError) as e:
        anthropic_client.messages.create(
            model=model, max_tokens=4, messages=USER,
            tools=[{"name": "get_weather", "input_schema": {"type": "object", "properties": {}}}],
            tool_choice={"type": "tool", "name": "get_time"},
        )
    assert e.value.body["error"]["type"] == "invalid_request_error"
    assert "get_time" in e.value.body["error"]["message"]
