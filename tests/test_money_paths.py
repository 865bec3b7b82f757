"""TOTAL_COST as a build passes it (`--total-cost` with `--reservations`) while paid answers
are refused, whatever refuses them: one run per refusal kind, at 50 and at 2000 in flight,
two runs sharing one reservations file at once (make -j), and `make all` over three
datasets. The stand-in's ledger is the bill; it counts usage with the bundled tokenizer, as
a provider serving the model does.

Why these exist: a refused answer is paid while its prompt keeps its worst case reserved
for the retry, so a run's spend + claim grows past what the cap last allowed. A shared
run used to take that growth, once published, as room the cap had given (infer/total_cost.py
`TotalCost.room`), and let retries and new requests through unchecked: $0.23-0.32 billed
under a $0.08 cap, exit 0. The older money tests had too few refusals in flight at once
(4 in flight, a few refusals) to open the gap; these run a refusal rate and a concurrency
at which the old code is seen to fail (each kind: billed 2.6-4x the cap).
"""

from __future__ import annotations

import os
import subprocess

import pytest
from conftest import BIN, read_jsonl, write_jsonl
from helpers import CAPS, billed, cap_reached, money_is_exact, time_left
from test_infer import infer, make_prompts
from test_make import make

from kimipipe.standin.answers import expected_answer

MODEL = "moonshotai/kimi-k2.5"

TOKENIZER = "kimipipe/data/tokenizers/kimi-k2.5-mini-fast"
CAP = 0.08
LATENCY = 0.5
ROUTE = ("--only-provider", "together", "--only-provider", "parasail")
# answers of ~100-300 tokens under a 1024-token worst case: each settles far below its
# reservation, which is what a run's room is made of
FLAGS = ("--max-tokens", "1024", *ROUTE)

# A provider (Together) whose answers are paid and refused, one way per refusal kind. Each
# rate was chosen so that the run without the fix bills well over the cap (seen: no_reasoning
# $0.32, think_marker $0.21, routing_violation $0.25, identity $0.21 under $0.08).
KINDS = {
    "no_reasoning": dict(drop_reasoning={"together": 1.0, "parasail": 0.6}),
    # (with prompts whose answers hold a literal tag: every inline split is uncertain)
    "think_marker": dict(inline_reasoning=["together"]),
    "routing_violation": dict(faults={"misroute": 0.6}),
    "identity": dict(impostors={"together": 1, "parasail": 1}),
}
# the impostor is never quarantined, so that every answer it serves is refused and paid
KIND_FLAGS = {"identity": ("--identity-strikes", "100000")}


def tagged_prompts(path, n: int, start: int = 0):
    """N prompts whose stand-in answers hold a literal think tag where an inline split
    makes it uncertain (a `</think>` in the reasoning, a tag in the content)."""
    rows = []
    for i in range(start, start + 100_000):
        [row] = read_jsonl(make_prompts(path, 1, start=i))
        want = expected_answer(row["messages"], model=MODEL, seed=None, reasoning=True, max_tokens=1024)
        if "</think>" in want.reasoning or "<think>" in want.content or "</think>" in want.content:
            rows.append(row)
            if len(rows) == n:
                return write_jsonl(path, rows)
    raise AssertionError("the stand-in writes too few literal tags")


def refusals(*paths) -> dict[str, int]:
    counts: dict[str, int] = {}
    for path in paths:
        if not path.exists():
            continue
        for rec in read_jsonl(path):
            for x in rec.get("refused", ()):
                counts[x["kind"]] = counts.get(x["kind"], 0) + 1
    return counts


def run_under_cap(standin, tmp_path, kind: str, concurrency: int, prompts: int = 200):
    server = standin(ledger=True, tokenizer=TOKENIZER, latency=LATENCY, **KINDS[kind])
    source = (tagged_prompts if kind == "think_marker" else make_prompts)(tmp_path / "p.jsonl", prompts)
    out, failures = tmp_path / "r.jsonl", tmp_path / "f.jsonl"
    r = infer(server, source, "-o", out, "--failures", failures, "--tokenizer", TOKENIZER,
              "--total-cost", f"{CAP}", "--reservations", tmp_path / "total-cost.json",
              "--concurrency", f"{concurrency}", *FLAGS, *KIND_FLAGS.get(kind, ()),
              timeout=time_left())
    return server, r, out, failures


