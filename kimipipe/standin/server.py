"""The stand-in's HTTP server: OpenRouter's wire format, billing and failures on loopback.

One aiohttp application, one event loop. The hot path (a completion) does no heavy work:
the answer is a few hundred words from a seeded RNG, stream chunks are assembled from
pre-encoded byte templates, and access logging is off, so one core carries thousands of
slow connections. This module holds every check that can refuse a completion; serving an
accepted one is `jobs.py`, the metadata endpoints `metadata.py`, the 402/403 bodies and
the in-flight ledger `refusals.py`, the settings `config.py`. It runs past 400 lines on
purpose: the order of checks below is OpenRouter's, and it is reviewed in one place.

Order of checks for `POST /api/v1/chat/completions`, as OpenRouter does it:
auth (401) -> body (400) -> model (400) -> session_id (400 past 256 characters; it keys
the load-balanced draw and the prompt cache: sessions.py) -> budget layers: guardrail, workspace, key limit
spent (402, or 403 with --limit-status 403) -> balance gone (402) -> routing (400/404,
including require_parameters and enforce_distillable_text) -> moderation marker (403) ->
one request's worst case against what it may reserve (402 weight_exceeds_budget, or the
key limit's 402) -> in-flight budget (402 in_flight_budget_exhausted + Retry-After; else
the worst case is reserved until the request ends + --settle) -> fault draw -> the
provider's quirks (dropped/inline reasoning, ignored sampling, an impostor serving another
model: impostors.py, an honest stack's prompt overcount: --usage-offset) -> its token logprobs (logprobs.py, `--logprobs`) -> answer (with
latency and token rate) -> charge -> last chunk. Every 402/403 is counted in stats `refusals` by
status and reason (or limit_source, or "moderation").

Every generation id begins `gen-standin-` (OpenRouter's: `gen-<unix time>-<random>`): the
stand-in's mark on its answers, a plain string id as the schema has it, so that offline
filler is never taken for a real answer (kimipipe/recorded/api.py).

The ledger (`--ledger`) has one line per charged generation: generation_id, provider (the
name of the endpoint that served it), endpoint (its tag: one name can cover several), model, prompt/completion/reasoning tokens, cost, finish_reason,
request_user_text_sha256, and, when the request sent temperature or top_p or the provider
ignores them, `sampling` (the temperature/top_p applied) and `sampling_dropped` (the names
sent but not applied); `reasoning_dropped: true` / `reasoning_inline: true` when a quirk
changed the answer; `fault: "usagecut"` on an answer whose stream was cut after its usage.

Faults (`--fault KIND=RATE`; one seeded draw per accepted request, rates sum to <= 1;
a fault never charges, except `misroute` and `usagecut`, which serve a real, billed answer):
    429 500 502 503 524 529  that status with an error body (429: Retry-After header and
                             error.availability {retryable, retry_after})
    error200   HTTP 200, top-level `error`, no `choices` (stream: one such chunk, no [DONE])
    empty      HTTP 200, `choices: []`, no error, no usage (stream: one such chunk, [DONE])
    midstream  stream: half the tokens, then a chunk with `error` and finish_reason
               "error", then the stream ends (no [DONE]); plain: like error200
    cut        the connection is aborted mid-body (stream: after half the tokens; plain:
               after half the JSON, whose Content-Length promised all of it)
    usagecut   stream: the whole answer and its usage, then the connection is aborted
               before `data: [DONE]` (billed: the answer is whole); plain: no fault
    hang       headers, then no byte at all (no keep-alive either) for --hang-seconds,
               then the connection is aborted
    heartbeat  stream: `: OPENROUTER PROCESSING` comments forever, never data; plain: a hang
    misroute   served by an endpoint the request's preferences excluded (a no-op, and not
               counted, when nothing was excluded)
    moderation 403 with metadata {reasons, flagged_input, provider_name, model_slug}, no
               limit_source (nothing reserved stays settling)
    zero       HTTP 200, one choice with empty content and a null finish_reason, usage with
               0 completion tokens at $0: zero-completion insurance, not billed (billing.py)

Billing (billing.py): the price that applies (pricing overrides, discounts), and the share
of answers whose usage shows no cost (`--no-cost`) or no usage at all (`--no-usage`), the
cost then in /generation only (after `--generation-delay`).
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections import Counter
from dataclasses import replace

from aiohttp import web

from ..recorded.api import STANDIN_GENERATION_PREFIX
from .answers import (
    SAMPLING_PARAMETERS,
    THINK_OPEN,
    answer_for_request,
    applied_sampling,
    count_prompt_tokens,
    last_user_text,
    wants_reasoning,
)
from .availability import availability, unavailable_error
from .billing import billed_prices
from .config import CREDITS_MODES, DEFAULT_NONCANONICAL, FAULT_KINDS, Config, changed
from .impostors import Impostors, impostor_body
from .jobs import Job
from .metadata import MetadataEndpoints
from .providers import (
    DISTILLABLE,
    MODELS,
    RoutingError,
    StandinEndpoint,
    matches_any,
    request_parameters,
    route,
)
from .refusals import (
    BudgetLayer,
    InFlight,
    balance_gone,
    budget_exceeded,
    budget_layers,
    flagged,
    in_flight_budget_exhausted,
    moderation,
    weight_exceeds_budget,
)
from .sessions import MAX_SESSION_ID, Sessions, session_of
from .wire import GenerationStats, error_response, json_response

__all__ = ["CREDITS_MODES", "FAULT_KINDS", "Config", "StandinState"]

STATUS_FAULTS = {
    "429": "Rate limit exceeded",
    "500": "Internal Server Error",
    "502": "Provider returned error",
    "503": "Service Unavailable: no instances available for this model",
    "524": "Provider timed out",
    "529": "Provider overloaded",
}
STATUS_ERROR_TYPES = {"429": "rate_limit_exceeded", "500": "server", "502": "provider_unavailable",
                      "503": "provider_unavailable", "524": "timeout", "529": "provider_overloaded"}
DEFAULT_MAX_COMPLETION = 262144
# Request headers counted in stats `completion_headers` (by value; "(none)" when absent).
WATCHED_HEADERS = ("X-OpenRouter-Title", "X-Title", "X-OpenRouter-Cache", "HTTP-Referer")


class HTTPDone(Exception):
    """Raised inside the completion handler to answer with a ready response."""

    def __init__(self, response: web.StreamResponse):
        self.response = response


class StandinState(MetadataEndpoints):
    """The server's state: config, balance, counters, remembered generations, ledger."""

    def __init__(self, config: Config):
        config.check()
        self.config = config
        self.usage = 0.0
        self.charged = 0
        self.requests = 0
        self.completions_started = 0
        self.held = 0                       # requests waiting at the hold_after gate
        self.abandoned = 0                  # fault-free answers whose client went away
        self._gate = asyncio.Event()        # set (and replaced) whenever the config changes
        self.in_flight = 0
        self.max_in_flight = 0
        self.faults: Counter[str] = Counter()
        self.statuses: Counter[str] = Counter()
        self.endpoint_requests: Counter[str] = Counter()
        # completions by the value of the request headers that change what OpenRouter does
        self.completion_headers: dict[str, Counter[str]] = {h: Counter() for h in WATCHED_HEADERS}
        # the client behind each completion and /generation read, by User-Agent
        self.user_agents: dict[str, Counter[str]] = {"completions": Counter(), "generation": Counter()}
        self.generations: dict[str, GenerationStats] = {}
        self.rng = random.Random(config.seed)
        self.quirk_rng = random.Random(f"quirks|{config.seed}")   # apart from the fault draws
        self.billing_rng = random.Random(f"billing|{config.seed}")  # what usage shows (billing.py)
        self.generation_ended: dict[str, float] = {}  # generation id -> when it ended (/generation)
        self._ids = random.Random()
        self.inflight = InFlight()
        self.refusals: dict[str, Counter[str]] = {"402": Counter(), "403": Counter()}
        self.quirks: Counter[str] = Counter()
        self.sessions = Sessions()  # sticky routing and the prompt cache (session_id)
        self._ledger = open(config.ledger, "a", encoding="utf-8") if config.ledger else None
        self._request_log = open(config.request_log, "ab") if config.request_log else None
        self.token_source = None  # token logprobs' tokenizer (logprobs.py), loaded when first asked
        self.counter = None
        if config.tokenizer:
            from .token_counts import counter_for, template_text
            self.counter = counter_for(config.tokenizer, template_text(config.chat_template))
        self.impostors = Impostors(config.tokenizer)  # providers serving another model

    def close(self) -> None:
        if self._ledger:
            self._ledger.close()
            self._ledger = None
        if self._request_log:
            self._request_log.close()
            self._request_log = None

    def log_request(self, raw: bytes) -> None:
        """What the client sent, byte for byte (one line; JSON bodies hold no raw newline)."""
        if self._request_log:
            self._request_log.write(raw.replace(b"\n", b" ") + b"\n")
            self._request_log.flush()

    # -- application ------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        r = app.router
        r.add_post("/api/v1/chat/completions", self.chat_completions)
        r.add_get("/api/v1/credits", self.credits)
        r.add_get("/api/v1/key", self.key)
        r.add_get("/api/v1/auth/key", self.key)
        r.add_get("/api/v1/generation", self.generation)
        r.add_get("/api/v1/models/{author}/{slug}/endpoints", self.model_endpoints)
        r.add_get("/api/v1/models", self.models)
        r.add_get("/_standin/stats", self.stats_handler)
        r.add_post("/_standin/config", self.config_handler)
        return app

    # -- helpers ------------------------------------------------------------------------
    def auth_error(self, request: web.Request) -> web.Response | None:
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return error_response(401, "No auth credentials found")
        if token.strip() != self.config.api_key:
            return error_response(401, "User not found.")
        return None

    def budget_layers(self) -> list[BudgetLayer]:
        c = self.config
        return budget_layers(c.guardrail_budget, c.workspace_budget, c.key_limit, c.limit_reset)

    def inflight_cap(self) -> float | None:
        ratio = self.config.inflight_ratio
        return None if ratio is None else ratio * (self.config.balance - self.usage)

    def distillable(self, model: str) -> bool:
        return DISTILLABLE[model] and not self.config.not_distillable

    def draw_fault(self) -> str | None:
        """One draw per request: each kind fires at its own rate (rates sum to at most 1)."""
        faults = self.config.faults
        if not faults:
            return None
        u = self.rng.random()
        for kind, rate in faults.items():
            if u < rate:
                return kind
            u -= rate
        return None

    def new_generation_id(self, created: int) -> str:
        # The stand-in's mark on every answer (OpenRouter's ids are gen-<time>-<random>): a
        # record of offline filler says so, whatever wrote it (kimipipe/recorded/api.py)
        return f"{STANDIN_GENERATION_PREFIX}{created}-{self._ids.getrandbits(80):020x}"

    def draw_usage_shown(self) -> str:
        """What a billed answer's usage shows of its cost: cost | no_cost | none (billing.py)."""
        u = self.billing_rng.random()
        if u < self.config.no_cost_rate:
            return "no_cost"
        if u < self.config.no_cost_rate + self.config.no_usage_rate:
            return "none"
        return "cost"

    def remember_unbilled(self, gen: GenerationStats) -> None:
        """A generation /generation shows at $0 and the account is not charged for."""
        self.generations[gen.id] = gen
        self.generation_ended[gen.id] = time.monotonic()

    def count_abandoned(self) -> None:
        self.abandoned += 1

    def abandoned_unbilled(self, gen: GenerationStats) -> None:
        """A cancelled generation not billed, yet known unless it already is: GET /generation
        shows it cancelled at $0, as OpenRouter's `cancelled` field does (never in the ledger)."""
        if gen.id not in self.generations:
            self.remember_unbilled(gen)

    def charge(self, gen: GenerationStats, user_sha: str, extra: dict | None = None) -> None:
        self.usage += gen.cost
        self.charged += 1
        self.generations[gen.id] = gen
        self.generation_ended[gen.id] = time.monotonic()
        if self._ledger:
            self._ledger.write(json.dumps({
                "generation_id": gen.id, "provider": gen.provider, "model": gen.model,
                "prompt_tokens": gen.prompt_tokens, "completion_tokens": gen.completion_tokens,
                "reasoning_tokens": gen.reasoning_tokens, "cost": gen.cost,
                "finish_reason": gen.finish_reason, "request_user_text_sha256": user_sha,
                **(extra or {}),
            }, ensure_ascii=False) + "\n")
            self._ledger.flush()

    def stats(self) -> dict:
        return {
            "requests": self.requests,
            "completions_started": self.completions_started,
            "held": self.held,
            "abandoned": self.abandoned,
            "charged": self.charged,
            "total_usage": self.usage,
            "balance_remaining": self.config.balance - self.usage,
            "faults": dict(self.faults),
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
            "statuses": dict(self.statuses),
            "endpoint_requests": dict(self.endpoint_requests),
            "completion_headers": {h: dict(c) for h, c in self.completion_headers.items()},
            "user_agents": {path: dict(c) for path, c in self.user_agents.items()},
            "refusals": {status: dict(kinds) for status, kinds in self.refusals.items()},
            "inflight_reserved": self.inflight.reserved(time.monotonic()),
            "inflight_cap": self.inflight_cap(),
            "inflight_peak_reserved": self.inflight.peak,
            "inflight_running": self.inflight.running_count,
            "inflight_settling": self.inflight.settling_count,
            "quirks": dict(self.quirks),
        }

    # -- control endpoints --------------------------------------------------------------
    async def stats_handler(self, request: web.Request) -> web.Response:
        return json_response(self.stats())

    async def config_handler(self, request: web.Request) -> web.Response:
        try:
            new = changed(self.config, json.loads(await request.read()))
        except (ValueError, TypeError) as e:
            return error_response(400, f"bad config: {e}")
        self.config = new
        self._gate.set()  # held requests look at the new hold_after
        self._gate = asyncio.Event()
        return json_response(new.public())

    # -- completions ----------------------------------------------------------------------
    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        status = 0
        try:
            try:
                response = await self._complete(request)
            except HTTPDone as done:
                response = done.response
            status = response.status
            return response
        finally:
            self.in_flight -= 1
            reserved = request.get("standin_reserved")
            if reserved is not None:   # a refusal before any provider ran does not settle
                settle = 0.0 if request.get("standin_unsettled") else self.config.settle
                self.inflight.release(reserved, time.monotonic(), settle)
            # a handler cancelled by a client that went away (hang, heartbeat) had sent its
            # headers: count the status it sent
            status = status or request.get("standin_status", 0)
            if status:
                self.statuses[str(status)] += 1

    def _parse(self, raw: bytes) -> dict:
        try:
            body = json.loads(raw)
        except ValueError:
            raise HTTPDone(error_response(400, "Invalid JSON in request body")) from None
        if not isinstance(body, dict):
            raise HTTPDone(error_response(400, "Request body must be a JSON object"))
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise HTTPDone(error_response(400, "messages: a non-empty array is required"))
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or m.get("role") not in (
                    "system", "developer", "user", "assistant", "tool"):
                raise HTTPDone(error_response(400, f"messages[{i}]: invalid message"))
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise HTTPDone(error_response(400, "model: a model ID is required"))
        if model not in MODELS:
            raise HTTPDone(error_response(400, f"{model} is not a valid model ID"))
        for name in ("max_tokens", "max_completion_tokens"):
            v = body.get(name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise HTTPDone(error_response(400, f"{name} must be a positive integer"))
        if not isinstance(body.get("stream", False), bool):
            raise HTTPDone(error_response(400, "stream must be a boolean"))
        return body

    async def _pass_gate(self) -> None:
        """With `hold_after` N set, the completions after the first N wait here (counted in
        stats' `held`) until the setting is raised or cleared: a test can then act while
        a run provably has work left, instead of racing it."""
        while (self.config.hold_after is not None
               and self.completions_started >= self.config.hold_after):
            self.held += 1
            try:
                await self._gate.wait()
            finally:
                self.held -= 1

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        started = time.monotonic()
        if (denied := self.auth_error(request)) is not None:
            return denied
        raw = await request.read()
        self.log_request(raw)
        for header, seen in self.completion_headers.items():
            seen[request.headers.get(header, "(none)")] += 1
        self.user_agents["completions"][request.headers.get("User-Agent", "(none)")] += 1
        body = self._parse(raw)
        await self._pass_gate()
        model = body["model"]
        cfg = self.config
        if (refused := self.budget_refusal()) is not None:
            return refused
        if cfg.balance - self.usage <= 0:
            return self.refuse(balance_gone(), "openrouter_credits")
        session = session_of(body, request.headers.get("x-session-id"))
        if session is not None and len(session) > MAX_SESSION_ID:
            return error_response(400, f"session_id must be at most {MAX_SESSION_ID} characters")
        try:
            chosen = route(model, body.get("provider"), Sessions.routing_key(session, raw),
                           params=request_parameters(body),
                           no_sampling=cfg.ignore_sampling, distillable=self.distillable(model),
                           logprobs=tuple(cfg.logprobs))
        except RoutingError as e:
            return error_response(e.status, e.message, e.metadata, e.availability)
        endpoint = chosen.endpoint
        if cfg.unavailable:  # e.g. a model its hosts retire under a long run
            allowed = [e.provider_name for e in MODELS[model] if e not in chosen.excluded]
            status, error, headers = unavailable_error(cfg.unavailable, model, allowed, cfg.retry_after)
            return json_response(error, status, headers)
        text = last_user_text(body["messages"])
        if cfg.moderation_marker and cfg.moderation_marker in text:
            return self.refuse(moderation(model, endpoint.provider_name,
                                          flagged(text, cfg.moderation_marker)), "moderation")
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens")
        asked = max_tokens or min(endpoint.max_completion_tokens, DEFAULT_MAX_COMPLETION)
        if (refused := self.credit_refusal(request, endpoint, body, asked)) is not None:
            return refused
        fault = self.draw_fault()
        if fault == "moderation":
            self.faults[fault] += 1
            request["standin_unsettled"] = True
            return self.refuse(moderation(model, endpoint.provider_name, flagged(text, None)),
                               "moderation")
        if fault == "misroute":
            if chosen.excluded:
                endpoint = chosen.excluded[self.rng.randrange(len(chosen.excluded))]
            else:
                fault = None   # nothing was excluded: nothing to misroute to
        if fault:
            self.faults[fault] += 1
        self.completions_started += 1
        if fault in STATUS_FAULTS:
            headers = {"Retry-After": f"{cfg.retry_after:g}"} if fault in ("429", "503") else None
            # the two documented availability failures among them (errors docs)
            code = {"429": "capacity_exhausted", "503": "temporarily_unavailable"}.get(fault)
            avail = None if code is None else availability(
                code, model, [endpoint.provider_name], retry_after=cfg.retry_after)
            return error_response(int(fault), STATUS_FAULTS[fault], {
                "provider_name": endpoint.provider_name,
                "raw": f"{endpoint.tag}: upstream error {fault}",
                "error_type": STATUS_ERROR_TYPES[fault]}, avail, headers)
        answer, extra = self.served_answer(body, endpoint)
        answer, logprobs = self.sampled_tokens(body, endpoint, answer, extra)
        cached = self.sessions.cached_tokens(session, endpoint.tag, body["messages"])
        if cached:
            extra["cached_tokens"] = cached
        created = int(time.time())
        job = Job(self, request, body, answer, endpoint, fault, created,
                  self.new_generation_id(created), started, extra, cached_tokens=cached,
                  logprobs=logprobs)
        if body.get("stream"):
            return await job.stream()
        return await job.plain()

    def sampled_tokens(self, body: dict, endpoint: StandinEndpoint, answer, extra: dict):
        """(the answer, its sampled tokens: the reasoning's and the content's, each
        (end offset, logprobs entry or None), or None) from a provider given `--logprobs`
        (logprobs.py: it streams a chunk per token; the entries are shown when the request
        asks `logprobs: true`); (answer, None) from any other. The ledger line says what
        was sampled; with `--tokenizer` the usage counts the tokens sampled (a cut token
        counts twice)."""
        variant = next((v for slug, v in self.config.logprobs.items() if endpoint.matches(slug)),
                       None)
        if variant is None:
            return answer, None
        from . import logprobs as lp
        if self.token_source is None:
            self.token_source = lp.TokenSource(self.config.tokenizer or lp.default_tokenizer())
        rate = self.config.noncanonical_rate
        rng = lp.request_rng(body, self.config.seed)
        sampled = lp.sample(self.token_source, answer.reasoning, answer.content, rng,
                            DEFAULT_NONCANONICAL if rate is None else rate)
        extra.update(sampled.ledger())
        self.quirks["logprobs" if body.get("logprobs") is True else "logprobs_not_asked"] += 1
        if sampled.noncanonical:
            self.quirks["logprobs_noncanonical"] += 1
            if self.counter is not None:
                answer = replace(answer, completion_tokens=answer.completion_tokens + 1)
        entries = lp.phase_entries(self.token_source, sampled, variant,
                                   answer.finish_reason == "stop",
                                   wants_reasoning(body, body["model"]), rng)
        return answer, entries

    # -- the limits and quirks of one request --------------------------------------------
    def refuse(self, body: dict, kind: str, headers: dict | None = None) -> web.Response:
        """Answer with a 402/403 body, counted by status and reason (or limit source)."""
        status = body["error"]["code"]
        self.refusals.setdefault(str(status), Counter())[kind] += 1
        return json_response(body, status, headers)

    def budget_refusal(self) -> web.Response | None:
        """The first budget layer (guardrail, workspace, key) whose spend reached its limit."""
        for layer in self.budget_layers():
            if self.usage >= layer.limit_usd:
                return self.refuse(budget_exceeded(layer, self.usage, self.config.limit_status),
                                   layer.limit_source)
        return None

    def credit_refusal(self, request: web.Request, endpoint: StandinEndpoint, body: dict,
                       asked: int) -> web.Response | None:
        """The worst case against what one request may reserve, then against the in-flight
        budget; a request let through reserves its worst case (with the budget on)."""
        cfg = self.config
        prompt_tokens = count_prompt_tokens(body["messages"])
        prompt_price, per_token = billed_prices(endpoint, cfg, prompt_tokens)
        prompt_cost = prompt_tokens * prompt_price
        worst = prompt_cost + asked * per_token
        cap = self.inflight_cap()
        if cap is None:
            cap = cfg.balance - self.usage
        key = next((la for la in self.budget_layers()
                    if la.limit_source == "openrouter_key_limit"), None)
        key_left = math.inf if key is None else key.limit_usd - self.usage
        budget = min(cap, key_left)
        if worst > budget:
            affordable = max(0, int((budget - prompt_cost) / per_token))
            if key_left < cap:
                return self.refuse(weight_exceeds_budget(asked, affordable, key, self.usage),
                                   "openrouter_key_limit")
            return self.refuse(weight_exceeds_budget(asked, affordable), "weight_exceeds_budget")
        if cfg.inflight_ratio is None:
            return None
        now = time.monotonic()
        if self.inflight.reserved(now) + worst > cap:
            wait = self.inflight.retry_after(now, cfg.settle)
            return self.refuse(in_flight_budget_exhausted(), "in_flight_budget_exhausted",
                               {"Retry-After": str(wait)})
        self.inflight.reserve(worst, now)
        request["standin_reserved"] = worst
        return None

    def served_answer(self, body: dict, endpoint: StandinEndpoint):
        """The answer as this endpoint serves it (its quirks), and what the ledger adds."""
        cfg = self.config
        honours = not matches_any(endpoint, cfg.ignore_sampling)
        reasoning = wants_reasoning(body, body["model"])
        drop = False
        if reasoning:
            rate = next((r for slug, r in cfg.drop_reasoning.items() if endpoint.matches(slug)),
                        0.0)
            drop = rate > 0 and self.quirk_rng.random() < rate
        inline = reasoning and not drop and matches_any(endpoint, cfg.inline_reasoning)
        unopened = reasoning and not drop and matches_any(endpoint, cfg.unopened_reasoning)
        impostor = self.impostors.serving(cfg.impostors, endpoint) if cfg.impostors else None
        served = None if impostor is None else impostor_body(body, impostor)
        if served is None:
            impostor = None
        answer = answer_for_request(
            body if served is None else served, honours_sampling=honours,
            drop_reasoning=drop, inline_reasoning=inline, unopened_reasoning=unopened,
            counter=self.counter if impostor is None else self.impostors.counter(impostor, self.counter))
        extra: dict = {}
        overcount = next((n for slug, n in cfg.usage_offsets.items() if endpoint.matches(slug)), 0)
        if overcount:  # (its stack's own count, billed as counted)
            answer = replace(answer, prompt_tokens=max(1, answer.prompt_tokens + overcount))
        if impostor is not None:
            extra["impostor"] = True
            self.quirks["impostor"] += 1
        applied, dropped = applied_sampling(body, honours_sampling=honours)
        if not honours or any(k in body for k in SAMPLING_PARAMETERS):
            extra["sampling"] = applied
            extra["sampling_dropped"] = dropped
            if dropped:
                self.quirks["sampling_dropped"] += 1
        if drop:
            extra["reasoning_dropped"] = True
            self.quirks["drop_reasoning"] += 1
        if inline and answer.content.startswith(THINK_OPEN):
            extra["reasoning_inline"] = True
            self.quirks["inline_reasoning"] += 1
        if unopened:
            extra["reasoning_inline"] = True
            self.quirks["unopened_reasoning"] += 1
        return answer, extra
