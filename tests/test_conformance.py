"""The stand-in and kimipipe's requests against the official `openrouter` SDK's models.

The SDK's pydantic models (generated from OpenRouter's OpenAPI spec) are the schema of
record. Validation catches missing required fields and wrong types; pydantic ignores
unknown keys, so `unknown_keys` also walks each validated model alongside its JSON and
lists the keys the schema does not know. The only ones allowed are those the live
service sends although the spec omits them (DIALECT below): the stand-in cannot drift
into a dialect of its own.
"""

from __future__ import annotations

import json
import re

import httpx
import openrouter.components as orc
import openrouter.operations as orop
import pytest
from conftest import kp
from helpers import MODEL
from pydantic import BaseModel

from kimipipe.standin.testing import StandIn

# Sent by the live service, absent from the OpenAPI schema (see docs/openrouter.md).
DIALECT = {"$.provider", "$.choices[].native_finish_reason"}
# Documented in OpenRouter's reasoning guide, absent from the SDK's ChatRequestReasoning
# (which has only `effort` and `summary`).
REQUEST_DIALECT = {"$.reasoning.enabled", "$.reasoning.exclude"}


def unknown_keys(instance, data, path="$") -> set[str]:
    """JSON keys (as `$.a[].b` paths) that the validated model has no field for."""
    found: set[str] = set()
    if isinstance(instance, BaseModel) and isinstance(data, dict):
        names = {(f.alias or n): n for n, f in type(instance).model_fields.items()}
        for key, value in data.items():
            if key not in names:
                found.add(f"{path}.{key}")
            elif value is not None and type(getattr(instance, names[key])).__name__ == "Unset":
                # an optional field whose value failed validation: pydantic silently dropped it
                found.add(f"{path}.{key} (dropped: did not validate)")
            else:
                found |= unknown_keys(getattr(instance, names[key]), value, f"{path}.{key}")
    elif isinstance(instance, list) and isinstance(data, list):
        for a, b in zip(instance, data, strict=False):
            found |= unknown_keys(a, b, f"{path}[]")
    elif isinstance(instance, dict) and isinstance(data, dict):
        for key, value in data.items():
            if key in instance:
                found |= unknown_keys(instance[key], value, f"{path}.{key}")
    return found


def conforms(model: type[BaseModel], data: dict, allowed: set[str] = frozenset()) -> BaseModel:
    instance = model.model_validate(data)
    extra = unknown_keys(instance, data) - allowed
    assert not extra, f"keys {model.__name__} does not know: {sorted(extra)}"
    return instance


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with StandIn(workdir=tmp_path_factory.mktemp("conformance"), key_limit=50) as s:
        yield s


def auth(server):
    return {"Authorization": f"Bearer {server.api_key}"}


def kimipipe_request(text: str, **extra) -> dict:
    """The request kp-infer sends (docs/openrouter.md): routing to the official INT4 weights."""
    return {
        "model": MODEL,
        "messages": [{"role": "system", "content": "You are helpful."},
                     {"role": "user", "content": text}],
        "max_tokens": 16000, "temperature": 0.6, "seed": 1,
        "reasoning": {"enabled": True},
        "provider": {"ignore": ["fireworks", "baseten", "deepinfra/turbo"],
                     "quantizations": ["int4", "unknown"], "sort": "price",
                     "allow_fallbacks": True, "require_parameters": False,
                     "data_collection": "allow",
                     # strings, as the SDK's MaxPrice has them (USD per million tokens)
                     "max_price": {"prompt": "1", "completion": "4"}},
        **extra,
    }


@pytest.mark.parametrize("extra", [{}, {"max_tokens": 10}, {"max_tokens": 150},
                                   {"reasoning": {"enabled": False}}])
def test_plain_response_conforms_to_chat_result(server, extra):
    r = httpx.post(server.base_url + "/chat/completions", headers=auth(server),
                   json=kimipipe_request("Conform, please.", **extra))
    assert r.status_code == 200
    result = conforms(orc.ChatResult, r.json(), DIALECT)
    choice = result.choices[0]
    assert choice.finish_reason in ("stop", "length")
    assert result.usage.cost > 0
    assert result.usage.cost_details.upstream_inference_cost == result.usage.cost
    if "reasoning" not in extra:
        assert choice.message.reasoning_details[0].text == choice.message.reasoning


