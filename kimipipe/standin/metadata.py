"""The stand-in's money and metadata endpoints: `GET /credits`, `/key` (and `/auth/key`),
`/generation`, `/models`, `/models/{author}/{slug}/endpoints` (no `/model/{slug}`: OpenRouter
has none).

A mixin of `server.StandinState`: it reads the server's config, usage, budget layers and
remembered generations, and changes nothing but the request counters.
"""

from __future__ import annotations

import time

from aiohttp import web

from .answers import REASONING_DEFAULT, default_sampling_of
from .billing import pricing_document
from .providers import MODELS, endpoints_document, model_document, with_nulls
from .refusals import effective_budget, key_budget
from .wire import error_response, json_response


class MetadataEndpoints:
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
        layers = self.budget_layers()
        effective = effective_budget(layers, self.usage)
        return json_response({"data": {
            "label": "standin-key",
            "limit": limit,
            "limit_remaining": None if limit is None else limit - self.usage,
            "limit_reset": None if limit is None else self.config.limit_reset,
            "include_byok_in_limit": False,
            "usage": self.usage, "usage_daily": self.usage, "usage_weekly": self.usage,
            "usage_monthly": self.usage,
            "byok_usage": 0.0, "byok_usage_daily": 0.0, "byok_usage_weekly": 0.0,
            "byok_usage_monthly": 0.0,
            "is_free_tier": False, "is_management_key": False, "is_provisioning_key": False,
            "rate_limit": {"requests": -1, "interval": "10s", "note": "deprecated"},
            "free_model_daily_requests": {"limit": 1000, "used": 0, "remaining": 1000},
            "allowed_data_regions": ["global"],
            "budgets": [key_budget(layer, self.usage) for layer in layers],
            "effective_budget": None if effective is None else key_budget(effective, self.usage),
            "creator_user_id": None, "organization_id": None, "workspace_id": None,
        }})

    async def generation(self, request: web.Request) -> web.Response:
        self.endpoint_requests["generation"] += 1
        self.user_agents["generation"][request.headers.get("User-Agent", "(none)")] += 1
        if (denied := self.auth_error(request)) is not None:
            return denied
        gid = request.query.get("id", "")
        if not gid:
            return error_response(400, "Missing required query parameter: id")
        g = self.generations.get(gid)
        if g is None or time.monotonic() < self.generation_ended.get(gid, 0.0) + self.config.generation_delay:
            # (OpenRouter: a few seconds after a generation ends; billing.py)
            return error_response(404, f"Generation {gid} not found")
        return json_response({"data": {
            "id": g.id, "model": g.model, "provider_name": g.provider, "api_type": "completions",
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(g.created)),
            "total_cost": g.cost, "usage": g.cost, "upstream_inference_cost": g.cost,
            "cache_discount": None, "is_byok": False, "cancelled": g.cancelled,
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
        document = endpoints_document(model, int(time.time()), self.config.ignore_sampling,
                                      logprobs=tuple(self.config.logprobs))
        # the prices that are billed: scale, discount, overrides (billing.py)
        for entry, endpoint in zip(document["data"]["endpoints"], MODELS[model], strict=True):
            entry["pricing"] = pricing_document(endpoint, self.config)
        if self.config.endpoint_nulls:  # what the live table leaves null or out
            for entry in document["data"]["endpoints"]:
                with_nulls(entry)
        return json_response(document)

    def model_document(self, model: str) -> dict:
        return model_document(model, int(time.time()), distillable=self.distillable(model),
                              price_scale=self.config.price_scale,
                              default_sampling=default_sampling_of(model, REASONING_DEFAULT[model]))

    async def models(self, request: web.Request) -> web.Response:
        """`GET /models`, with OpenRouter's `?distillable=true|false` filter."""
        self.endpoint_requests["models"] += 1
        docs = [self.model_document(m) for m in MODELS]
        wanted = request.query.get("distillable")
        if wanted in ("true", "false"):
            docs = [d for d in docs if d["is_trainable_text"] is (wanted == "true")]
        return json_response({"data": docs, "links": {"next": None}, "total_count": len(docs)})
