"""The files commands leave for each other (kimipipe/contracts.py), as the real commands write
them: each decodes into its Struct, and encoding that Struct again gives the same bytes (so
the Struct is the whole contract: no key it does not declare, none it drops)."""

from __future__ import annotations

import json
import os

import msgspec
from conftest import kp, write_jsonl
from test_infer import infer, make_prompts
from test_shard import records

from kimipipe.contracts import InferSummary, LockHolder, Reservations
from kimipipe.locks import OutputLock
from kimipipe.plans import InferPlan
from kimipipe.shard.manifest import ShardManifest


def same_json_again(data: bytes, struct_type, indent: int | None = None) -> None:
    decoded = msgspec.json.decode(data, type=struct_type)
    again = json.dumps(msgspec.to_builtins(decoded), indent=indent) + ("\n" if indent else "")
    assert again.encode() == (data if indent else data.rstrip(b"\n")), struct_type.__name__


def test_plan_summary_and_reservations_decode_into_their_structs(standin, tmp_path):
    server = standin()
    prompts = make_prompts(tmp_path / "p.jsonl", 6)
    plan = infer(server, prompts, "--plan", "--json", "--total-cost", "5")
    assert plan.code == 0, plan.stderr
    same_json_again(plan.stdout, InferPlan)
    assert msgspec.json.decode(plan.stdout, type=InferPlan).prompts.todo == 6

    summary, shared = tmp_path / "s.json", tmp_path / "reservations.json"
    r = infer(server, prompts, "-o", tmp_path / "out.jsonl", "--summary-json", summary,
              "--total-cost", "5", "--reservations", shared)
    assert r.code == 0, r.stderr
    same_json_again(summary.read_bytes(), InferSummary, indent=2)
    assert msgspec.json.decode(summary.read_bytes(), type=InferSummary).done == 6
    same_json_again(shared.read_bytes(), Reservations)
    (entry,) = msgspec.json.decode(shared.read_bytes(), type=Reservations).entries
    assert entry.ended and entry.claim == 0 and entry.spent > 0


def test_a_held_lock_and_a_shard_manifest_decode_into_their_structs(tmp_path):
    src = write_jsonl(tmp_path / "tokens.jsonl", records(8))
    out = tmp_path / "shards"
    r = kp("shard", src, "--out", out, "--eval-fraction", "0.3", "-q")
    assert r.code == 0, r.stderr
    manifest = (out / "kp-shard.manifest").read_bytes()
    same_json_again(manifest, ShardManifest, indent=1)
    assert msgspec.json.decode(manifest, type=ShardManifest).totals.records == 8

    with OutputLock(str(tmp_path / "t.jsonl"), "kp-test") as lock:
        with open(lock.lock_file, "rb") as f:
            held = f.read()
        same_json_again(held, LockHolder)
        assert msgspec.json.decode(held, type=LockHolder).pid == os.getpid()
