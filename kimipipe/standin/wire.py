"""The stand-in's wire pieces shared by the server and its completion jobs: JSON and
error responses in OpenRouter's shape, and the record of a charged generation."""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
from aiohttp import web

encode = msgspec.json.encode


@dataclass
class GenerationStats:
    id: str
    provider: str
    model: str
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    cost: float
    finish_reason: str
    created: int
    latency: float
    generation_time: float
    streamed: bool
    cancelled: bool = False  # its client went away; not billed (GET /generation: $0)


def error_body(status: int, message: str, metadata: dict | None = None,
               availability: dict | None = None) -> dict:
    err: dict = {"code": status, "message": message}
    if metadata is not None:
        err["metadata"] = metadata
    if availability is not None:
        err["availability"] = availability
    return {"error": err}


def json_response(obj, status: int = 200, headers: dict | None = None) -> web.Response:
    return web.Response(body=encode(obj), status=status, headers=headers,
                        content_type="application/json")


def error_response(status: int, message: str, metadata: dict | None = None,
                   availability: dict | None = None, headers: dict | None = None) -> web.Response:
    return json_response(error_body(status, message, metadata, availability), status, headers)