@pytest.mark.parametrize("kind", list(KINDS))
def test_total_cost_with_reservations_holds_whatever_refuses_the_answers(standin, tmp_path, kind):
    """Each refusal kind, 200 prompts at 50 in flight: the cap stops the run (exit 3, the
    refused prompts' paid answers kept on `stopped` lines) with the bill under the cap, and
    every answer billed is recorded."""
    server, r, out, failures = run_under_cap(standin, tmp_path, kind, 50)
    assert billed(server) <= CAP, f"{kind}: billed {billed(server):.4f} under a {CAP} cap"
    assert r.code == 3 and "--total-cost reached" in r.stderr, r.stderr
    assert refusals(out, failures).get(kind, 0) >= 3  # the refusals did happen, and were paid
    money_is_exact(server, read_jsonl(out), read_jsonl(failures) if failures.exists() else [])


def test_total_cost_with_reservations_holds_at_2000_in_flight(standin, tmp_path):
    """The user's concurrency: every prompt admitted at once, the refusals' retries racing
    the cap."""
    server, r, out, failures = run_under_cap(standin, tmp_path, "no_reasoning", 2000, prompts=300)
    assert billed(server) <= CAP, f"billed {billed(server):.4f} under a {CAP} cap"
    assert r.code == 3, r.stderr
    assert refusals(out, failures).get("no_reasoning", 0) >= 3
    money_is_exact(server, read_jsonl(out), read_jsonl(failures) if failures.exists() else [])


def test_two_runs_sharing_one_reservations_file_at_once_stay_under_the_cap(standin, tmp_path):
    """make -j's shape: two datasets' kp-infer at the same time, one --total-cost, one
    --reservations file, each counting the other's files (--spent-in) and claims."""
    server = standin(ledger=True, tokenizer=TOKENIZER, **KINDS["no_reasoning"])
    work = tmp_path / "work"
    work.mkdir()
    spent_in = ("--spent-in", str(work / "*.responses.jsonl"), "--spent-in", str(work / "*.failures.jsonl"))
    runs = []
    for i, name in enumerate(("B3", "B4")):
        prompts = make_prompts(work / f"{name}.prompts.jsonl", 150, dataset=name, start=1000 * i)
        cmd = [str(BIN / "kp-infer"), "--base-url", server.base_url, "--backoff-base", "0.01",
               str(prompts), "-o", str(work / f"{name}.responses.jsonl"),
               "--failures", str(work / f"{name}.failures.jsonl"), "--total-cost", f"{CAP}", *spent_in,
               "--reservations", str(work / "total-cost.json"), "--concurrency", "50",
               "--tokenizer", TOKENIZER, *FLAGS]
        runs.append(subprocess.Popen(cmd, env={**os.environ, "OPENROUTER_API_KEY": server.api_key},
                                     stderr=open(work / f"{name}.stderr", "w")))
    try:
        codes = [p.wait(timeout=time_left()) for p in runs]
    except subprocess.TimeoutExpired:
        for p in runs:
            p.kill()
        said = {n: (work / f"{n}.stderr").read_text()[-3000:] for n in ("B3", "B4")}
        # (seen at load ~11-20, 1 run in 3: each run's last attempts sent and never
        # answered; the stand-in's books say whether they reached it)
        raise AssertionError(f"the runs did not end: {said}\n{(work / 'total-cost.json').read_text()}"
                             f"\nthe stand-in: {server.stats()}") from None
    assert billed(server) <= CAP, f"billed {billed(server):.4f} under a {CAP} cap"
    assert codes == [3, 3], [(work / f"{n}.stderr").read_text() for n in ("B3", "B4")]
    files = sorted(work.glob("*.responses.jsonl")) + sorted(work.glob("*.failures.jsonl"))
    assert refusals(*files).get("no_reasoning", 0) >= 3
    money_is_exact(server, [x for f in work.glob("*.responses.jsonl") for x in read_jsonl(f)],
                   [x for f in work.glob("*.failures.jsonl") for x in read_jsonl(f)])


