"""Providers that misbehave as real ones do, over real sockets: reasoning dropped or inline,
temperature/top_p ignored unless require_parameters routes around it, provider.ignore with
variants, enforce_distillable_text, and what the ledger says about each generation."""

from __future__ import annotations

import json

import pytest
from helpers import CLIENT, MODEL, body, post

from kimipipe.standin.answers import (
    PROVIDER_OWN_SAMPLING,
    answer_for_request,
    expected_answer,
)


def streamed(server, payload) -> list[dict]:
    with CLIENT.stream("POST", server.base_url + "/chat/completions",
                       json={**payload, "stream": True},
                       headers={"Authorization": f"Bearer {server.api_key}"}) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line.startswith("data: {")]
    return [json.loads(line[6:]) for line in lines]


def joined(chunks, field):
    return "".join(c["choices"][0]["delta"].get(field) or "" for c in chunks if c["choices"])


# -- reasoning dropped -----------------------------------------------------------------

def test_a_provider_drops_the_reasoning_at_its_rate_and_only_that_provider(standin):
    server = standin(drop_reasoning={"together": 0.5}, seed=4, ledger=True)
    dropped = []
    for i in range(60):
        req = body(f"question {i}", max_tokens=1000, provider={"only": ["together"]})
        out = post(server, req).json()
        msg, usage = out["choices"][0]["message"], out["usage"]
        full = answer_for_request(req)
        assert msg["content"] == full.content            # the same answer, reasoning lost
        if msg["reasoning"] is None:
            dropped.append(out["id"])
            assert "reasoning_details" not in msg
            assert usage["completion_tokens_details"]["reasoning_tokens"] == 0
            assert usage["completion_tokens"] == len(full.content_pieces)
            assert answer_for_request(req, drop_reasoning=True).content == msg["content"]
        else:
            assert msg["reasoning"] == full.reasoning
            assert usage["completion_tokens_details"]["reasoning_tokens"] == full.reasoning_tokens
    assert 15 <= len(dropped) <= 45
    assert server.stats()["quirks"] == {"drop_reasoning": len(dropped)}
    ledger = server.ledger()
    assert {g["generation_id"] for g in ledger if g.get("reasoning_dropped")} == set(dropped)
    assert all(g["provider"] == "Together" for g in ledger)
    # another provider keeps its reasoning; a request without reasoning is not "dropped"
    for i in range(10):
        msg = post(server, body(f"q {i}", max_tokens=1000, provider={"only": ["parasail"]})
                   ).json()["choices"][0]["message"]
        assert msg["reasoning"]
    post(server, body("no thinking", reasoning={"enabled": False}, max_tokens=100,
                      provider={"only": ["together"]}))
    assert server.stats()["quirks"] == {"drop_reasoning": len(dropped)}