def test_stream_chunks_conform_to_chat_stream_chunk(server):
    with httpx.stream("POST", server.base_url + "/chat/completions", headers=auth(server),
                      json=kimipipe_request("Stream and conform", stream=True)) as r:
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1] if line.startswith("data: ")]
    parsed = [conforms(orc.ChatStreamChunk, c, DIALECT) for c in chunks]
    assert parsed[-1].choices == [] and parsed[-1].usage.total_tokens > 0
    assert any(p.choices and p.choices[0].delta.reasoning_details for p in parsed)
    # the SSE event as the SDK's stream wrapper sees it
    conforms(orc.ChatStreamingResponse, {"data": chunks[0]}, {"$.data.provider",
                                                              "$.data.choices[].native_finish_reason"})


def test_midstream_error_chunk_conforms(server):
    server.configure(faults={"midstream": 1.0})
    try:
        with httpx.stream("POST", server.base_url + "/chat/completions", headers=auth(server),
                          json=kimipipe_request("break midway", stream=True)) as r:
            lines = [line for line in r.iter_lines() if line.startswith("data: {")]
    finally:
        server.configure(faults={})
    last = conforms(orc.ChatStreamChunk, json.loads(lines[-1][6:]),
                    DIALECT | {"$.error.metadata.provider_name"})
    assert last.error.code == 502 and last.choices[0].finish_reason == "error"
    assert last.error.metadata.error_type == "provider_unavailable"


# /key's rate_limit and is_provisioning_key are required by the SDK, yet deprecated
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_money_endpoints_conform(server):
    out = httpx.post(server.base_url + "/chat/completions", headers=auth(server),
                     json=kimipipe_request("for the generation endpoint")).json()
    conforms(orop.GetCreditsResponse, httpx.get(server.base_url + "/credits",
                                                 headers=auth(server)).json())
    key = conforms(orop.GetCurrentKeyResponse,
                   httpx.get(server.base_url + "/key", headers=auth(server)).json())
    assert key.data.limit == 50 and key.data.limit_remaining < 50
    gen = conforms(orc.GenerationResponse, httpx.get(
        server.base_url + "/generation", params={"id": out["id"]}, headers=auth(server)).json())
    assert gen.data.total_cost == out["usage"]["cost"]
    assert gen.data.provider_name == out["provider"]


def test_endpoints_table_conforms(server):
    doc = httpx.get(server.base_url + "/models/moonshotai/kimi-k2.5/endpoints").json()
    parsed = conforms(orop.ListEndpointsResponse, doc)
    assert {e.quantization for e in parsed.data.endpoints} == {"int4", "nvfp4", "fp4",
                                                               "unknown"}


@pytest.mark.parametrize("case", ["401", "402", "404", "429", "400"])
def test_error_bodies_conform(server, case):
    models = {"400": orc.BadRequestResponseErrorData, "401": orc.UnauthorizedResponseErrorData,
              "402": orc.PaymentRequiredResponseErrorData, "404": orc.NotFoundResponseErrorData,
              "429": orc.TooManyRequestsResponseErrorData}
    headers = auth(server)
    request = kimipipe_request("errors")
    if case == "401":
        headers = {"Authorization": "Bearer nope"}
    elif case == "402":
        request["max_tokens"] = 10**9
    elif case == "404":
        request["provider"] = {"only": ["nobody"]}
    elif case == "400":
        request["messages"] = []
    else:
        server.configure(faults={"429": 1.0})
    try:
        r = httpx.post(server.base_url + "/chat/completions", headers=headers, json=request)
    finally:
        server.configure(faults={})
    assert r.status_code == int(case)
    body = r.json()
    assert set(body) == {"error"}
    # `availability` is documented (docs/openrouter.md) though the spec's error models lack it
    conforms(models[case], body["error"], {"$.availability"})
    assert re.fullmatch(r"\d+", str(body["error"]["code"]))


ALL_FLAGS = ("--ignore-provider", "fireworks", "--ignore-provider", "baseten",
             "--quantization", "int4", "--quantization", "unknown", "--sort", "price",
             "--no-fallbacks", "--data-collection", "deny", "--max-price-prompt", "1",
             "--max-price-completion", "4", "--max-tokens", "16000", "--temperature", "0.6",
             "--top-p", "0.95", "--seed", "1", "--reasoning", "--reasoning-effort", "high")


