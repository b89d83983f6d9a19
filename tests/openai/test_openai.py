"""The official `openai` client against `hostd serve` (tiny fixture: random weights, so text
is noise, but greedy and seeded runs are deterministic). Started by tests/openai/run.sh."""

import openai
import pytest

USER = [{"role": "user", "content": "Say something."}]
# vLLM-style extension: keep generating past <|im_end|>, so lengths are exact.
NO_EOS = {"ignore_eos": True}


def test_models_list(client, model):
    ids = [m.id for m in client.models.list().data]
    assert ids == [model]
    assert client.models.retrieve(model).id == model


def test_chat_non_streaming_shape(client, model):
    r = client.chat.completions.create(model=model, messages=USER, max_tokens=8, temperature=0, extra_body=NO_EOS)
    assert r.object == "chat.completion"
    assert r.id.startswith("chatcmpl-")
    choice = r.choices[0]
    assert choice.index == 0 and choice.message.role == "assistant"
    assert choice.finish_reason == "length"
    assert isinstance(choice.message.content, str)
    # Thinking is on by default: the reasoning comes separately (an extra field).
    assert isinstance((choice.message.model_extra or {}).get("reasoning_content"), str)
    assert r.usage.completion_tokens == 8
    assert r.usage.total_tokens == r.usage.prompt_tokens + 8
    assert r.usage.prompt_tokens_details.cached_tokens >= 0


def _stream_text(client, model, **kw):
    reasoning, content, finish, usage = "", "", None, None
    for chunk in client.chat.completions.create(model=model, stream=True, stream_options={"include_usage": True}, **kw):
        assert chunk.object == "chat.completion.chunk"
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            content += c.delta.content or ""
            reasoning += (c.delta.model_extra or {}).get("reasoning_content") or ""
            finish = c.finish_reason or finish
    return reasoning, content, finish, usage


def test_chat_streaming_equals_non_streaming(client, model):
    kw = dict(model=model, messages=USER, max_tokens=12, temperature=0, extra_body=NO_EOS)
    whole = client.chat.completions.create(**kw)
    reasoning, content, finish, usage = _stream_text(client, **kw)
    msg = whole.choices[0].message
    assert content == msg.content
    assert reasoning == (msg.model_extra or {}).get("reasoning_content")
    assert finish == "length"
    assert usage.completion_tokens == 12


def test_thinking_off_has_no_reasoning(client, model):
    r = client.chat.completions.create(
        model=model, messages=USER, max_tokens=4, temperature=0,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}, **NO_EOS},
    )
    assert (r.choices[0].message.model_extra or {}).get("reasoning_content") is None


def test_completions_streaming_and_not(client, model):
    kw = dict(model=model, prompt="Once upon a time", max_tokens=10, temperature=0, extra_body=NO_EOS)
    whole = client.completions.create(**kw)
    assert whole.object == "text_completion"
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage.completion_tokens == 10
    text = "".join(c.choices[0].text for c in client.completions.create(stream=True, **kw) if c.choices)
    assert text == whole.choices[0].text


def test_stop_string_is_not_emitted(client, model):
    kw = dict(model=model, prompt="The river", temperature=0, extra_body=NO_EOS)
    full = client.completions.create(max_tokens=24, **kw).choices[0].text
    # Any two-character piece after the start works as a stop string; text before its first
    # occurrence must come back, the stop string itself must not.
    stop = next(full[i:i + 2] for i in range(3, len(full) - 1) if full[i:i + 2].strip())
    expected = full[: full.find(stop)]
    r = client.completions.create(max_tokens=24, stop=[stop, "\u0000never"], **kw)
    assert r.choices[0].text == expected
    assert r.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].text for c in client.completions.create(max_tokens=24, stop=stop, stream=True, **kw) if c.choices)
    assert streamed == expected


def test_seed_reproducibility(client, model):
    def sample(seed):
        r = client.chat.completions.create(model=model, messages=USER, max_tokens=16, temperature=1.0, seed=seed, extra_body=NO_EOS)
        m = r.choices[0].message
        return (m.model_extra or {}).get("reasoning_content", "") + m.content
    a = sample(1234)
    assert a == sample(1234)
    assert any(sample(s) != a for s in (1, 2, 3))


def test_max_tokens_and_max_completion_tokens(client, model):
    for kw in ({"max_tokens": 3}, {"max_completion_tokens": 5}):
        r = client.chat.completions.create(model=model, messages=USER, temperature=0, extra_body=NO_EOS, **kw)
        assert r.usage.completion_tokens == list(kw.values())[0]
        assert r.choices[0].finish_reason == "length"


def test_logprobs(client, model):
    r = client.chat.completions.create(model=model, messages=USER, max_tokens=4, temperature=0, logprobs=True, top_logprobs=3, extra_body=NO_EOS)
    entries = r.choices[0].logprobs.content
    assert len(entries) == 4
    for e in entries:
        assert e.logprob <= 0 and len(e.top_logprobs) == 3
        assert e.top_logprobs[0].logprob >= e.logprob - 1e-6


@pytest.mark.parametrize(
    "kw, exc, param",
    [
        (dict(n=9), openai.BadRequestError, "n"),
        (dict(temperature=5), openai.BadRequestError, "temperature"),
        (dict(model="no-such-model"), openai.NotFoundError, "model"),
        (dict(messages=[]), openai.BadRequestError, "messages"),
        (dict(messages=[{"role": "function", "content": "x", "name": "f"}]), openai.BadRequestError, "messages[0].role"),
        (dict(stop=["a", "b", "c", "d", "e"]), openai.BadRequestError, "stop"),
        (dict(extra_body={"use_beam_search": True}), openai.BadRequestError, "use_beam_search"),
    ],
)
def test_errors(client, model, kw, exc, param):
    args = dict(model=model, messages=USER, max_tokens=2) | kw
    with pytest.raises(exc) as info:
        client.chat.completions.create(**args)
    err = info.value.body
    assert err["param"] == param, err
    assert err["message"] and err["type"] and err["code"]


def test_context_length_error(client, model):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=model, messages=USER, max_tokens=10**9)
    assert info.value.body["code"] == "context_length_exceeded"
