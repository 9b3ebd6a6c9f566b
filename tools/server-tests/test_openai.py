"""kiln serve through the official `openai` Python client: chat, completions, streaming with usage, stop strings,
seed reproducibility, logprobs, the context limit, prefix reuse, and 8 concurrent streams that must each be
byte-identical to the same request run alone (greedy)."""
import threading

from openai import OpenAI

from common import BASE, KEY, http, metrics, run, wait_idle

client = OpenAI(base_url=BASE + "/v1", api_key=KEY or "none", max_retries=0, timeout=300)
MODEL = client.models.list().data[0].id

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Name three primary colors.",
    "How many legs does a spider have?",
    "Explain what a CPU does in one sentence.",
    "Give me a synonym for happy.",
    "What is 12 times 12?",
    "Describe a cat in five words.",
]


def chat(content, **kw):
    kw.setdefault("temperature", 0)
    kw.setdefault("max_tokens", 24)
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}], **kw)


def stream_text(content, **kw):
    """(text, finish_reason, usage) of a streamed chat."""
    kw.setdefault("temperature", 0)
    kw.setdefault("max_tokens", 24)
    text, finish, usage = [], None, None
    for c in client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": content}], stream=True,
        stream_options={"include_usage": True}, **kw,
    ):
        if c.usage is not None:
            usage = c.usage
        for ch in c.choices:
            if ch.delta.content:
                text.append(ch.delta.content)
            if ch.finish_reason:
                finish = ch.finish_reason
    return "".join(text), finish, usage


def test_models():
    ids = [m.id for m in client.models.list().data]
    assert ids == [MODEL] and MODEL.startswith("SmolLM2"), ids


def test_chat():
    r = chat(QUESTIONS[0])
    c = r.choices[0]
    assert c.message.role == "assistant" and c.message.content.strip(), r
    assert c.finish_reason in ("stop", "length"), c.finish_reason
    assert r.usage.prompt_tokens > 5 and 0 < r.usage.completion_tokens <= 24, r.usage
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.model == MODEL and r.object == "chat.completion"
    print("   chat:", repr(c.message.content))


def test_max_tokens_gives_length():
    # A prompt that keeps going (counting), so the budget ends it whatever the model's exact text.
    r = client.completions.create(model=MODEL, prompt="1, 2, 3, 4, 5, 6,", max_tokens=5, temperature=0)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 5, r
    r = chat("Count from one to one hundred, separated by commas.", max_tokens=3)
    assert r.usage.completion_tokens <= 3, r


def test_streaming_matches_non_streaming_and_reports_usage():
    full = chat(QUESTIONS[1], max_tokens=20)
    text, finish, usage = stream_text(QUESTIONS[1], max_tokens=20)
    assert text == full.choices[0].message.content, (text, full.choices[0].message.content)
    assert finish == full.choices[0].finish_reason
    assert usage is not None and usage.completion_tokens == full.usage.completion_tokens, usage
    assert usage.prompt_tokens == full.usage.prompt_tokens


def test_completions_text_and_token_prompts():
    r = client.completions.create(model=MODEL, prompt="The quick brown fox", max_tokens=12, temperature=0)
    text = r.choices[0].text
    assert text and r.usage.completion_tokens <= 12, r
    status, toks = http("POST", "/tokenize", {"content": "The quick brown fox"})
    assert status == 200 and toks["tokens"], toks
    r2 = client.completions.create(model=MODEL, prompt=toks["tokens"], max_tokens=12, temperature=0)
    assert r2.choices[0].text == text, (r2.choices[0].text, text)
    status, d = http("POST", "/detokenize", {"tokens": toks["tokens"]})
    assert status == 200 and d["content"] == "The quick brown fox", d
    # Streamed completions with usage.
    parts, usage = [], None
    for c in client.completions.create(model=MODEL, prompt="The quick brown fox", max_tokens=12, temperature=0,
                                       stream=True, stream_options={"include_usage": True}):
        if c.usage:
            usage = c.usage
        parts += [ch.text for ch in c.choices]
    assert "".join(parts) == text and usage.completion_tokens == r.usage.completion_tokens
    print("   completion:", repr(text))


def test_stop_strings():
    base = chat(QUESTIONS[2], max_tokens=24).choices[0].message.content
    words = [w for w in base.split() if len(w) > 2]
    assert len(words) >= 3, base
    stop = " " + words[2]
    cut = base[: base.index(stop)]
    r = chat(QUESTIONS[2], max_tokens=24, stop=[stop, "zzzz-never"])
    assert r.choices[0].message.content == cut and r.choices[0].finish_reason == "stop", (r, cut)
    text, finish, _ = stream_text(QUESTIONS[2], max_tokens=24, stop=stop)
    assert text == cut and finish == "stop", (text, cut)