@pytest.mark.parametrize("stream", ["--stream", "--no-stream"])
def test_the_bodies_kp_infer_sends_conform_to_chat_request(tmp_path, stream):
    """Not a hand-written sample: the bodies the stand-in received from kp-infer, run as a
    user runs it with every request and routing flag set."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps(
        {"id": f"c{i}", "dataset": "B3",
         "messages": [{"role": "system", "content": "Be brief."},
                      {"role": "user", "content": f"Conform {i}"}]}) + "\n" for i in range(3)))
    with StandIn(workdir=tmp_path / "standin", request_log=True) as server:
        r = kp("infer", prompts, "-o", tmp_path / "r.jsonl", "--base-url", server.base_url,
               stream, *ALL_FLAGS, env={"OPENROUTER_API_KEY": server.api_key})
        bodies = server.requests()
    assert r.code == 0, r.stderr
    assert len(bodies) == 3
    for body in bodies:
        parsed = conforms(orc.ChatRequest, body, REQUEST_DIALECT)
        # the FP4 variant under DeepInfra's name, kept out by its tag (an answer names the
        # provider, never the endpoint: docs/openrouter.md, variants)
        assert parsed.provider.ignore == ["fireworks", "baseten", "deepinfra/turbo"]
        assert parsed.provider.max_price.prompt == "1" and parsed.provider.max_price.completion == "4"
        assert parsed.stream is (stream == "--stream") and parsed.max_tokens == 16000
        assert parsed.reasoning.effort == "high" and body["reasoning"]["enabled"] is True


@pytest.mark.parametrize("policy", ["drop", "keep"])
def test_a_conversations_bodies_conform_to_chat_request(tmp_path, policy):
    """A conversation's later turns: `session_id` in the body, the earlier answers as
    assistant messages (with `reasoning` under --history-reasoning keep)."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps(
        {"id": f"c{i}", "dataset": "B3", "messages": [{"role": "user", "content": f"Conform {i}"}],
         "follow_ups": ["and then?", "and after that?"]}) + "\n" for i in range(2)))
    with StandIn(workdir=tmp_path / "standin", request_log=True) as server:
        r = kp("infer", prompts, "-o", tmp_path / "r.jsonl", "--base-url", server.base_url,
               "--history-reasoning", policy, env={"OPENROUTER_API_KEY": server.api_key})
        bodies = server.requests()
    assert r.code == 0, r.stderr
    assert len(bodies) == 6
    for body in bodies:
        parsed = conforms(orc.ChatRequest, body, REQUEST_DIALECT)
        assert parsed.session_id == body["session_id"] in ("c0", "c1")
        assistants = [m for m in parsed.messages if m.role == "assistant"]
        assert len(assistants) == (len(body["messages"]) - 1) // 2
        assert all(bool(m.reasoning) is (policy == "keep") for m in assistants)


# -- the credit limits and provider quirks --------------------------------------------------

@pytest.fixture(scope="module")
def limits_server(tmp_path_factory):
    """Every limit on: a $1 balance with an in-flight budget of half of it that keeps
    finished requests for an hour, a key limit, workspace and guardrail budgets, a
    moderation marker, and the three provider quirks."""
    with StandIn(workdir=tmp_path_factory.mktemp("conformance-limits"), balance=1.0,
                 inflight_ratio=0.5, settle=3600, key_limit=0.9, workspace_budget=0.95,
                 guardrail_budget=0.99, limit_reset="daily", moderation_marker="FLAGME",
                 drop_reasoning={"together": 1.0}, inline_reasoning=["parasail"],
                 ignore_sampling=["deepinfra"]) as s:
        yield s


def post_to(server, request, **kw):
    return httpx.post(server.base_url + "/chat/completions", headers=auth(server),
                      json=request, **kw)


def limits_request(text: str, max_tokens: int, **provider) -> dict:
    return kimipipe_request(text, max_tokens=max_tokens,
                            provider={"only": ["together"], "require_parameters": False,
                                      **provider})