def test_make_all_keeps_total_cost_across_three_datasets_with_answers_refused(standin, tmp_path):
    """`make all DATASETS="B3 B4 B5" TOTAL_COST=0.08 ALLOW_SHORT=1` with a provider that
    drops the reasoning from most answers: the bill never passes TOTAL_COST, make stops on
    the cap (naming TOTAL_COST), and a rerun with the same cap pays nothing more."""
    server = standin(ledger=True, tokenizer=TOKENIZER, **KINDS["no_reasoning"])
    from test_make import SOURCE
    sources = {f"SOURCE_{d}": SOURCE for d in ("B3", "B4", "B5")}
    flags = "--backoff-base 0.05 --quiet " + " ".join(ROUTE)
    r = make(server, tmp_path, "all", DATASETS="B3 B4 B5", TOTAL_COST=CAP, MAX_COST=95,
             ALLOW_SHORT=1, CONCURRENCY=50, INFER_FLAGS=flags, **sources)
    assert billed(server) <= CAP, f"billed {billed(server):.4f} under TOTAL_COST={CAP}"
    assert r.returncode == 2, r.stderr  # make: a recipe failed, the cap's stop (below)
    said = " ".join(r.stderr.split())
    assert "make: B3 stopped by TOTAL_COST=0.08" in said, said
    work = tmp_path / "work"
    files = sorted(work.glob("*.responses.jsonl")) + sorted(work.glob("*.failures.jsonl"))
    assert refusals(*files).get("no_reasoning", 0) >= 3
    # a rerun with the same cap resumes into what room is left, and no further
    r = make(server, tmp_path, "all", DATASETS="B3 B4 B5", TOTAL_COST=CAP, MAX_COST=95,
             ALLOW_SHORT=1, CONCURRENCY=50, INFER_FLAGS=flags, **sources)
    assert r.returncode == 2 and billed(server) <= CAP, r.stderr
    responses = [x for d in ("B3", "B4", "B5") if (work / f"{d}.responses.jsonl").exists()
                 for x in read_jsonl(work / f"{d}.responses.jsonl")]
    failed = [x for f in work.glob("*.failures.jsonl") for x in read_jsonl(f)]
    money_is_exact(server, responses, failed)


# -- every cap x every path a paid answer takes (docs/money.md's table) ----------------------


def mixed_prompts(path, singles: int, tagged: int, conversations: int):
    """CONVERSATIONS of three user turns (first: their later turns come before the cap),
    TAGGED whose answers hold a literal think tag (next: they go while Parasail still serves
    the model), SINGLES one-turn prompts."""
    from test_infer_conversations import make_conversations
    rows = read_jsonl(make_conversations(path, conversations, turns=3))
    rows += read_jsonl(tagged_prompts(path, tagged, start=10_000))
    rows += read_jsonl(make_prompts(path, singles))
    return write_jsonl(path, rows)


PATHS = ("kept", "no_reasoning", "think_marker", "routing_violation", "identity",
         "failed at --max-attempts", "stream cut after usage", "conversation turn")


@pytest.mark.parametrize("cap", list(CAPS))
def test_each_cap_holds_on_every_path_a_paid_answer_takes(standin, tmp_path, cap):
    """One run under each cap where paid answers take every path at once: kept; refused for
    each reason and sent again (Together drops reasoning; Parasail writes it inline, where
    a literal tag makes the split uncertain, and turns into another model from its 12th
    answer; misroutes); refused at --max-attempts (a failure line carries the cost); a
    stream cut after its usage (kept: the answer is whole and billed); a conversation's
    later turn. The bill stays under the cap, the cap stops the run (3), and every answer
    billed is on a record or a failure line."""
    server = standin(ledger=True, tokenizer=TOKENIZER, drop_reasoning={"together": 0.6},
                     inline_reasoning=["parasail"], impostors={"parasail": 12},
                     faults={"usagecut": 0.5, "misroute": 0.15})
    source = mixed_prompts(tmp_path / "p.jsonl", 100, 60, 40)
    out, failures = tmp_path / "r.jsonl", tmp_path / "f.jsonl"
    r = infer(server, source, "-o", out, "--failures", failures, "--max-attempts", "2",
              "--tokenizer", TOKENIZER, "--identity-strikes", "100000",
              "--concurrency", "50", *FLAGS, *CAPS[cap](tmp_path, CAP), timeout=time_left())
    assert billed(server) <= CAP, f"{cap}: billed {billed(server):.4f} under a {CAP} cap"
    assert r.code == 3 and cap_reached(cap) in r.stderr, r.stderr
    records = read_jsonl(out)
    failed = read_jsonl(failures) if failures.exists() else []
    cut = {x["generation_id"] for x in server.ledger() if x.get("fault") == "usagecut"}
    seen = {"kept": len(records), **refusals(out, failures),
            "failed at --max-attempts": sum(1 for f in failed if f["kind"] != "stopped"),
            "stopped: no room for the retry": sum(1 for f in failed if f["kind"] == "stopped"),
            "stream cut after usage": sum(1 for x in records if x["generation_id"] in cut),
            "conversation turn": sum(1 for x in records if x.get("turn", 1) > 1)}
    assert all(seen.get(path) for path in PATHS), f"paths seen: {seen}"
    money_is_exact(server, records, failed)


