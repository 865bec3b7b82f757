"""How many endpoints are left to serve the model: `--plan` and `--preflight` say it.

Kimi K2.5 is being retired by its hosts (one after another: Together, Fireworks, Moonshot's
own API; DeepInfra redirecting it to Kimi K3), so the endpoints a run may use shrink under
it. Both reports name how many endpoints the routing flags leave (quarantined providers
excluded: infer/identity.py) and warn at one (its host retiring the model, or at capacity,
stops the run) or none; docs/real-run.md says what to do when OpenRouter no longer serves
the model (own servers: docs/servers.md; a successor model is another target).
"""

from __future__ import annotations

from ..openrouter.routing import Endpoint, Policy, allowed_endpoints
from ..plans import PlanAvailability

WHAT_TO_DO = "docs/real-run.md says what to do when OpenRouter no longer serves the model"


def endpoints_left(policy: Policy, endpoints: list[Endpoint] | None) -> PlanAvailability | None:
    if endpoints is None:
        return None
    allowed = allowed_endpoints(policy, endpoints)
    quarantined = sorted({e.provider_name for e in endpoints
                          if any(e.tag == t for t in policy.quarantine)})
    return PlanAvailability(listed=len(endpoints), left=len(allowed),
                            providers=sorted({e.provider_name for e in allowed}),
                            quarantined=quarantined)


def availability_text(left: PlanAvailability | None, model: str) -> tuple[str, str]:
    """(verdict, detail): pass at two endpoints or more, warn at one, fail at none."""
    if left is None:
        return "warn", "unknown: the endpoints table could not be read"
    detail = (f"{left.left} endpoint(s) of {model} left under the routing flags "
              f"({left.listed} listed)" + (f": {', '.join(left.providers)}" if left.providers else "")
              + (f"; quarantined for identity: {', '.join(left.quarantined)}"
                 if left.quarantined else ""))
    if left.left >= 2:
        return "pass", detail
    return ("warn" if left.left else "fail"), (
        detail + ("; one host retiring the model, or at capacity, stops the run"
                  if left.left else "; nothing can serve it") + f": {WHAT_TO_DO}")