def test_the_default_bodies_require_parameters_and_distillation_and_conform(tmp_path):
    """kp-infer's default run for Kimi K2.5, as the stand-in received it: the preset's served
    sampling with provider.require_parameters, distillation enforced
    (enforce_distillable_text), and --max-price-* as the strings the SDK's MaxPrice wants
    (a number would make the SDK drop the whole provider object: `conforms` says so). And
    `conforms` names a key the schema does not know in such a body."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps(
        {"id": f"d{i}", "dataset": "B3", "messages": [{"role": "user", "content": f"Default {i}"}]})
        + "\n" for i in range(2)))
    with StandIn(workdir=tmp_path / "standin", request_log=True) as server:
        r = kp("infer", prompts, "-o", tmp_path / "r.jsonl", "--base-url", server.base_url,
               "--max-price-prompt", "1.5", env={"OPENROUTER_API_KEY": server.api_key})
        bodies = server.requests()
    assert r.code == 0, r.stderr
    assert len(bodies) == 2
    for body in bodies:
        parsed = conforms(orc.ChatRequest, body, REQUEST_DIALECT)
        assert parsed.temperature is not None and parsed.top_p is not None  # the preset's
        assert parsed.provider.require_parameters is True
        assert parsed.provider.enforce_distillable_text is True
        assert parsed.provider.max_price.prompt == "1.5"
    # the check itself: a key the schema lacks, in a body kp-infer sent (--extra-body), is named
    with StandIn(workdir=tmp_path / "standin-extra", request_log=True) as server:
        r = kp("infer", prompts, "-o", tmp_path / "x.jsonl", "--base-url", server.base_url,
               "--extra-body", '{"provider": {"prefer": ["together"]}}',
               env={"OPENROUTER_API_KEY": server.api_key})
        bodies = server.requests()
    assert bodies, r.stderr
    with pytest.raises(AssertionError, match=r"\$\.provider\.prefer"):
        conforms(orc.ChatRequest, bodies[0], REQUEST_DIALECT)


def test_every_402_of_the_credit_limits_conforms(limits_server):
    s = limits_server
    bodies = {}
    # one request larger than the in-flight budget ($0.5)
    r = post_to(s, limits_request("weight", 200_000))
    bodies["weight_exceeds_budget"] = r
    # the first big one fits and then settles for an hour; the second does not fit beside it
    assert post_to(s, limits_request("first", 150_000)).status_code == 200
    r = post_to(s, limits_request("second", 150_000))
    bodies["in_flight_budget_exhausted"] = r
    assert int(r.headers["Retry-After"]) >= 1
    for reason, r in bodies.items():
        assert r.status_code == 402
        err = conforms(orc.PaymentRequiredResponseErrorData, r.json()["error"])
        assert err.code == 402 and err.metadata["reason"] == reason
    assert bodies["weight_exceeds_budget"].json()["error"]["metadata"]["limit_source"] == \
        "openrouter_credits"
    assert bodies["in_flight_budget_exhausted"].json()["error"]["metadata"]["limit_source"] == \
        "openrouter_in_flight_budget"
    used = s.stats()["total_usage"]
    try:
        s.configure(key_limit=used + 0.001, inflight_ratio=None)   # the key's remaining binds
        r = post_to(s, limits_request("key binds", 10_000))
        assert r.status_code == 402
        err = conforms(orc.PaymentRequiredResponseErrorData, r.json()["error"])
        assert err.metadata["limit_source"] == "openrouter_key_limit"
        s.configure(balance=used)                                   # the balance gone
        r = post_to(s, limits_request("broke", 100))
        assert r.status_code == 402
        err = conforms(orc.PaymentRequiredResponseErrorData, r.json()["error"])
        assert err.metadata == {"limit_source": "openrouter_credits"}
    finally:
        s.configure(balance=1.0, key_limit=0.9, inflight_ratio=0.5)


@pytest.mark.parametrize("status", [403, 402])
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_every_budget_refusal_conforms_and_key_lists_the_budgets(limits_server, status):
    s = limits_server
    used = s.stats()["total_usage"]
    models = {403: orc.ForbiddenResponseErrorData, 402: orc.PaymentRequiredResponseErrorData}
    layers = [("guardrail_budget", "openrouter_guardrail_budget"),
              ("workspace_budget", "openrouter_workspace_budget"),
              ("key_limit", "openrouter_key_limit")]
    try:
        s.configure(limit_status=status, **{name: used for name, _ in layers})
        key = conforms(orop.GetCurrentKeyResponse,
                       httpx.get(s.base_url + "/key", headers=auth(s)).json())
        assert [b.scope for b in key.data.budgets] == ["api_key", "workspace", "key_limit"]
        assert key.data.effective_budget.scope == "api_key"
        assert key.data.limit_reset == "daily" and key.data.limit_remaining == 0
        for name, source in layers:
            r = post_to(s, limits_request("over budget", 100))
            assert r.status_code == status
            err = conforms(models[status], r.json()["error"])
            assert err.message == "Budget limit exceeded"
            assert err.metadata["limit_source"] == source
            assert set(err.metadata) == {"limit_source", "scope", "limit_usd", "spend_usd",
                                         "resets_at"}
            s.configure(**{name: used + 1})
    finally:
        s.configure(limit_status=402, key_limit=0.9, workspace_budget=0.95,
                    guardrail_budget=0.99)


def test_moderation_403_conforms(limits_server):
    r = post_to(limits_server, limits_request("please FLAGME now", 100))
    assert r.status_code == 403
    err = conforms(orc.ForbiddenResponseErrorData, r.json()["error"])
    assert "limit_source" not in err.metadata and err.metadata["reasons"]
    assert err.metadata["flagged_input"] == "please FLAGME now"


def test_no_route_for_distillation_conforms(limits_server):
    try:
        limits_server.configure(not_distillable=True)
        r = post_to(limits_server, kimipipe_request(
            "distil", provider={"enforce_distillable_text": True}))
    finally:
        limits_server.configure(not_distillable=False)
    assert r.status_code == 404
    err = conforms(orc.NotFoundResponseErrorData, r.json()["error"], {"$.availability"})
    assert r.json()["error"]["availability"]["code"] == "constraint_filtered"
    assert err.code == 404


def test_models_documents_conform(limits_server):
    # `is_trainable_text`: the property OpenRouter's distillation guide names; the SDK's
    # Model lacks it (its GET /models has the `distillable` filter instead)
    listed = conforms(orc.ModelsListResponse,
                      httpx.get(limits_server.base_url + "/models").json(),
                      {"$.data[].is_trainable_text"})
    assert MODEL in {m.id for m in listed.data} and listed.total_count == len(listed.data)
    one = next(m for m in listed.data if m.id == MODEL)
    assert one.default_parameters.temperature == 1.0
    # OpenRouter has no GET /model/{slug}: kp-infer reads the list, and so must its tests
    assert httpx.get(limits_server.base_url + f"/model/{MODEL}").status_code == 404
    doc = conforms(orop.ListEndpointsResponse, httpx.get(
        limits_server.base_url + "/models/moonshotai/kimi-k2.5/endpoints").json())
    deepinfra = {e.tag: e.supported_parameters for e in doc.data.endpoints}["deepinfra"]
    assert "temperature" not in deepinfra and "max_tokens" in deepinfra


def test_quirky_answers_conform(limits_server):
    dropped = post_to(limits_server, limits_request("dropped", 500))
    result = conforms(orc.ChatResult, dropped.json(), DIALECT)
    assert result.choices[0].message.reasoning is None
    inline = kimipipe_request("inline", max_tokens=500, stream=True,
                              provider={"only": ["parasail"]})
    with httpx.stream("POST", limits_server.base_url + "/chat/completions",
                      headers=auth(limits_server), json=inline) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines()
                  if line.startswith("data: {")]
    parsed = [conforms(orc.ChatStreamChunk, c, DIALECT) for c in chunks]
    assert parsed[0].choices[0].delta.content == "<think>\n"


# -- the wire's documented variants ---------------------------------------------------------

def stream_lines(server, request) -> list[str]:
    with httpx.stream("POST", server.base_url + "/chat/completions", headers=auth(server),
                      json=request) as r:
        return [line for line in r.iter_lines() if line]


def test_usage_on_the_finish_chunk_conforms(server):
    """OpenRouter's second stream shape: the usage rides on a last finish chunk whose one
    choice has an empty delta and repeats finish_reason."""
    server.configure(stream_usage="finish-chunk")
    try:
        lines = stream_lines(server, kimipipe_request("finish chunk", stream=True))
    finally:
        server.configure(stream_usage="own-chunk")
    assert lines[-1] == "data: [DONE]"
    parsed = [conforms(orc.ChatStreamChunk, json.loads(line[6:]), DIALECT)
              for line in lines[:-1] if line.startswith("data: ")]
    last = parsed[-1]
    assert len(last.choices) == 1 and last.choices[0].finish_reason == "stop"
    assert json.loads(lines[-2][6:])["choices"][0]["delta"] == {} and last.usage.cost > 0
    assert sum(p.usage is not None for p in parsed) == 1


@pytest.mark.parametrize("code", ["429", "408", "provider_overloaded", "server_error"])
def test_midstream_errors_with_4xx_and_string_codes(server, code):
    server.configure(faults={"midstream": 1.0}, midstream_code=code)
    try:
        lines = [line for line in stream_lines(server, kimipipe_request(f"break {code}", stream=True))
                 if line.startswith("data: {")]
    finally:
        server.configure(faults={}, midstream_code="502")
    chunk = json.loads(lines[-1][6:])
    assert chunk["choices"][0]["finish_reason"] == "error"
    if code.isdigit():
        last = conforms(orc.ChatStreamChunk, chunk, DIALECT | {"$.error.metadata.provider_name"})
        assert last.error.code == int(code)
    else:
        # OpenRouter's errors docs show string codes mid-stream; the SDK types `code` as
        # int, so this one field is checked against the docs, the rest against the SDK
        assert chunk["error"]["code"] == code
        conforms(orc.ChatStreamChunk, {**chunk, "error": {**chunk["error"], "code": 0}},
                 DIALECT | {"$.error.metadata.provider_name"})


AVAILABILITY_MODELS = {400: orc.BadRequestResponseErrorData, 403: orc.ForbiddenResponseErrorData,
                       404: orc.NotFoundResponseErrorData, 429: orc.TooManyRequestsResponseErrorData,
                       503: orc.ServiceUnavailableResponseErrorData}
AVAILABILITY_KEYS = {"code", "retryable", "retry_after", "requested_models", "affected_providers",
                     "excluded_by", "fallback_models", "constraint", "docs_url"}


@pytest.mark.parametrize("code", ["model_deprecated", "no_endpoints", "constraint_filtered",
                                  "privacy_restricted", "region_restricted",
                                  "capacity_exhausted", "temporarily_unavailable"])
def test_availability_bodies_conform(server, code):
    from kimipipe.standin.availability import AVAILABILITY
    server.configure(unavailable=code)
    try:
        r = httpx.post(server.base_url + "/chat/completions", headers=auth(server),
                       json=kimipipe_request(f"unavailable {code}"))
    finally:
        server.configure(unavailable=None)
    status, retryable, _ = AVAILABILITY[code]
    assert r.status_code == status
    err = r.json()["error"]
    conforms(AVAILABILITY_MODELS[status], err, {"$.availability"})
    avail = err["availability"]
    assert set(avail) == AVAILABILITY_KEYS
    assert avail["code"] == code and avail["retryable"] is retryable
    assert avail["requested_models"] == [MODEL] and avail["affected_providers"]
    assert (avail["retry_after"] is not None) is retryable
    assert ("Retry-After" in r.headers) is retryable


def test_endpoints_table_with_nulls_conforms(server):
    """The nulls and missing keys the live table has. `supported_parameters: null` is the one
    the SDK does not allow (it types a list): named here, the rest checked by the SDK."""
    server.configure(endpoint_nulls=True)
    try:
        doc = httpx.get(server.base_url + "/models/moonshotai/kimi-k2.5/endpoints").json()
    finally:
        server.configure(endpoint_nulls=False)
    endpoints = doc["data"]["endpoints"]
    assert [e["tag"] for e in endpoints if e["supported_parameters"] is None] == ["parasail"]
    for e in endpoints:
        if e["supported_parameters"] is None:
            e["supported_parameters"] = []
    parsed = conforms(orop.ListEndpointsResponse, doc)
    assert None in {e.quantization for e in parsed.data.endpoints}
    assert {e.max_completion_tokens for e in parsed.data.endpoints} == {None}
    # a variant under its provider's own name, told apart by its tag
    assert {e.tag for e in parsed.data.endpoints if e.provider_name == "DeepInfra"} == {
        "deepinfra", "deepinfra/turbo"}


# -- the self-hosted modes, through the `openai` SDK (docs/servers.md) ----------------------
# A vLLM or SGLang server is reached with the OpenAI API, so the `openai` client is the one
# that must accept what the stand-in answers: its own request, SSE parsing and types. Those
# types allow extra keys; every key they do not know must be one the vendor's own protocol
# declares, with the vendor's type. The vendor models below copy those declarations:
#   vLLM: vllm/entrypoints/openai/chat_completion/protocol.py (ChatCompletionResponse,
#     ChatCompletionResponseChoice, ChatCompletionStreamResponse,
#     ChatCompletionResponseStreamChoice, ChatMessage) and engine/protocol.py (DeltaMessage);
#     its reasoning field is `reasoning` since v0.11.2 ("reasoning used to be called
#     reasoning_content", docs/features/reasoning_outputs.md), `reasoning_content` before.
#   SGLang: python/sglang/srt/entrypoints/openai/protocol.py (ChatCompletionResponse with
#     `sglext`, ChatCompletionResponseChoice with `matched_stop`, ChatMessage and
#     DeltaMessage with `reasoning_content`) and serving_chat.py `_build_chat_response` /
#     the stream's sglext chunk (`input_ids`, one `output_ids` list per choice).
class _Vendor(BaseModel):
    model_config = {"extra": "forbid"}


class VllmResponseExtra(_Vendor):
    prompt_token_ids: list[int] | None = None
    prompt_logprobs: list | None = None
    kv_transfer_params: dict | None = None


class VllmChoiceExtra(_Vendor):
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None


class VllmMessageExtra(_Vendor):
    reasoning: str | None = None
    reasoning_content: str | None = None


class SglExt(_Vendor):
    input_ids: list[int] | None = None
    output_ids: list[list[int]] | None = None


class SglangResponseExtra(_Vendor):
    sglext: SglExt | None = None
    metadata: dict | None = None


class SglangChoiceExtra(_Vendor):
    matched_stop: int | str | None = None
    prompt_token_ids: list[int] | None = None  # its older return_token_ids, per choice
    token_ids: list[int] | None = None
    hidden_states: object | None = None
    meta_info: dict | None = None


class SglangMessageExtra(_Vendor):
    reasoning_content: str | None = None


VENDOR = {"vllm": (VllmResponseExtra, VllmChoiceExtra, VllmMessageExtra),
          "sglang": (SglangResponseExtra, SglangChoiceExtra, SglangMessageExtra)}


def vendor_fields(mode: str, parsed) -> tuple:
    """The keys the `openai` type left over at each level (a ChatCompletion, or a chunk),
    validated against the vendor's declarations: (response, [choice], [message or delta])."""
    response, choice, message = VENDOR[mode]
    extras = (response.model_validate(parsed.model_extra or {}),
              [choice.model_validate(c.model_extra or {}) for c in parsed.choices],
              [message.model_validate((getattr(c, "message", None) or c.delta).model_extra or {})
               for c in parsed.choices])
    return extras