def test_seed_reproducibility():
    kw = dict(temperature=1.0, top_p=0.95, max_tokens=16)
    a = chat(QUESTIONS[4], seed=1234, **kw).choices[0].message.content
    b = chat(QUESTIONS[4], seed=1234, **kw).choices[0].message.content
    assert a == b, (a, b)
    others = {chat(QUESTIONS[4], seed=s, **kw).choices[0].message.content for s in (1, 2, 3)}
    assert len(others | {a}) > 1, "different seeds should not all give the same sample"


def test_logprobs():
    r = chat(QUESTIONS[6], max_tokens=6, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens, content
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        # Greedy: the chosen token is the most likely one.
        assert t.top_logprobs[0].token == t.token and abs(t.top_logprobs[0].logprob - t.logprob) < 1e-4
    assert "".join(t.token for t in content) == r.choices[0].message.content


def test_context_limit_gives_length():
    slot_ctx = client.models.list().data[0].model_extra["meta"]["n_ctx_per_request"]
    prompt = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20,"
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=100000, temperature=0)
    assert r.choices[0].finish_reason == "length", r
    # Every position of the slot is filled; the last token is sampled from the last position's logits and
    # needs no position of its own.
    assert r.usage.prompt_tokens + r.usage.completion_tokens == slot_ctx + 1, (r.usage, slot_ctx)


def test_prefix_reuse_same_output_fewer_tokens():
    system = "You are a careful assistant. " * 20
    msgs = lambda q: [{"role": "system", "content": system}, {"role": "user", "content": q}]
    wait_idle()
    m0 = metrics()
    a = client.chat.completions.create(model=MODEL, messages=msgs(QUESTIONS[3]), temperature=0, max_tokens=12)
    m1 = metrics()
    b = client.chat.completions.create(model=MODEL, messages=msgs(QUESTIONS[3]), temperature=0, max_tokens=12)
    m2 = metrics()
    assert a.choices[0].message.content == b.choices[0].message.content
    first = m1["kiln_prompt_tokens_processed_total"] - m0["kiln_prompt_tokens_processed_total"]
    second = m2["kiln_prompt_tokens_processed_total"] - m1["kiln_prompt_tokens_processed_total"]
    reused = m2["kiln_prompt_tokens_reused_total"] - m1["kiln_prompt_tokens_reused_total"]
    assert second < first and reused == a.usage.prompt_tokens - 1, (first, second, reused)
    # A different question after the same system prompt still reuses the shared prefix.
    c = client.chat.completions.create(model=MODEL, messages=msgs(QUESTIONS[5]), temperature=0, max_tokens=12)
    m3 = metrics()
    assert m3["kiln_prompt_tokens_reused_total"] - m2["kiln_prompt_tokens_reused_total"] > 100
    print(f"   prompt tokens processed: cold {first:.0f}, repeat {second:.0f}; reused on a new question: "
          f"{m3['kiln_prompt_tokens_reused_total'] - m2['kiln_prompt_tokens_reused_total']:.0f} of {c.usage.prompt_tokens}")


def test_eight_concurrent_streams_match_solo_runs():
    solo = [stream_text(q, max_tokens=32) for q in QUESTIONS]
    results = [None] * len(QUESTIONS)
    barrier = threading.Barrier(len(QUESTIONS))

    def worker(i):
        barrier.wait()
        results[i] = stream_text(QUESTIONS[i], max_tokens=32)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(QUESTIONS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, (s, c) in enumerate(zip(solo, results)):
        assert c is not None, f"stream {i} failed"
        assert s[0].encode() == c[0].encode() and s[1] == c[1], (i, s, c)
    assert len({s[0] for s in solo}) == len(QUESTIONS), "distinct prompts should give distinct answers"
    m = metrics()
    print(f"   8 streams identical to solo runs; engine steps so far {m['kiln_engine_steps_total']:.0f}")


if __name__ == "__main__":
    run([test_models, test_chat, test_max_tokens_gives_length, test_streaming_matches_non_streaming_and_reports_usage,
         test_completions_text_and_token_prompts, test_stop_strings, test_seed_reproducibility, test_logprobs,
         test_context_limit_gives_length, test_prefix_reuse_same_output_fewer_tokens,
         test_eight_concurrent_streams_match_solo_runs])
