"""kp-infer --tokenizer: a quarantined provider's streams in flight are cancelled, and paid for.

When the identity judge quarantines a provider (infer/identity.py), the streams in flight
whose first chunk named it are closed (openrouter/client.py `cancel_streams_of`), and
those whose first chunk comes later are closed then. A cancelled generation may be billed
all the same (only some providers stop billing on a cancel), so each is booked as an
answer refused for identity, its cost read from GET /generation (else its worst case),
counted against every cap, and its prompt sent again elsewhere.

Through the command line against the stand-in: four honest providers inside the vendor
verifier's band and Fireworks turning into another model after a few answers, streams
slow enough (`tokens_per_second`) that dozens of Fireworks' are in flight when its strikes
land (`--max-tokens 1024`: the stand-in's answers, counted by the tokenizer, stay under the
worst case a cap reserves). Both billing behaviours: `bill_cancelled` (the stand-in finishes and bills a
generation whose client went away) and not (GET /generation shows it cancelled at $0).
The baseline is the same run with `--no-stream`: a plain request names its provider only
in its whole answer, so nothing of it can be cancelled (what every run did before).
The client's own part (a stream closed at once, or at its first chunk after the
quarantine, its connection closed while the client runs on) is driven through
`CompletionClient` against the stand-in.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from conftest import TOKENIZER_KINDS, read_jsonl
from helpers import CAPS, cap_reached, money_is_exact
from test_infer import infer, make_prompts

TOKENIZER = TOKENIZER_KINDS["fast"]
HONEST = {"moonshotai": 0, "together": 1, "deepinfra": 2, "parasail": 3}
FIVE = ("--quantization", "int4", "--quantization", "unknown", "--quantization", "nvfp4")
PROMPTS, CONCURRENCY = 240, 80
CANCELLED = "stream closed after"  # how a cancelled stream's refusal begins


def quarantine_run(standin, tmp_path, name, *args, bill_cancelled=False, prompts=PROMPTS):
    """One run of the scenario; (server, records, failures, summary, result)."""
    server = standin(tokenizer=TOKENIZER, usage_offsets=HONEST, impostors={"fireworks": 6},
                     ledger=True, bill_cancelled=bill_cancelled, tokens_per_second=80,
                     latency=0.05, workdir=tmp_path / f"standin-{name}")
    source = make_prompts(tmp_path / f"{name}.jsonl", prompts)
    out, summary = tmp_path / f"{name}-r.jsonl", tmp_path / f"{name}-s.json"
    failures_path = tmp_path / f"{name}-f.jsonl"
    r = infer(server, source, "-o", out, "--summary-json", summary, "--tokenizer", TOKENIZER,
              "--failures", failures_path,
              "--concurrency", str(CONCURRENCY), "--max-tokens", "1024", *FIVE, *args)
    failures = read_jsonl(failures_path) if failures_path.exists() else []
    return server, read_jsonl(out), failures, json.loads(summary.read_text()), r


def paid_after_first_wrong(server) -> int:
    """Impostor answers the ledger bills: every one of them came after its first wrong one."""
    return sum(1 for x in server.ledger() if x.get("impostor"))


def cancelled_refusals(records, failures) -> list[dict]:
    return [x for r in [*records, *failures] for x in r["refused"]
            if x["message"].startswith(CANCELLED)]


@pytest.mark.parametrize("billed", [True, False], ids=["billed-on-cancel", "not-billed"])
def test_quarantine_cancels_the_providers_streams_in_flight(standin, tmp_path, billed):
    """Fireworks' streams in flight are closed at its quarantine, each refused for identity
    with its cost from GET /generation: the bill where the provider bills a cancel, $0
    where it does not; the money is exact and every prompt is answered elsewhere."""
    server, records, failures, summary, r = quarantine_run(
        standin, tmp_path, "stream", bill_cancelled=billed)
    assert r.code == 0, r.stderr
    assert len(records) == PROMPTS and not failures
    assert "quarantined provider Fireworks" in r.stderr
    cancelled = cancelled_refusals(records, failures)
    assert len(cancelled) >= 5, r.stderr  # dozens are in flight at the third strike
    assert {x["kind"] for x in cancelled} == {"identity"}
    assert {x["provider"] for x in cancelled} == {"Fireworks"}
    assert {x["cost_source"] for x in cancelled} == {"generation"}
    assert not any(rec["provider"] == "Fireworks" and rec["identity"]["offset"] not in range(4)
                   for rec in records)  # nothing of the other model kept
    ledger = {x["generation_id"]: x for x in server.ledger()}
    if billed:  # billed whole though cancelled: booked at the bill, as the ledger says
        assert all(x["generation_id"] in ledger and x["cost"] > 0 for x in cancelled)
        money_is_exact(server, records, failures)
    else:  # not billed: $0 and nowhere in the ledger, unless the generation had ended (and
        # was billed) before the close reached the provider: then booked at its bill
        free = [x for x in cancelled if x["generation_id"] not in ledger]
        assert all(x["cost"] == 0 for x in free) and len(free) >= len(cancelled) // 2
        assert all(x["cost"] == pytest.approx(ledger[x["generation_id"]]["cost"])
                   for x in cancelled if x["generation_id"] in ledger)
        unbilled = {x["generation_id"] for x in free}
        for rec in records:
            rec["refused"] = [x for x in rec["refused"] if x["generation_id"] not in unbilled]
        money_is_exact(server, records, failures)
    assert summary["spend_this_run"] == pytest.approx(sum(x["cost"] for x in ledger.values()),
                                                 rel=1e-9)


def test_cancelling_pays_for_fewer_answers_of_the_other_model(standin, tmp_path):
    """Against the same run in plain requests (nothing can be cancelled, as every run was
    before): fewer of the other model's answers are paid for once it switched, when its
    provider does not bill a cancel (the ledger counts them)."""
    plain = quarantine_run(standin, tmp_path, "plain", "--no-stream")
    streamed = quarantine_run(standin, tmp_path, "stream")
    for _server, records, failures, _, r in (plain, streamed):
        assert r.code == 0, r.stderr
        assert len(records) == PROMPTS and not failures
    before, after = paid_after_first_wrong(plain[0]), paid_after_first_wrong(streamed[0])
    assert not cancelled_refusals(plain[1], plain[2])  # (a plain request runs to its end)
    assert after < before, (before, after)


@pytest.mark.parametrize("cap", list(CAPS))
def test_each_cap_holds_with_cancelled_streams_billed(standin, tmp_path, cap):
    """Each money cap counts each cancelled generation at its bill (the stand-in bills
    them): the run stops at the cap (exit 3), having spent no more than it, every cent on a
    record or failure line."""
    # (half the scenario's prompts: the quarantine and its cancels come in the first
    # hundred answers, and each cap's two runs cost half as much)
    full = quarantine_run(standin, tmp_path, "full", bill_cancelled=True, prompts=PROMPTS // 2)
    usd = round(full[3]["spend_this_run"] * 0.6, 6)
    server, records, failures, summary, r = quarantine_run(
        standin, tmp_path, "capped", *CAPS[cap](tmp_path, usd), bill_cancelled=True,
        prompts=PROMPTS // 2)
    assert r.code == 3 and cap_reached(cap) in r.stderr, r.stderr
    billed = sum(x["cost"] for x in server.ledger())
    assert billed <= usd
    assert cancelled_refusals(records, failures)  # (the cap met with cancels among them)
    money_is_exact(server, records, failures)
    assert summary["spend_this_run"] == pytest.approx(billed, rel=1e-9)


def _cancel_through_the_client(server, wait_before_cancel: float):
    """One streamed attempt routed to Fireworks, and `cancel_streams_of("Fireworks")`
    after WAIT_BEFORE_CANCEL s: (how many it closed at once, the attempt's outcome, the
    streams the stand-in saw closed while the client was still open)."""
    from kimipipe.openrouter.client import CompletionClient

    body = json.dumps({"model": "moonshotai/kimi-k2.5", "max_tokens": 1024, "stream": True,
                       "messages": [{"role": "user", "content": "Tell me about rivers."}],
                       "provider": {"only": ["fireworks"]}}).encode()

    async def go():
        async with CompletionClient(server.base_url, server.api_key) as client:
            task = asyncio.ensure_future(client.attempt(body, True))
            await asyncio.sleep(wait_before_cancel)
            closed = client.cancel_streams_of("Fireworks")
            outcome = await asyncio.wait_for(task, 30)
            # the client still open (its close would end every connection anyway): the
            # stand-in sees this one closed (the answer itself would take ~50 s more)
            for _ in range(50):
                if seen := (await asyncio.to_thread(server.stats))["abandoned"]:
                    break
                await asyncio.sleep(0.1)
            return closed, outcome, seen

    return asyncio.run(go())


def test_a_stream_is_closed_at_the_quarantine_or_at_its_first_chunk_after_it(standin):
    """The client's part, on the stand-in: a stream already past its first chunk is closed
    at once; one whose first chunk comes after the quarantine is closed at that chunk.
    Either ends as CANCELLED with its generation id (for GET /generation), and its
    connection is closed, which is what cancels it upstream (the stand-in counts it
    abandoned, and bills nothing of it)."""
    from kimipipe.kinds import AttemptKind

    live = standin(latency=0.05, tokens_per_second=10, ledger=True)
    closed, outcome, seen_closed = _cancel_through_the_client(live, 1.5)
    assert closed == 1 and outcome.kind == AttemptKind.CANCELLED and seen_closed == 1, outcome
    assert outcome.provider == "Fireworks" and outcome.generation_id and outcome.chunks > 0
    late = standin(latency=1.5, tokens_per_second=10, ledger=True)
    closed, outcome, seen_closed = _cancel_through_the_client(late, 0.5)
    assert closed == 0 and outcome.kind == AttemptKind.CANCELLED and seen_closed == 1, outcome
    assert outcome.provider == "Fireworks" and outcome.chunks == 1
    for server in (live, late):
        assert server.stats()["abandoned"] == 1 and not server.ledger()