@pytest.mark.parametrize("cap", list(CAPS))
def test_each_cap_counts_answers_rescued_from_a_full_output(standin, tmp_path, cap):
    """Answers paid for while the output could take no more (a file size limit) are kept in
    the rescue file; the rerun takes them in and counts them against the cap: a cap set
    just above what the first run billed leaves the rerun that much and no more."""
    import resource
    import signal

    from test_infer_disk import rescue_file, run_infer

    def limited():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (60_000, 60_000))

    server = standin(ledger=True)
    source = make_prompts(tmp_path / "p.jsonl", 200)
    out, tmpdir = tmp_path / "r.jsonl", tmp_path / "tmp"
    tmpdir.mkdir()
    args = (source, "-o", out, "--concurrency", "16", *FLAGS)
    code, err = run_infer(server, *args, tmpdir=tmpdir, preexec=limited)
    assert code == 3 and "kept in" in err, err
    rescued = read_jsonl(rescue_file(tmpdir, out))
    assert rescued
    limit = billed(server) + 0.01
    code, err = run_infer(server, *args, *CAPS[cap](tmp_path, limit), tmpdir=tmpdir)
    assert code == 3 and "took in" in err, err
    assert billed(server) <= limit, f"{cap}: billed {billed(server):.4f} under {limit}"
    records = read_jsonl(out)
    assert {x["id"] for x in rescued} <= {x["id"] for x in records}  # taken in, not asked again
    money_is_exact(server, records)


def test_every_cell_of_docs_money_table_names_a_test_that_exists():
    """docs/money.md's cap x path table: each test a cell names, with the parameter it
    names ("the same `[cap]`": the test of the cell to its left, under this column's cap), is
    one pytest collects, so a renamed or deleted test or parameter leaves no cell held by
    nothing; a cell names a test or says why none applies."""
    import re
    import sys

    from conftest import REPO
    text = (REPO / "docs" / "money.md").read_text()
    table = text[text.index("## Every cap on every path"):text.index("## An answer whose usage")]
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) >= 12
    files = sorted({f"tests/{f}" for f in re.findall(r"tests/(test_\w+\.py)", table)}
                   | {"tests/test_money_paths.py"})
    collected = subprocess.run([sys.executable, "-m", "pytest", "-q", "--co", "-p", "no:xdist", *files],
                               cwd=REPO, capture_output=True, text=True, timeout=120).stdout
    ids = {x.split("::", 1)[1] for x in collected.splitlines() if "::" in x}
    # a name, "...its_tail" (abbreviated, the row above names it whole) or `[param]` alone
    ref = re.compile(r"(\.\.\.)?(test_\w+?|(?<=\.\.\.)\w+?)?(\.\.\.)?(\[[\w-]+\])?`")
    reasons = ("per run", "(as at 50)", "not shared", "not a build's path")
    named = 0
    for row in rows:
        left = None
        for cell in row.strip(" |").split(" | ")[1:]:
            found = []
            for dots, name, more, param in ref.findall(cell):
                if not name and param and left:  # "the same `[cap]`"
                    name = left
                if not name:
                    continue
                want = name + param
                if dots or more:  # abbreviated: the end of a name (with its parameter)
                    match = [i for i in ids if i.endswith(want) or i.startswith(name) and param
                             and i.endswith(param) or not param and name in i]
                else:
                    match = [i for i in ids if i == want or i.startswith(want + "[")]
                assert match, f"{row}: {want} is collected by no test"
                found.append(match[0].split("[")[0])
            assert found or cell.strip().startswith(reasons) or cell.strip() == "the same", row
            # ("the same" alone: the test of the cell above, this column's parameter)
            left = found[0] if found else left
            named += len(found)
    assert named >= 25  # (28 when written)
