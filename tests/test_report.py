"""The build report: `kp-infer report FILE... --html OUT` and `make report`, from real files.

The files are a small two-dataset build written here (responses, failures, token records,
rejects) and a shard set made from them by kp-shard itself; the page is then read back
as a person's browser would parse it: its CSP, its links, every plot's SVG. That every plot
renders, offline, without a console error, is checked in a real browser on the demo's
report (test_make.py::test_make_demo_runs_the_whole_pipeline_offline).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest
from conftest import BIN, REPO, kp, read_jsonl, write_jsonl
from helpers import KP_COMMANDS

VENV = Path(sys.executable).parent.parent
T0 = 1_790_000_000  # a time in 2026, seconds
PROVIDERS = ["Together", "DeepInfra", "Moonshot AI"]


def at(seconds: float) -> str:
    import datetime
    t = datetime.datetime.fromtimestamp(T0 + seconds, datetime.UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def response(dataset: str, i: int, **extra) -> dict:
    provider = PROVIDERS[i % 3]
    completion = 40 + 37 * i
    return {"id": f"{dataset}-{i}", "dataset": dataset, "messages": [{"role": "user", "content": f"q{i}"}],
            "response": {"content": "a", "reasoning": "r"}, "finish_reason": "length" if i % 5 == 4 else "stop",
            "model": "moonshotai/kimi-k2.5", "provider": provider, "generation_id": f"gen-{dataset}-{i}",
            "usage": {"prompt_tokens": 10 + i, "completion_tokens": completion,
                      "reasoning_tokens": completion // 2, "cost": round(0.001 * (i + 1), 6)},
            "attempts": 1, "latency_s": 0.5 + 0.1 * (i % 4), "finished_at": at(10 * i + (dataset == "B2")),
            **extra}


def token_record(rec: dict, **extra) -> dict:
    n_in, n_out = 20 + int(rec["id"].split("-")[1]) * 300, rec["usage"]["completion_tokens"] * 8
    return {**rec, "input_ids": list(range(1, n_in + 1)), "output_ids": list(range(5, n_out + 5)), **extra}


def write_build(work: Path, deltas: bool = True, turns: bool = True) -> dict:
    """Two datasets' files, as a build leaves them; returns what the page must show."""
    work.mkdir(parents=True, exist_ok=True)
    b1 = []
    for i in range(12):
        extra = {}
        if turns:  # conversations of 3 turns; c1 cut by a length turn, c3 still going
            c, turn = divmod(i, 3)
            extra = {"conversation": f"c{c}", "turn": turn + 1, "turns": 3}
        b1.append(response("B1", i, **extra))
    b1 = [r for r in b1 if r["id"] not in ("B1-5", "B1-11")]  # c1 ends at its length turn 2, c3 unfinished
    b1[0]["refused"] = [{"kind": "routing_violation", "provider": "Fireworks", "cost": 0.002,
                         "generation_id": "g-x", "message": "quantization fp4"}]
    b2 = [response("B2", i) for i in range(6)]
    write_jsonl(work / "B1.responses.jsonl", b1)
    write_jsonl(work / "B2.responses.jsonl", b2)
    write_jsonl(work / "B1.failures.jsonl", [
        {"id": "B1-99", "dataset": "B1", "kind": "no_reasoning", "status": 200, "code": "no_reasoning",
         "message": "m", "attempts": 8, "time": at(55), "provider": "Parasail", "cost": 0.003,
         "refused": [{"kind": "no_reasoning", "provider": "Parasail", "cost": 0.003}]},
        {"id": "B1-98", "dataset": "B1", "kind": "think_marker", "status": 200, "code": "c", "message": "m",
         "attempts": 1, "time": at(56), "provider": "Parasail", "cost": 0.004},  # an older line
        {"id": "B1-97", "dataset": "B1", "kind": "permanent", "status": 400, "code": "400", "message": "m",
         "attempts": 1, "time": at(57)}])
    tokens = []
    for k, rec in enumerate(b1):
        extra = {"prompt_tokens_delta": k % 2, "completion_tokens_delta": -(k % 3)} if deltas else {}
        tokens.append(token_record(rec, **extra))
    # a token record whose response file was not given: its answer still counts
    tokens.append(token_record(response("B1", 20)))
    with open(work / "B1.tokens.jsonl", "w") as f:
        for rec in tokens:
            f.write(json.dumps(rec) + "\n")
    write_jsonl(work / "B1.rejects.jsonl", [
        {"id": "B1-3", "line": 4, "reason": "chat template failed: no user turn"},
        {"id": "B1-6", "line": 7, "reason": 'finish_reason "content_filter": the turn did not end normally'}])
    write_jsonl(work / "B2.rejects.jsonl", [{"id": "B2-1", "line": 2, "reason": "chat template failed: x"}])
    spend = (sum(r["usage"]["cost"] for r in b1 + b2) + 0.002 + 0.003 + 0.004
             + response("B1", 20)["usage"]["cost"])
    return {"spend": spend, "answers": len(b1) + len(b2) + 1}