@pytest.mark.parametrize("mode", ["vllm", "sglang"])
def test_self_hosted_answers_parse_with_the_openai_sdk(standin, mode):
    """Plain and streamed, with the token IDs each server gives (vLLM's return_token_ids,
    SGLang's sglext, and SGLang's older per-choice return_token_ids on a plain answer)."""
    import openai
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    server = standin(mode=mode, noncanonical=0.0)
    client = openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0, timeout=30)
    asked = ({"return_token_ids": True} if mode == "vllm" else
             {"return_input_ids_in_sglext": True, "return_output_ids_in_sglext": True})
    args = {"model": MODEL, "messages": [{"role": "user", "content": "hello 東京"}],
            "max_tokens": 400, "extra_body": {**asked, "chat_template_kwargs": {"thinking": True}}}

    plain = client.chat.completions.create(**args)
    assert isinstance(plain, ChatCompletion) and plain.object == "chat.completion"
    top, [choice], [message] = vendor_fields(mode, plain)
    assert plain.choices[0].message.role == "assistant" and plain.choices[0].message.content
    assert plain.choices[0].finish_reason in ("stop", "length") and plain.usage.completion_tokens
    field = "reasoning" if mode == "vllm" else "reasoning_content"  # (vLLM since v0.11.2)
    assert getattr(message, field) and not getattr(message, "reasoning_content" if mode == "vllm"
                                                   else "reasoning", None)
    if mode == "vllm":
        prompt_ids, output_ids = top.prompt_token_ids, choice.token_ids
    else:
        prompt_ids, [output_ids] = top.sglext.input_ids, top.sglext.output_ids
        stop = choice.matched_stop  # the token that ended the turn (<|im_end|>) on a stop
        assert (stop is not None) == (plain.choices[0].finish_reason == "stop")
    assert prompt_ids and output_ids and plain.usage.completion_tokens == len(output_ids)

    chunks = list(client.chat.completions.create(
        **args, stream=True, stream_options={"include_usage": True}))
    assert all(isinstance(c, ChatCompletionChunk) for c in chunks)
    fields = [vendor_fields(mode, c) for c in chunks]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasoning = "".join(getattr(m[0], field) or "" for _, _, m in fields if m)
    assert (text, reasoning) == (plain.choices[0].message.content, getattr(message, field))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(output_ids)
    if mode == "vllm":  # prompt IDs on the first chunk, each chunk's own IDs on its choice
        assert fields[0][0].prompt_token_ids == prompt_ids
        assert [i for _, cs, _ in fields for c in cs for i in c.token_ids] == output_ids
    else:  # one chunk of its own, no choices, with the whole sglext; none per choice
        [ext] = [f[0].sglext for f in fields if f[0].sglext is not None]
        assert ext == top.sglext
        assert not any(c.token_ids for _, cs, _ in fields for c in cs)
        finish = [c.choices[0] for c in chunks if c.choices and c.choices[0].finish_reason]
        assert [vendor_fields(mode, c)[1][0].matched_stop for c in chunks
                if c.choices and c.choices[0].finish_reason] == [stop] * len(finish)
        old = client.chat.completions.create(**{**args, "extra_body": {
            "return_token_ids": True, "chat_template_kwargs": {"thinking": True}}})
        _, [old_choice], _ = vendor_fields(mode, old)
        assert (old_choice.prompt_token_ids, old_choice.token_ids) == (prompt_ids, output_ids)
        assert "sglext" not in (old.model_extra or {})


