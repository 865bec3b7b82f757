"""`--preflight`'s identity checks: is each allowed provider serving the target model?

With `--tokenizer`, besides its N prompts the preflight sends one request to each
provider the routing flags allow (`provider.only` naming its allowed endpoints' tags, so
that OpenRouter routes it there and nowhere else), each the next prompt still to do,
asked as the run asks it and kept as the run keeps it. Every answer (the N and these) is
checked as the run checks it (infer/identity.py), with all of them in hand: nothing
waits, an offset is accepted when it lies inside the vendor verifier's tolerance (0..+3,
recorded/identity_table.py VENDOR_BAND) or is the constant the providers that agree share.
One row per provider:

    provider | prompt-token offset | completion ratio | verdict
    verdict: "same model and template" (offset 0), "+2: inside the vendor verifier's
    tolerance" (an overcount Moonshot accepts of an honest host), "offset +C" (a constant
    outside it that the providers share: kimipipe's template differs from theirs; pass
    `--chat-template`), "different" (another model, tokenizer or template: the run would
    refuse its answers and quarantine it), "no answer"
    and `band` (JSON): each offset seen against the tolerance, as `band_verdict` says it

The preflight also says how many endpoints are left (infer/availability.py).
Without `--tokenizer` one check says that identity is unchecked and which option turns it
on.
"""

from __future__ import annotations

from dataclasses import replace

from ..openrouter.routing import Endpoint, Policy, allowed_endpoints
from ..recorded.identity_table import VENDOR_BAND, band_verdict
from .identity import IdentityJudge
from .identity_votes import OFF, PENDING, CountCheck


def allowed_providers(policy: Policy, endpoints: list[Endpoint] | None) -> list[tuple[str, list[str]]]:
    """Each provider the routing flags allow, with the tags of its allowed endpoints."""
    by: dict[str, list[str]] = {}
    for e in allowed_endpoints(policy, endpoints or []):
        tags = by.setdefault(e.provider_name, [])
        if e.tag and e.tag not in tags:
            tags.append(e.tag)
    return sorted(by.items())


def only(policy: Policy, tags: list[str]) -> Policy:
    """POLICY routed to TAGS alone (a preflight's request to one provider)."""
    return replace(policy, only=list(tags))


def verdicts(judge: IdentityJudge, checks: list[CountCheck]) -> None:
    """Each check's verdict with every answer's evidence in hand (recorded by `measure`)."""
    for check in checks:
        check.verdict, check.why = judge.votes.first_verdict(check)
        if check.verdict == PENDING:
            check.verdict = OFF
            check.why = (f"prompt_tokens {check.offset:+d} from kimipipe's count, which no other "
                         "provider showed")


def provider_rows(judge: IdentityJudge, checks: list[CountCheck], probed: list[str],
                  unanswered: dict[str, str]) -> list[dict]:
    """One row per provider (PROBED: asked through provider.only; UNANSWERED: why not)."""
    rows = []
    for name in sorted({*probed, *(c.provider for c in checks), *unanswered}):
        mine = [c for c in checks if c.provider == name]
        if not mine:
            rows.append({"provider": name, "offset": None, "completion_ratio": None,
                         "verdict": "no answer", "detail": unanswered.get(name, "not asked")})
            continue
        offsets = sorted({c.offset for c in mine if c.offset is not None})
        ratios = sorted(c.ratio for c in mine if c.ratio is not None)
        off = [c for c in mine if c.verdict == OFF]
        if off:
            verdict, detail = "different", off[0].why
        elif not offsets:
            verdict, detail = "unchecked", "no usage.prompt_tokens to compare"
        elif offsets == [0]:
            verdict, detail = "same model and template", "its prompt counts are kimipipe's"
        elif all(o in VENDOR_BAND for o in offsets):
            verdict = "; ".join(band_verdict(o) for o in offsets)
            detail = ("an overcount the model's owner accepts of an honest host (Moonshot's "
                      "Kimi Vendor Verifier: MAX_PROMPT_TOKEN_OVERCOUNT = 3): the same model")
        else:
            shared = [o for o in offsets if o not in VENDOR_BAND]
            verdict = f"offset {shared[0]:+d} ({band_verdict(shared[0])}, shared)"
            detail = ("a constant the providers that agree share: the chat template kimipipe "
                      "renders with differs from theirs (a default system prompt it omits?): "
                      "pass the right one with --chat-template")
        rows.append({"provider": name,
                     "offset": offsets[0] if len(offsets) == 1 else offsets,
                     "completion_ratio": round(ratios[len(ratios) // 2], 3) if ratios else None,
                     "band": [band_verdict(o) for o in offsets],
                     "in_band": not off and all(o in VENDOR_BAND for o in offsets),
                     "verdict": verdict, "detail": detail,
                     "answers": [c.prompt_id for c in mine]})
    return rows


def table_text(rows: list[dict]) -> str:
    width = max([len(r["provider"]) for r in rows] + [8]) + 2
    lines = [f"  {'provider':<{width}}{'offset':>8}{'compl ratio':>13}  verdict"]
    for r in rows:
        offset = r["offset"]
        shown = ("-" if offset is None else f"{offset:+d}" if isinstance(offset, int)
                 else ",".join(f"{o:+d}" for o in offset))
        ratio = "-" if r["completion_ratio"] is None else f"{r['completion_ratio']:.3f}"
        lines.append(f"  {r['provider']:<{width}}{shown:>8}{ratio:>13}  {r['verdict']}")
    return "\n".join(lines)
