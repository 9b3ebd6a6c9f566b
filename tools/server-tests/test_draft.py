"""kiln serve --draft (DFlash speculative decoding in the batched scheduler) through the official `openai` client:
every response of the speculative server equals the plain server's (greedy and seeded sampling; chat and
completions; streamed and not; stop strings, max_tokens, logprobs, the context limit), also with concurrent
streams that mix speculative and plain requests, and usage counts match. The drafter has random weights, so
nearly every draft is rejected: the path under test is the block walk and KV rollback, not the drafter.

Needs KILN_BASE_URL (a server without a drafter) and KILN_DRAFT_URL (the same model, same slot size, with
--draft)."""
import json
import os
import threading
import urllib.request

from openai import OpenAI

from common import KEY, http, run

DRAFT = os.environ["KILN_DRAFT_URL"]
plain = OpenAI(base_url=os.environ["KILN_BASE_URL"] + "/v1", api_key=KEY or "none", max_retries=0, timeout=300)
spec = OpenAI(base_url=DRAFT + "/v1", api_key=KEY or "none", max_retries=0, timeout=300)
MODEL = plain.models.list().data[0].id

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Name three primary colors.",
    "How many legs does a spider have?",
    "Explain what a CPU does in one sentence.",
    "Give me a synonym for happy.",
]


def chat(client, content, **kw):
    kw.setdefault("temperature", 0)
    kw.setdefault("max_tokens", 24)
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}], **kw)


def stream(client, content, **kw):
    """(text, finish_reason, usage) of a streamed chat."""
    kw.setdefault("temperature", 0)
    kw.setdefault("max_tokens", 24)
    text, finish, usage = [], None, None
    for c in client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": content}], stream=True,
        stream_options={"include_usage": True}, **kw,
    ):
        if c.usage is not None:
            usage = (c.usage.prompt_tokens, c.usage.completion_tokens)
        for ch in c.choices:
            if ch.delta.content:
                text.append(ch.delta.content)
            if ch.finish_reason:
                finish = ch.finish_reason
    return "".join(text), finish, usage


def same(a, b):
    """The parts of two chat responses that must be equal."""
    ca, cb = a.choices[0], b.choices[0]
    assert ca.message.content == cb.message.content, (ca.message.content, cb.message.content)
    assert ca.finish_reason == cb.finish_reason, (ca.finish_reason, cb.finish_reason)
    assert (a.usage.prompt_tokens, a.usage.completion_tokens) == (b.usage.prompt_tokens, b.usage.completion_tokens)


def draft_metrics():
    req = urllib.request.Request(DRAFT + "/metrics")
    with urllib.request.urlopen(req, timeout=30) as r:
        text = r.read().decode()
    return {k: float(v) for k, v in (l.rsplit(" ", 1) for l in text.splitlines() if l and not l.startswith("#"))}


def test_greedy_chat_equals_plain():
    before = draft_metrics()["kiln_spec_rounds_total"]
    for q in QUESTIONS:
        same(chat(spec, q), chat(plain, q))
    assert draft_metrics()["kiln_spec_rounds_total"] > before, "no speculative rounds ran"


def test_streaming_usage_and_stop_strings_equal_plain():
    for q in QUESTIONS[:3]:
        assert stream(spec, q, max_tokens=30) == stream(plain, q, max_tokens=30)
    full = chat(plain, QUESTIONS[0], max_tokens=30).choices[0].message.content
    # A stop string from the middle of the plain answer.
    cut = full.split()[len(full.split()) // 2]
    assert stream(spec, QUESTIONS[0], max_tokens=30, stop=[cut]) == stream(plain, QUESTIONS[0], max_tokens=30, stop=[cut])


def test_completions_logprobs_seed_and_context_limit_equal_plain():
    kw = dict(model=MODEL, prompt="1, 2, 3, 4, 5, 6,", max_tokens=12, temperature=0, logprobs=2)
    a, b = spec.completions.create(**kw), plain.completions.create(**kw)
    assert a.choices[0].text == b.choices[0].text and a.choices[0].finish_reason == "length"
    assert a.choices[0].logprobs.token_logprobs == b.choices[0].logprobs.token_logprobs
    assert a.choices[0].logprobs.top_logprobs == b.choices[0].logprobs.top_logprobs
    # Seeded sampling: one draw per emitted token in the same order, so the same seed gives the same text.
    for seed in (1, 2, 3):
        same(chat(spec, QUESTIONS[1], temperature=0.9, seed=seed), chat(plain, QUESTIONS[1], temperature=0.9, seed=seed))
    # No max_tokens and a prompt that keeps going: the slot's context ends both, on the same token.
    kw = dict(model=MODEL, prompt="1, 2, 3, 4, 5, 6, 7, 8,", temperature=0)
    a, b = spec.completions.create(**kw), plain.completions.create(**kw)
    assert a.choices[0].finish_reason == "length" and a.choices[0].text == b.choices[0].text
    assert a.usage.completion_tokens == b.usage.completion_tokens


def test_concurrent_mixed_streams_equal_plain():
    want = [stream(plain, q, max_tokens=20) for q in QUESTIONS]
    got = [None] * len(QUESTIONS)

    def one(i):
        # Every other request opts out: speculative and plain requests share the batches.
        extra = {"speculative": False} if i % 2 else {}
        got[i] = stream(spec, QUESTIONS[i], max_tokens=20, extra_body=extra)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(QUESTIONS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, (g, w) in enumerate(zip(got, want)):
        assert g == w, (i, g, w)


def test_speculative_field_is_validated():
    # The plain server has no drafter: asking for one is refused, naming the field.
    status, body = http("POST", "/v1/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "speculative": True})
    assert status == 400 and body["error"]["param"] == "speculative", (status, body)
    status, body = http("POST", "/v1/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "speculative": "yes"})
    assert status == 400 and "speculative" in body["error"]["message"], (status, body)
    # "speculative": false is accepted anywhere.
    status, body = http("POST", "/v1/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "speculative": False})
    assert status == 200, (status, body)


if __name__ == "__main__":
    run([test_greedy_chat_equals_plain, test_streaming_usage_and_stop_strings_equal_plain,
         test_completions_logprobs_seed_and_context_limit_equal_plain, test_concurrent_mixed_streams_equal_plain,
         test_speculative_field_is_validated])