# -- token logprobs (docs/openrouter.md, "Token logprobs") ------------------------------------

@pytest.fixture(scope="module")
def logprobs_server(tmp_path_factory):
    with StandIn(workdir=tmp_path_factory.mktemp("logprobs"), noncanonical=1.0,
                 logprobs={"together": "all", "moonshotai": "content",
                           "parasail": "null-bytes"}) as s:
        yield s


def test_a_request_asking_for_logprobs_conforms():
    from kimipipe.openrouter.request import RequestOptions
    from kimipipe.openrouter.routing import Policy
    from kimipipe.records import Message, Prompt

    prompt = Prompt(id="x", dataset="D", messages=[Message(role="user", content="hi")])
    body = json.loads(RequestOptions(require_logprobs=True).body(prompt, Policy()))
    parsed = conforms(orc.ChatRequest, body, REQUEST_DIALECT)
    assert parsed.logprobs is True and parsed.top_logprobs == 0
    assert parsed.provider.require_parameters is True


@pytest.mark.parametrize("provider, covers", [("together", "answer"), ("moonshotai", "content"),
                                              ("parasail", "answer")])
def test_logprobs_chunks_and_bodies_decode_with_both_sdks(logprobs_server, provider, covers):
    """Each streamed chunk and the plain body, with `logprobs.content` as the schema gives
    it, decode with the `openrouter` SDK's models and the `openai` SDK's types; the tokens
    (bytes, or the string where bytes is null) spell the answer, or its content where the
    provider's logprobs cover the content only; kimipipe's client reads them the same."""
    import openai.types.chat as oai

    from kimipipe.openrouter.answer import StreamAnswer, read_plain

    request = kimipipe_request("Logprobs: 6 x 7 = 42, 数据 🙂", logprobs=True, top_logprobs=0,
                               provider={"only": [provider]})
    lines = stream_lines(logprobs_server, {**request, "stream": True})
    payloads = [line[6:] for line in lines if line.startswith("data: ")]
    assert payloads[-1] == "[DONE]"
    tokens, reasoning, content = [], [], []
    for payload in payloads[:-1]:
        chunk = json.loads(payload)
        ours = conforms(orc.ChatStreamChunk, chunk, DIALECT)
        theirs = oai.ChatCompletionChunk.model_validate(chunk)
        for a, b in zip(ours.choices, theirs.choices, strict=True):
            if b.logprobs is not None and b.logprobs.content:
                assert [t.token for t in a.logprobs.content] == [t.token for t in b.logprobs.content]
                assert [t.bytes_ for t in a.logprobs.content] == [t.bytes for t in b.logprobs.content]
                tokens += b.logprobs.content
            reasoning.append(chunk["choices"][0]["delta"].get("reasoning") or "")
            content.append(b.delta.content or "")
    text = "".join(reasoning) + "".join(content) if covers == "answer" else "".join(content)
    joined = b"".join(bytes(t.bytes) if t.bytes is not None else t.token.encode() for t in tokens)
    assert joined == text.encode() and all(t.top_logprobs == [] for t in tokens)
    nulls = sum(t.bytes is None for t in tokens)
    if provider == "parasail":  # null where the token string is whole UTF-8, bytes where not
        assert 0 < nulls < len(tokens)
    else:
        assert nulls == 0
    answer = StreamAnswer()
    for payload in payloads:
        got = answer.event(payload.encode())
    assert (got.token_spells, len(got.token_lengths), got.token_nulls) == (covers, len(tokens), nulls)
    plain = httpx.post(logprobs_server.base_url + "/chat/completions", headers=auth(logprobs_server),
                       json=request)
    body = plain.json()
    conforms(orc.ChatResult, body, DIALECT)
    assert len(oai.ChatCompletion.model_validate(body).choices[0].logprobs.content) == len(tokens)
    read = read_plain(plain.content)
    assert (read.token_spells, read.token_lengths) == (covers, got.token_lengths)
