"""The stand-in's HTTP server: OpenRouter's wire format, billing and failures on loopback.

One aiohttp application, one event loop. The hot path (a completion) does no heavy work:
the answer is a few hundred words from a seeded RNG, stream chunks are assembled from
pre-encoded byte templates, and access logging is off, so one core carries thousands of
slow connections.

Order of checks for `POST /api/v1/chat/completions`, as OpenRouter does it:
auth (401) -> body (400) -> model (400) -> routing (400/404) -> pre-flight credit check
(402) -> fault draw -> answer (with latency and token rate) -> charge -> last chunk.

Faults (`--fault KIND=RATE`; one seeded draw per accepted request, rates sum to <= 1;
a fault never charges, except `misroute`, which serves a real, billed answer):
    429 500 502 503 524 529  that status with an error body (429: Retry-After header and
                             error.availability {retryable, retry_after})
    error200   HTTP 200, top-level `error`, no `choices` (stream: one such chunk, no [DONE])
    empty      HTTP 200, `choices: []`, no error, no usage (stream: one such chunk, [DONE])
    midstream  stream: half the tokens, then a chunk with `error` and finish_reason
               "error", then the stream ends (no [DONE]); plain: like error200
    cut        the connection is aborted mid-body (stream: after half the tokens; plain:
               after half the JSON, whose Content-Length promised all of it)
    hang       headers, then no byte at all (no keep-alive either) for --hang-seconds,
               then the connection is aborted
    heartbeat  stream: `: OPENROUTER PROCESSING` comments forever, never data; plain: a hang
    misroute   served by an endpoint the request's preferences excluded (a no-op, and not
               counted, when nothing was excluded)
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from dataclasses import asdict, dataclass, field

from aiohttp import web

from .answers import answer_for_request
from .jobs import Job
from .providers import MODELS, RoutingError, endpoints_document, route
from .wire import Generation, error_response, json_response

FAULT_KINDS = ("429", "500", "502", "503", "524", "529", "error200", "empty", "midstream",
               "cut", "hang", "heartbeat", "misroute")
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
CREDITS_MODES = ("normal", "forbidden", "zeros")
DEFAULT_MAX_COMPLETION = 262144


@dataclass
class Config:
    """What a run of the stand-in is told; `POST /_standin/config` changes it live."""

    api_key: str = "sk-or-standin"
    balance: float = 100.0
    key_limit: float | None = None
    credits_mode: str = "normal"
    latency: float = 0.0
    tokens_per_second: float = 0.0
    keepalive_interval: float = 1.0
    faults: dict[str, float] = field(default_factory=dict)
    retry_after: float = 1.0
    hang_seconds: float = 3600.0
    seed: int = 0
    ledger: str | None = None
    request_log: str | None = None   # every completion request body as received, one per line
    price_scale: float = 1.0
    bill_cancelled: bool = False     # charge a generation whose client went away mid-way

    def check(self) -> None:
        for kind, rate in self.faults.items():
            if kind not in FAULT_KINDS:
                raise ValueError(f"unknown fault kind {kind!r} (kinds: {', '.join(FAULT_KINDS)})")
            if not 0.0 <= float(rate) <= 1.0:
                raise ValueError(f"fault rate for {kind} must be in [0, 1], got {rate}")
        if sum(float(r) for r in self.faults.values()) > 1.0 + 1e-9:
            raise ValueError("fault rates must sum to at most 1 (one draw per request picks "
                             "at most one fault)")
        if self.credits_mode not in CREDITS_MODES:
            raise ValueError(f"credits_mode must be one of {', '.join(CREDITS_MODES)}")
        for name in ("latency", "tokens_per_second", "hang_seconds", "retry_after"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if self.keepalive_interval <= 0:
            raise ValueError("keepalive_interval must be > 0")


# Settable at run time through POST /_standin/config, with their types.
LIVE_SETTINGS = {"balance": float, "key_limit": float, "credits_mode": str, "latency": float,
                 "tokens_per_second": float, "keepalive_interval": float, "faults": dict,
                 "retry_after": float, "hang_seconds": float, "price_scale": float,
                 "bill_cancelled": bool}


class HTTPDone(Exception):
    """Raised inside the completion handler to answer with a ready response."""

    def __init__(self, response: web.StreamResponse):
        self.response = response


class StandIn:
    """The server's state: config, balance, counters, remembered generations, ledger."""

    def __init__(self, config: Config):
        config.check()
        self.config = config
        self.usage = 0.0
        self.charged = 0
        self.requests = 0
        self.completions_started = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.faults: Counter[str] = Counter()
        self.statuses: Counter[str] = Counter()
        self.endpoint_requests: Counter[str] = Counter()
        self.generations: dict[str, Generation] = {}
        self.rng = random.Random(config.seed)
        self._ids = random.Random()
        self._ledger = open(config.ledger, "a", encoding="utf-8") if config.ledger else None
        self._request_log = open(config.request_log, "ab") if config.request_log else None

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

    def remaining(self) -> float:
        """What the account can still spend: the balance, capped by the key's limit."""
        left = self.config.balance - self.usage
        if self.config.key_limit is not None:
            left = min(left, self.config.key_limit - self.usage)
        return left

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
        return f"gen-{created}-{self._ids.getrandbits(80):020x}"

    def charge(self, gen: Generation, user_sha: str) -> None:
        self.usage += gen.cost
        self.charged += 1
        self.generations[gen.id] = gen
        if self._ledger:
            self._ledger.write(json.dumps({
                "generation_id": gen.id, "provider": gen.provider, "model": gen.model,
                "prompt_tokens": gen.prompt_tokens, "completion_tokens": gen.completion_tokens,
                "reasoning_tokens": gen.reasoning_tokens, "cost": gen.cost,
                "finish_reason": gen.finish_reason, "request_user_text_sha256": user_sha,
            }, ensure_ascii=False) + "\n")
            self._ledger.flush()

    def stats(self) -> dict:
        return {
            "requests": self.requests,
            "completions_started": self.completions_started,
            "charged": self.charged,
            "total_usage": self.usage,
            "balance_remaining": self.config.balance - self.usage,
            "faults": dict(self.faults),
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
            "statuses": dict(self.statuses),
            "endpoint_requests": dict(self.endpoint_requests),
        }

    # -- control endpoints --------------------------------------------------------------
    async def stats_handler(self, request: web.Request) -> web.Response:
        return json_response(self.stats())

    async def config_handler(self, request: web.Request) -> web.Response:
        try:
            changes = json.loads(await request.read())
            if not isinstance(changes, dict):
                raise ValueError("expected a JSON object")
            unknown = sorted(set(changes) - set(LIVE_SETTINGS))
            if unknown:
                raise ValueError(f"cannot change {', '.join(unknown)} "
                                 f"(settable: {', '.join(LIVE_SETTINGS)})")
            new = Config(**asdict(self.config))
            for name, value in changes.items():
                if name == "key_limit" and value is None:
                    new.key_limit = None
                elif name == "faults":
                    new.faults = {str(k): float(v) for k, v in dict(value).items()}
                else:
                    setattr(new, name, LIVE_SETTINGS[name](value))
            new.check()
        except (ValueError, TypeError) as e:
            return error_response(400, f"bad config: {e}")
        self.config = new
        return json_response({k: v for k, v in asdict(new).items() if k != "api_key"})

    # -- money and metadata endpoints ---------------------------------------------------
    async def credits(self, request: web.Request) -> web.Response:
        self.endpoint_requests["credits"] += 1
        if (denied := self.auth_error(request)) is not None:
            return denied
        mode = self.config.credits_mode
        if mode == "forbidden":
            return error_response(403, "Only management keys can fetch credits",
                                  {"error_type": "permission_denied"})
        if mode == "zeros":
            return json_response({"data": {"total_credits": 0, "total_usage": 0}})
        return json_response({"data": {"total_credits": self.config.balance,
                                       "total_usage": self.usage}})

    async def key(self, request: web.Request) -> web.Response:
        self.endpoint_requests["key"] += 1
        if (denied := self.auth_error(request)) is not None:
            return denied
        limit = self.config.key_limit
        return json_response({"data": {
            "label": "standin-key",
            "limit": limit,
            "limit_remaining": None if limit is None else limit - self.usage,
            "limit_reset": None,
            "include_byok_in_limit": False,
            "usage": self.usage, "usage_daily": self.usage, "usage_weekly": self.usage,
            "usage_monthly": self.usage,
            "byok_usage": 0.0, "byok_usage_daily": 0.0, "byok_usage_weekly": 0.0,
            "byok_usage_monthly": 0.0,
            "is_free_tier": False, "is_management_key": False, "is_provisioning_key": False,
            "rate_limit": {"requests": -1, "interval": "10s", "note": "deprecated"},
            "free_model_daily_requests": {"limit": 1000, "used": 0, "remaining": 1000},
            "allowed_data_regions": ["global"], "budgets": [], "effective_budget": None,
            "creator_user_id": None, "organization_id": None, "workspace_id": None,
        }})

    async def generation(self, request: web.Request) -> web.Response:
        self.endpoint_requests["generation"] += 1
        if (denied := self.auth_error(request)) is not None:
            return denied
        gid = request.query.get("id", "")
        if not gid:
            return error_response(400, "Missing required query parameter: id")
        g = self.generations.get(gid)
        if g is None:
            return error_response(404, f"Generation {gid} not found")
        return json_response({"data": {
            "id": g.id, "model": g.model, "provider_name": g.provider, "api_type": "completions",
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(g.created)),
            "total_cost": g.cost, "usage": g.cost, "upstream_inference_cost": g.cost,
            "cache_discount": None, "is_byok": False, "cancelled": False,
            "finish_reason": g.finish_reason, "native_finish_reason": g.finish_reason,
            "tokens_prompt": g.prompt_tokens, "tokens_completion": g.completion_tokens,
            "native_tokens_prompt": g.prompt_tokens,
            "native_tokens_completion": g.completion_tokens,
            "native_tokens_reasoning": g.reasoning_tokens, "native_tokens_cached": 0,
            "native_tokens_completion_images": None,
            "latency": round(g.latency * 1000), "generation_time": round(g.generation_time * 1000),
            "moderation_latency": None, "streamed": g.streamed, "origin": "",
            "app_id": None, "external_user": None, "http_referer": None, "user_agent": None,
            "num_fetches": None, "num_input_audio_prompt": None, "num_media_completion": None,
            "num_media_prompt": None, "num_search_results": None, "preset_id": None,
            "provider_responses": None, "router": None, "service_tier": None,
            "upstream_id": None, "web_search_engine": None, "workspace_id": None,
            "data_region": "global",
        }})

    async def model_endpoints(self, request: web.Request) -> web.Response:
        self.endpoint_requests["endpoints"] += 1
        model = f"{request.match_info['author']}/{request.match_info['slug']}"
        if model not in MODELS:
            return error_response(404, f"Model {model} not found")
        document = endpoints_document(model, int(time.time()))
        scale = self.config.price_scale
        if scale != 1.0:  # list the prices that are billed
            for endpoint in document["data"]["endpoints"]:
                for kind in ("prompt", "completion"):
                    endpoint["pricing"][kind] = f"{float(endpoint['pricing'][kind]) * scale:.12g}"
        return json_response(document)

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

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        started = time.monotonic()
        if (denied := self.auth_error(request)) is not None:
            return denied
        raw = await request.read()
        self.log_request(raw)
        body = self._parse(raw)
        model = body["model"]
        try:
            chosen = route(model, body.get("provider"), raw)
        except RoutingError as e:
            return error_response(e.status, e.message, e.metadata, e.availability)
        endpoint = chosen.endpoint
        scale = self.config.price_scale
        answer = answer_for_request(body)
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens")
        asked = max_tokens or min(endpoint.max_completion_tokens, DEFAULT_MAX_COMPLETION)
        need = (answer.prompt_tokens * endpoint.prompt + asked * endpoint.completion) * scale
        left = self.remaining()
        if left < need:
            affordable = max(0, int((left - answer.prompt_tokens * endpoint.prompt * scale)
                                    / (endpoint.completion * scale)))
            key_is_the_cap = (self.config.key_limit is not None
                              and self.config.key_limit < self.config.balance)
            where = ("https://openrouter.ai/settings/keys and create a key with a higher total "
                     "limit" if key_is_the_cap else
                     "https://openrouter.ai/settings/credits and add more credits")
            return error_response(
                402, f"This request requires more credits, or fewer max_tokens. You requested "
                     f"up to {asked} tokens, but can only afford {affordable}. To increase, "
                     f"visit {where}", {"error_type": "payment_required"})
        fault = self.draw_fault()
        if fault == "misroute":
            if chosen.excluded:
                endpoint = chosen.excluded[self.rng.randrange(len(chosen.excluded))]
            else:
                fault = None   # nothing was excluded: nothing to misroute to
        if fault:
            self.faults[fault] += 1
        self.completions_started += 1
        if fault in STATUS_FAULTS:
            headers = {"Retry-After": f"{self.config.retry_after:g}"} if fault == "429" else None
            availability = ({"code": "rate_limited", "retryable": True,
                             "retry_after": self.config.retry_after} if fault == "429" else None)
            return error_response(int(fault), STATUS_FAULTS[fault], {
                "provider_name": endpoint.provider_name,
                "raw": f"{endpoint.tag}: upstream error {fault}",
                "error_type": STATUS_ERROR_TYPES[fault]}, availability, headers)
        created = int(time.time())
        job = Job(self, request, body, answer, endpoint, fault, created,
                   self.new_generation_id(created), started)
        if body.get("stream"):
            return await job.stream()
        return await job.plain()