def test_dropped_reasoning_streams_content_only_and_the_draw_is_seeded(standin):
    runs = []
    for _ in range(2):
        server = standin(drop_reasoning={"together": 1.0}, seed=9)
        req = body("stream without reasoning", max_tokens=1000, provider={"only": ["together"]})
        chunks = streamed(server, req)
        assert joined(chunks, "reasoning") == ""
        assert not any(c["choices"] and c["choices"][0]["delta"].get("reasoning_details")
                       for c in chunks)
        assert joined(chunks, "content") == answer_for_request(req).content
        assert chunks[-1]["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0
        server2 = standin(drop_reasoning={"together": 0.3}, seed=9)
        runs.append([post(server2, body(f"d{i}", max_tokens=300, provider={"only": ["together"]})
                          ).json()["choices"][0]["message"]["reasoning"] is None
                     for i in range(30)])
    assert runs[0] == runs[1] and any(runs[0]) and not all(runs[0])


# -- reasoning inline ------------------------------------------------------------------

def test_a_provider_puts_the_reasoning_inline_plain_and_streamed(standin):
    server = standin(inline_reasoning=["parasail"], ledger=True)
    req = body("think inline", max_tokens=1000, provider={"only": ["parasail"]})
    full = answer_for_request(req)
    want = f"<think>\n{full.reasoning}\n</think>\n\n{full.content}"
    out = post(server, req).json()
    msg = out["choices"][0]["message"]
    assert msg["content"] == want and msg["reasoning"] is None
    assert "reasoning_details" not in msg
    assert out["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0
    assert out["usage"]["completion_tokens"] == full.completion_tokens   # same bill
    chunks = streamed(server, req)
    assert joined(chunks, "content") == want and joined(chunks, "reasoning") == ""
    contents = [c["choices"][0]["delta"]["content"] for c in chunks
                if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert contents[0] == "<think>\n" and "\n</think>\n\n" in contents
    assert [g.get("reasoning_inline") for g in server.ledger()] == [True, True]
    assert server.stats()["quirks"] == {"inline_reasoning": 2}
    # reasoning cut by max_tokens, nothing after it: the </think> never comes
    cut = body("think inline", max_tokens=5, provider={"only": ["parasail"]})
    msg = post(server, cut).json()["choices"][0]["message"]
    assert msg["content"].startswith("<think>\n") and "</think>" not in msg["content"]
    # other providers answer as before
    msg = post(server, body("think inline", max_tokens=1000, provider={"only": ["together"]})
               ).json()["choices"][0]["message"]
    assert msg["reasoning"] == full.reasoning and msg["content"] == full.content


# -- sampling parameters ----------------------------------------------------------------

def test_answers_follow_the_sampling_applied():
    msgs = [{"role": "user", "content": "sampled"}]

    def answer(**kw):
        return expected_answer(msgs, model=MODEL, seed=None, reasoning=True, max_tokens=None,
                               **kw).content

    # the model's own values (thinking: 1.0 / 0.95) are the same as sending none
    assert answer(temperature=1.0, top_p=0.95) == answer() == answer(temperature=1.0)
    assert answer(temperature=0.3) != answer()
    assert answer(top_p=0.5) != answer() != answer(temperature=0.3, top_p=0.5)
    instant = expected_answer(msgs, model=MODEL, seed=None, reasoning=False, max_tokens=None,
                              temperature=0.6).content
    assert instant == expected_answer(msgs, model=MODEL, seed=None, reasoning=False,
                                      max_tokens=None).content


def test_a_provider_that_ignores_sampling_drops_it_unless_require_parameters(standin):
    server = standin(ignore_sampling=["together"], ledger=True)
    eps = CLIENT.get(server.base_url + "/models/moonshotai/kimi-k2.5/endpoints").json()
    supported = {e["tag"]: e["supported_parameters"] for e in eps["data"]["endpoints"]}
    assert "temperature" not in supported["together"] and "top_p" not in supported["together"]
    assert {"temperature", "top_p", "seed", "max_tokens"} <= set(supported["parasail"])
    req = body("sampled answer", max_tokens=1000, temperature=0.3)
    # served by the ignoring provider: its own sampling, an observably different answer
    out = post(server, {**req, "provider": {"only": ["together"]}}).json()
    ignored = answer_for_request(req, honours_sampling=False)
    assert out["choices"][0]["message"]["content"] == ignored.content
    assert ignored.content != answer_for_request(req).content
    # served by one that honours it
    out2 = post(server, {**req, "provider": {"only": ["parasail"]}}).json()
    assert out2["choices"][0]["message"]["content"] == answer_for_request(req).content
    first, second = server.ledger()
    assert (first["provider"], first["sampling"], first["sampling_dropped"]) == (
        "Together", PROVIDER_OWN_SAMPLING, ["temperature"])
    assert (second["provider"], second["sampling"], second["sampling_dropped"]) == (
        "Parasail", {"temperature": 0.3, "top_p": 0.95}, [])
    assert server.stats()["quirks"] == {"sampling_dropped": 1}
    # require_parameters: only endpoints that support every parameter sent
    strict = {**req, "provider": {"only": ["together"], "require_parameters": True}}
    r = post(server, strict)
    assert r.status_code == 404
    assert r.json()["error"]["availability"]["code"] == "constraint_filtered"
    served = {post(server, body(f"strict {i}", max_tokens=50, temperature=1.0, top_p=0.95,
                                provider={"require_parameters": True})).json()["provider"]
              for i in range(40)}
    assert "Together" not in served and len(served) >= 3
    # nothing sampled sent: require_parameters does not exclude it
    r = post(server, body("no sampling", max_tokens=50,
                          provider={"only": ["together"], "require_parameters": True}))
    assert r.status_code == 200
    # a parameter no endpoint supports leaves nothing
    r = post(server, body("verbose", max_tokens=50, verbosity="low",
                          provider={"require_parameters": True}))
    assert r.status_code == 404
    r = post(server, body("x", provider={"require_parameters": "yes"}))
    assert r.status_code == 400 and "require_parameters" in r.json()["error"]["message"]


def test_the_ledger_has_no_sampling_when_none_was_sent_or_ignored(standin):
    server = standin(ledger=True)
    post(server, body("plain", max_tokens=100, seed=3))
    [line] = server.ledger()
    assert "sampling" not in line and "reasoning_dropped" not in line
    assert line["provider"]


# -- routing: ignore with variants, distillation ----------------------------------------

@pytest.mark.parametrize("ignore, never", [
    (["deepinfra"], {"deepinfra", "deepinfra/turbo"}),       # a base slug takes its variants
    (["DEEPINFRA"], {"deepinfra", "deepinfra/turbo"}),
    (["deepinfra/turbo"], {"deepinfra/turbo"}),              # a variant only itself
    (["DeepInfra", "Fireworks", "baseten"], {"deepinfra", "deepinfra/turbo", "fireworks",
                                             "baseten"}),  # a provider name: all it covers
])
def test_provider_ignore_holds_under_load_balancing(standin, ignore, never):
    server = standin(ledger=True)
    for i in range(80):
        assert post(server, body(f"balanced {i}", max_tokens=20, provider={"ignore": ignore})
                    ).status_code == 200
    served = [line["endpoint"] for line in server.ledger()]  # the tag: answers name no endpoint
    assert not set(served) & never
    assert len(set(served)) >= 3
    if ignore == ["deepinfra/turbo"]:
        assert "deepinfra" in served


def test_distillable_model_and_the_switch(standin):
    server = standin()
    models = CLIENT.get(server.base_url + "/models").json()
    k25 = next(m for m in models["data"] if m["id"] == MODEL)
    assert k25["is_trainable_text"] is True
    assert k25["default_parameters"]["temperature"] == 1.0
    assert k25["default_parameters"]["top_p"] == 0.95
    assert MODEL in {m["id"] for m in CLIENT.get(server.base_url + "/models",
                                                 params={"distillable": "true"}).json()["data"]}
    req = body("distil me", max_tokens=50, provider={"enforce_distillable_text": True})
    assert post(server, req).status_code == 200
    server.configure(not_distillable=True)
    assert next(m for m in CLIENT.get(server.base_url + "/models").json()["data"]
                if m["id"] == MODEL)["is_trainable_text"] is False
    assert CLIENT.get(server.base_url + f"/model/{MODEL}").status_code == 404  # OpenRouter has none
    assert CLIENT.get(server.base_url + "/models", params={"distillable": "true"}
                      ).json() == {"data": [], "links": {"next": None}, "total_count": 0}
    r = post(server, req)
    assert r.status_code == 404
    err = r.json()["error"]
    assert err["message"].startswith("No endpoints found matching")
    assert err["availability"]["code"] == "constraint_filtered"
    assert err["availability"]["retryable"] is False
    assert "distillation" in err["availability"]["constraint"]
    assert err["metadata"]["provider_preferences"] == {"enforce_distillable_text": True}
    # without the preference the model is still served
    assert post(server, body("distil me", max_tokens=50)).status_code == 200