class _Page(HTMLParser):
    """The page as a browser's parser sees it: every tag's attributes, the tables' text."""

    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.rows: list[list[str]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag == "tr":
            self.rows.append([])
        elif tag == "td":
            self._cell = []

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            self.rows[-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def figures(text: str) -> dict[str, str]:
    """{figure id: its SVG} of every plot on the page."""
    return dict(re.findall(r'<figure class="plot" id="([^"]+)">.*?(<svg.*?</svg>)\s*</figure>', text, re.S))


def notes(text: str) -> set[str]:
    return set(re.findall(r'<figure class="note" id="([^"]+)">', text))


def _area(element: ET.Element) -> float:
    """The area of the box around the points of ELEMENT's paths (SVG units)."""
    numbers = [float(n) for p in element.iter() if p.tag.endswith("path")
               for n in re.findall(r"-?\d+(?:\.\d+)?", p.get("d", ""))]
    xs, ys = numbers[0::2], numbers[1::2]
    return (max(xs) - min(xs)) * (max(ys) - min(ys)) if len(xs) > 1 else 0.0


def assert_every_panel_has_data(svgs: dict[str, str]) -> None:
    """Each axes of each plot holds data marks with an area (not an empty axis)."""
    for name, svg in svgs.items():
        root = ET.fromstring(svg)
        panels = [g for g in root.iter() if g.get("id", "").startswith("axes_")]
        assert panels, f"{name}: no axes"
        for axes in panels:
            marks = [g for g in axes.iter() if g.get("id", "").startswith("kp-data-")]
            assert any(_area(m) > 0 for m in marks), f"{name} {axes.get('id')}: no data drawn"


def assert_self_contained(text: str, parser: _Page) -> None:
    assert "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'" in text
    for tag, attrs in parser.tags:
        for name in ("src", "href", "xlink:href", "action", "data"):
            value = attrs.get(name) or ""
            assert not re.match(r"\s*(https?:|//|ftp:)", value), f"<{tag} {name}={value}> leaves the file"
    assert tag != "script" and not any(t == "script" for t, _ in parser.tags)
    assert not any(t == "link" for t, _ in parser.tags)


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    work = tmp_path_factory.mktemp("report") / "work"
    expected = write_build(work)
    r = kp("shard", work / "B1.tokens.jsonl", "--out", work.parent / "shards" / "B1", "--name", "B1")
    assert r.code == 0, r.stderr
    return work, expected


def test_html_report_from_any_files_of_a_build(build, tmp_path):
    work, expected = build
    out = tmp_path / "report.html"
    files = [work / "B1.responses.jsonl", work / "B2.responses.jsonl", work / "B1.failures.jsonl",
             work / "B1.tokens.jsonl", work / "B1.rejects.jsonl", work / "B2.rejects.jsonl",
             work.parent / "shards"]
    r = kp("infer", "report", *files, "--html", out, "--max-cost", "0.05", "--total-cost", "0.1",
           "--token-budget", "2k")
    assert r.code == 0, r.stderr
    assert r.stdout == b"" and f"kp-infer: the build report is in {out}" in r.stderr
    text = out.read_text()
    page = _Page()
    page.feed(text)
    assert_self_contained(text, page)
    svgs = figures(text)
    assert_every_panel_has_data(svgs)
    # what the files hold is plotted, not noted as missing
    for key in ("spend", "usd-per-m", "refused-cost", "tokens-budget", "reasoning", "finish", "share",
                "latency", "tokens-per-s", "lengths", "refusals", "row-lengths", "kept-whole", "turns",
                "cut", "rejects", "deltas"):
        assert f"plot-{key}" in svgs, f"{key} not plotted ({sorted(notes(text))})"
    # ... for the whole build and for each dataset
    for d in ("B1", "B2"):
        assert f'<details id="dataset-{d}">' in text
        assert f"plot-{d}--share" in svgs and f"plot-{d}--finish" in svgs
    assert "plot-B1--deltas" in svgs and "note-B2--deltas" in notes(text)  # B2 has no token records
    assert "plot-B1--row-lengths" in svgs and "note-B2--row-lengths" in notes(text)
    # the money as kp-infer report counts it, over the responses and failures
    text_report = kp("infer", "report", *files[:3], "--json")
    assert text_report.code == 0, text_report.stderr
    counted = json.loads(text_report.stdout)
    overview = {row[0]: row for row in page.rows if row and row[0] in ("B1", "B2", "whole build")}
    whole = overview["whole build"]
    assert whole[1] == f"{expected['answers']:,}" == f"{counted['answers'] + 1:,}"  # + the token-only one
    assert counted["spend"] + 0.021 == pytest.approx(expected["spend"])
    assert whole[4] == f"${expected['spend']:.4f} of $0.1000 (111%)"  # TOTAL_COST, the whole build
    assert overview["B1"][4] == "$0.0900 of $0.0500 (180%)"  # MAX_COST, each dataset
    assert overview["B2"][4] == "$0.0210 of $0.0500 (42%)"
    assert overview["B1"][2] == "3no_reasoning 1, think_marker 1, permanent 1"  # failures, by kind
    assert overview["B1"][3] == "3" and overview["B2"][3] == "0"  # refused answers
    assert overview["B1"][6] == "3.03k of 2k (152%)"  # completion tokens, the token-only answer's too
    assert overview["B1"][-1] == "2" and overview["B2"][-1] == "1"  # rejects, B2's by its file name
    assert overview["B1"][9] == "11 (shards)" and overview["B2"][9] == "0"
    # multi-turn: 4 conversations of 3 turns: c0 and c2 complete, c1 cut by length, c3 unfinished
    cut = ET.fromstring(svgs["plot-cut"])
    labels = [t.text for t in cut.iter() if t.tag.endswith("text") and t.text]
    assert "complete" in labels and "cut (a turn ended by length)" in labels
    assert "unfinished (a failure, or still running)" in labels


def test_missing_fields_are_said_not_drawn_empty(tmp_path):
    """Records without the multi-turn fields, token deltas, finish times or shards: each
    such plot says why it is not there; every plot that is there has data."""
    work = tmp_path / "work"
    write_build(work, deltas=False, turns=False)
    tokens = [json.loads(line) for line in (work / "B1.tokens.jsonl").read_text().splitlines()]
    for rec in tokens[::2]:  # written before `finished_at` existed
        del rec["finished_at"]
    write_jsonl(work / "B1.tokens.jsonl", tokens)
    out = tmp_path / "r.html"
    r = kp("infer", "report", work / "B1.tokens.jsonl", "--html", out)
    assert r.code == 0, r.stderr
    text = out.read_text()
    said = notes(text)
    assert {"note-turns", "note-cut", "note-deltas", "note-rejects"} <= said
    assert_every_panel_has_data(figures(text))
    assert "plot-spend" in figures(text) and "in file order" in text  # some records have no time
    assert "plot-row-lengths" in figures(text) and "From the token records" in text


def test_html_report_refuses_a_line_it_cannot_read(tmp_path):
    bad = write_jsonl(tmp_path / "x.jsonl", [response("B1", 0), {"id": "q", "something": 1}])
    out = tmp_path / "r.html"
    r = kp("infer", "report", bad, "--html", out)
    assert r.code == 2
    assert f"{bad}:2: not a response, token, failure or reject record" in r.stderr
    assert not out.exists() and not list(tmp_path.glob("r.html*"))
    r = kp("infer", "--html", out)
    assert r.code == 2 and "--html goes with --report" in r.stderr


def test_make_report_writes_work_report_html_with_each_datasets_budget(build, tmp_path):
    work, _ = build
    r = subprocess.run(["make", "-C", str(REPO), "report", f"VENV={VENV}", f"WORK={work}",
                        f"SHARDS={work.parent / 'shards'}", "DATASETS=B1 B2 B3", "TOTAL_COST=0.1",
                        "MAX_COST=", "TOKEN_BUDGET=1k", "TOKEN_BUDGET_B2=5k"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = work / "report.html"
    assert f"make report: the build report is in {out}" in r.stdout
    page = _Page()
    page.feed(out.read_text())
    overview = {row[0]: row for row in page.rows if row and row[0] in ("B1", "B2", "B3", "whole build")}
    assert "of 1k" in overview["B1"][6] and "of 5k" in overview["B2"][6]
    assert overview["B3"][1] == "0"  # named, nothing built yet
    assert "of $0.1000" in overview["whole build"][4] and "of" not in overview["B1"][4]
    assert str(work.parent / "shards" / "B1") in out.read_text()  # the shard set was read


def _imported(args: list[str], **kw) -> tuple[int, set[str]]:
    """The top-level modules a command imported (python -X importtime on its script)."""
    r = subprocess.run([sys.executable, "-X", "importtime", *args], capture_output=True, text=True,
                       timeout=120, **kw)
    return r.returncode, {line.split("|")[-1].strip().split(".")[0]
                          for line in r.stderr.splitlines() if line.startswith("import time:")}


def test_only_html_imports_matplotlib(build, tmp_path):
    work, _ = build
    for command in KP_COMMANDS:
        code, modules = _imported([str(BIN / f"kp-{command}"), "--help"])
        assert code == 0 and "matplotlib" not in modules, command
    code, modules = _imported([str(BIN / "kp-infer"), "report", str(work / "B1.responses.jsonl")])
    assert code == 0 and "matplotlib" not in modules
    code, modules = _imported([str(BIN / "kp-infer"), "report", str(work / "B1.responses.jsonl"),
                               "--html", str(tmp_path / "r.html")])
    assert code == 0 and "matplotlib" in modules  # (the check sees an import when there is one)


def test_html_without_matplotlib_says_which_extra_to_install(build, tmp_path):
    work, _ = build
    script = ("import sys; sys.modules['matplotlib'] = None; sys.argv = ['kp-infer', 'report', "
              f"{str(work / 'B1.responses.jsonl')!r}, '--html', {str(tmp_path / 'r.html')!r}]; "
              "from kimipipe.commands.infer import main; main()")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                       env={**os.environ})
    assert r.returncode == 2
    assert "--html needs matplotlib" in r.stderr and "pip install 'kimipipe[report]'" in r.stderr
    assert not (tmp_path / "r.html").exists()


def test_the_report_draws_a_runs_retries_says_which_api_answered_and_verifies_the_shards(
        standin, build, tmp_path):
    """A run against the stand-in with 429s and 502s: the page counts the retries its records
    carry (the run's own summary's), draws them over time, marks the build as offline; a
    real API's records are not so marked; each shard set gets kp-shard verify's verdict,
    and a damaged one its first problem, not a stop."""
    from test_infer import infer, make_prompts

    server = standin(faults={"429": 0.3, "502": 0.15}, retry_after=0.05, seed=5, ledger=True)
    prompts = make_prompts(tmp_path / "p.jsonl", 24)
    out, failures = tmp_path / "B3.responses.jsonl", tmp_path / "B3.failures.jsonl"
    r = infer(server, prompts, "-o", out, "--failures", failures, "--max-attempts", "2",
              "--max-cost", "5")
    assert r.code in (0, 4), r.stderr  # (4: a prompt ran out of attempts)
    said = dict(re.findall(r"(\d+|[a-z]+): (\d+)", re.search(r"  retries: (.*)", r.stderr).group(1)))
    records = [json.loads(x) for f in (out, failures) if f.exists() for x in f.read_text().splitlines()]
    on_records: dict[str, int] = {}
    for rec in records:
        for cause, n in (rec.get("retried") or {}).items():
            on_records[cause] = on_records.get(cause, 0) + n
    assert on_records == {k: int(v) for k, v in said.items()} and on_records.get("429"), (on_records, said)
    assert all(rec.get("retried") for rec in records if "response" not in rec)  # a failure's too
    html_out = tmp_path / "r.html"
    r = kp("infer", "report", out, *([failures] if failures.exists() else []), "--html", html_out)
    assert r.code == 0, r.stderr
    text = html_out.read_text()
    page = _Page()
    page.feed(text)
    row = next(row for row in page.rows if row and row[0] == "B3")
    total = sum(on_records.values())
    assert row[11] == f"{total:,} ({on_records['429']:,})"  # retries (429s)
    assert row[12] == "-"  # no shard set given
    assert "plot-retries" in figures(text) and f"429 {on_records['429']:,}" in text
    assert_every_panel_has_data({"plot-retries": figures(text)["plot-retries"]})
    banner = re.search(r'<p class="offline" id="api">(.*?)</p>', text, re.S).group(1)
    answers = sum(1 for rec in records if "response" in rec)
    assert f"OFFLINE: {answers:,} answers are the kimipipe stand-in's" in banner
    assert f"127.0.0.1: the stand-in ({len(records):,} records)" in banner

    # kp-infer report says the same in text and JSON
    r = kp("infer", "report", out, *([failures] if failures.exists() else []), "--json")
    counted = json.loads(r.stdout)
    assert counted["retries"] == on_records and counted["standin_answers"] == answers
    assert counted["apis"] == {"127.0.0.1": len(records)}
    said = kp("infer", "report", out, *([failures] if failures.exists() else [])).stdout.decode()
    assert (f"  answered by: 127.0.0.1 ({len(records):,} records); OFFLINE: {answers:,} answers are "
            "the kimipipe stand-in's") in said
    assert f"  retries: {total:,} attempts sent again (" in said and f"429: {on_records['429']:,}" in said

    # records of the real API (and older ones without `api`): named, not marked offline
    work, _ = build
    real = [dict(json.loads(x), api="openrouter.ai") for x in (work / "B2.responses.jsonl").read_text().splitlines()]
    write_jsonl(tmp_path / "B2.responses.jsonl", real)
    shards = tmp_path / "shards"
    shutil.copytree(work.parent / "shards" / "B1", shards / "B1")
    r = kp("infer", "report", tmp_path / "B2.responses.jsonl", work / "B1.responses.jsonl", shards,
           "--html", html_out)
    assert r.code == 0, r.stderr
    text = html_out.read_text()
    assert 'class="offline"' not in text and "OFFLINE" not in text
    assert re.search(r'id="api">Answered by: (not recorded \(10 records\), openrouter.ai \(6 records\)|'
                     r'openrouter.ai \(6 records\), not recorded \(10 records\))\.', text), text[:3000]
    assert "note-retries" in notes(text)
    said = kp("infer", "report", tmp_path / "B2.responses.jsonl").stdout.decode()
    assert "  answered by: openrouter.ai (6 records)\n" in said and "OFFLINE" not in said
    page = _Page()
    page.feed(text)
    assert next(row for row in page.rows if row and row[0] == "B1")[12] == "OK"
    shard = next((shards / "B1").glob("*.jsonl.zst"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    r = kp("infer", "report", work / "B1.responses.jsonl", shards, "--html", html_out)
    assert r.code == 0, r.stderr
    page = _Page()
    page.feed(html_out.read_text())
    verdict = next(row for row in page.rows if row and row[0] == "B1")[12]
    assert re.match(r"\d+ problem\(s\)", verdict) and "does not match the manifest" in verdict, verdict


def test_a_shard_set_whose_rows_still_read_shows_verifys_problem(tmp_path):
    """A shard rewritten whole with rows of the same lengths: its rows still read (the
    report counts them), and the verdict column is kp-shard verify's: its problems, the first
    naming the shard (its size, its sha256), not OK; a set left as it was is OK."""
    import zstandard
    from test_shard_export import build

    good = build(tmp_path, "good", prefix="g")
    bad = build(tmp_path, "bad", prefix="b")
    first = bad / json.loads((bad / "kp-shard.manifest").read_text())["shards"][0]["file"]
    rows = read_jsonl(first)
    rows[0]["input_ids"][0] += 1  # another token, the same lengths
    first.write_bytes(zstandard.ZstdCompressor().compress(
        b"".join(json.dumps(row).encode() + b"\n" for row in rows)))
    html_out = tmp_path / "r.html"
    for shards, verdict in ((good, "OK"), (bad, None)):
        r = kp("infer", "report", shards, "--html", html_out)
        assert r.code == 0, r.stderr
        page = _Page()
        page.feed(html_out.read_text())
        got = next(row for row in page.rows if row and row[0] == "B3")[12]
        if verdict is not None:
            assert got == verdict, got
        else:
            assert re.match(r"\d+ problem\(s\)", got) and f"{first.name}: " in got, got
