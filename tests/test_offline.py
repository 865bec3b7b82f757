"""Offline answers never pass for real ones (kimipipe/recorded/api.py): every record names the
API that answered, the stand-in marks its answers, a resume against another API refuses,
another API's spend counts against no cap; and the stand-in's own errors read as one line.

"Another API" is the one stand-in reached under a second host name (127.1 is 127.0.0.1 to
the resolver, another host to kp-infer), or records written as OpenRouter's would be."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

from conftest import read_jsonl, write_jsonl
from test_infer import infer, make_prompts


def other_host(server) -> str:
    return server.base_url.replace("127.0.0.1", "127.1")


def test_every_record_names_its_api_and_the_standins_are_marked(standin, tmp_path):
    server = standin(faults={"502": 1.0}, ledger=True)  # every request fails: failure lines too
    prompts = make_prompts(tmp_path / "p.jsonl", 3)
    r = infer(server, prompts, "-o", tmp_path / "r.jsonl", "--failures", tmp_path / "f.jsonl",
              "--max-attempts", "1", "--quiet")
    assert r.code == 4, r.stderr
    assert {f["api"] for f in read_jsonl(tmp_path / "f.jsonl")} == {"127.0.0.1"}
    server.configure(faults={})
    r = infer(server, prompts, "-o", tmp_path / "r.jsonl", "--failures", tmp_path / "f2.jsonl", "--quiet")
    assert r.code == 0, r.stderr
    answers = read_jsonl(tmp_path / "r.jsonl")
    assert len(answers) == 3 and {a["api"] for a in answers} == {"127.0.0.1"}
    assert all(a["generation_id"].startswith("gen-standin-") for a in answers)
    assert {x["generation_id"] for x in server.ledger()} == {a["generation_id"] for a in answers}


def test_a_resume_against_another_api_refuses_naming_both(standin, tmp_path):
    server = standin(ledger=True)
    prompts = make_prompts(tmp_path / "p.jsonl", 6)
    out, failures = tmp_path / "r.jsonl", tmp_path / "f.jsonl"
    r = infer(server, prompts, "-o", out, "--failures", failures, "--sample", "3", "--quiet")
    assert r.code == 0, r.stderr
    assert len(read_jsonl(out)) == 3
    paid = len(server.ledger())
    before = out.read_bytes()
    for extra in ([], ["--plan"]):  # the run and its plan alike
        r = infer(server, prompts, "-o", out, "--failures", failures, "--quiet", *extra,
                  "--base-url", other_host(server))
        assert r.code == 2, r.stderr
        said = " ".join(r.stderr.split())
        assert f"{out}: holds answers of 127.0.0.1 (the kimipipe stand-in's offline filler" in said
        assert "this run asks 127.1" in said and "--base-url of 127.0.0.1" in said
    assert out.read_bytes() == before and len(server.ledger()) == paid  # nothing sent
    # the failures file alike: a paid failure of OpenRouter's, resumed against the stand-in
    write_jsonl(failures, [{"id": "p00004", "dataset": "B3", "kind": "no_reasoning", "status": 200,
                            "code": "no_reasoning", "message": "", "attempts": 1,
                            "time": "2026-01-01T00:00:00Z", "cost": 0.5, "generation_id": "gen-1-a",
                            "api": "openrouter.ai"}])
    r = infer(server, prompts, "-o", out, "--failures", failures, "--quiet")
    assert r.code == 2 and f"{failures}: holds answers of openrouter.ai (first: id 'p00004')" in r.stderr
    # the same API on another port is the same API (a restarted stand-in): it resumes
    failures.unlink()
    again = standin(ledger=True)
    r = infer(again, prompts, "-o", out, "--failures", failures, "--quiet")
    assert r.code == 0, r.stderr
    assert len(read_jsonl(out)) == 6 and len(again.ledger()) == 3


def test_records_from_before_the_field_resume_as_before(standin, tmp_path):
    server = standin()
    prompts = make_prompts(tmp_path / "p.jsonl", 4)
    out = tmp_path / "r.jsonl"
    assert infer(server, prompts, "-o", out, "--sample", "2", "--quiet").code == 0
    old = [{k: v for k, v in rec.items() if k != "api"} for rec in read_jsonl(out)]
    write_jsonl(out, old)
    r = infer(server, prompts, "-o", out, "--quiet", "--base-url", other_host(server))
    assert r.code == 0, r.stderr
    assert len(read_jsonl(out)) == 4


def spent_in_file(path, api: str | None, cost: float):
    record = {"id": "x1", "dataset": "Z", "messages": [{"role": "user", "content": "hi"}],
              "response": {"content": "a"}, "finish_reason": "stop", "model": "m", "provider": "p",
              "generation_id": "gen-1-b", "usage": {"cost": cost}}
    return write_jsonl(path, [record | ({"api": api} if api else {})])


def test_another_apis_spend_counts_against_no_cap(standin, tmp_path):
    """--total-cost with --spent-in: $50 the stand-in recorded elsewhere does not stop a
    $1 cap of another API; the same $50 under this API does, and so does a record too old
    to say who answered it."""
    server = standin()
    prompts = make_prompts(tmp_path / "p.jsonl", 3)
    elsewhere = tmp_path / "elsewhere.jsonl"

    def plan(*args):
        r = infer(server, prompts, "-o", tmp_path / "r.jsonl", "--plan", "--json", "--total-cost", "1",
                  "--spent-in", str(elsewhere), *args)
        assert r.code == 0, r.stderr
        return json.loads(r.stdout)["total_cost"]["recorded"]

    spent_in_file(elsewhere, "127.0.0.1", 50.0)
    assert plan() == 50.0
    assert plan("--base-url", other_host(server)) == 0.0
    spent_in_file(elsewhere, None, 50.0)
    assert plan("--base-url", other_host(server)) == 50.0
    spent_in_file(elsewhere, "openrouter.ai", 50.0)  # a real run's spend, seen from the stand-in
    r = infer(server, prompts, "-o", tmp_path / "r.jsonl", "--total-cost", "1", "--spent-in",
              str(elsewhere), "--quiet")
    assert r.code == 0, r.stderr
    assert len(read_jsonl(tmp_path / "r.jsonl")) == 3
    spent_in_file(elsewhere, "127.0.0.1", 50.0)
    r = infer(server, prompts, "-o", tmp_path / "r2.jsonl", "--total-cost", "1", "--spent-in",
              str(elsewhere), "--quiet")
    assert r.code == 3, r.stderr  # this API's own spend does count


def test_plan_without_output_says_answered_prompts_count_as_to_do(standin, tmp_path):
    server = standin()
    prompts = make_prompts(tmp_path / "p.jsonl", 4)
    assert infer(server, prompts, "-o", tmp_path / "r.jsonl", "--sample", "2", "--quiet").code == 0
    r = infer(server, prompts, "--plan")
    assert r.code == 0, r.stderr
    text = " ".join(r.stdout.decode().split())
    assert "note: no -o: the answers a run already wrote cannot be seen here, so every prompt counts as to do" \
        in text and "4 to do" in text
    r = infer(server, prompts, "--plan", "-o", tmp_path / "r.jsonl")
    assert "no -o" not in r.stdout.decode() and "2 to do" in r.stdout.decode()


def test_the_standin_says_in_one_line_that_its_port_is_taken(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "kimipipe.standin", "--port", str(port)],
                           capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        f"standin: cannot listen on 127.0.0.1:{port}: the port is taken (something else listens "
        "there); pick another --port, or --port 0 (any free port) with --port-file FILE"]


def test_clean_removes_nothing_while_a_file_holds_paid_answers(tmp_path):
    """make clean's own rules (the make side: test_make.py): the list comes first, paid
    answers (not the stand-in's) stop it unless --paid, a kp-infer writing a file stops it."""
    from kimipipe.locks import OutputLock

    work, shards = tmp_path / "work", tmp_path / "shards"
    (shards / "A").mkdir(parents=True)
    (shards / "A" / "kp-shard.manifest").write_text("{}")
    work.mkdir()
    answer = {"id": "a", "usage": {"cost": 0.25}, "generation_id": "gen-standin-1-a", "api": "127.0.0.1"}
    write_jsonl(work / "A.responses.jsonl", [answer])
    (work / "A.prompts.jsonl").write_text("")
    (work / "AB.prompts.jsonl").write_text("")  # another dataset's: never touched
    args = [sys.executable, "-m", "kimipipe.make", "clean", "--work", str(work), "--shards", str(shards),
            "--datasets", "A"]
    with OutputLock(str(work / "A.responses.jsonl"), "kp-infer"):
        r = subprocess.run(args, capture_output=True, text=True)
    assert r.returncode == 2 and "kp-infer" in r.stderr and (work / "A.responses.jsonl").exists()
    write_jsonl(work / "A.responses.jsonl", [answer, answer | {"id": "b", "generation_id": "gen-9-b",
                                                                "api": "openrouter.ai"}])
    r = subprocess.run(args, capture_output=True, text=True)
    assert r.returncode == 2 and "1 paid record, $0.2500 (openrouter.ai)" in r.stderr
    assert (work / "A.prompts.jsonl").exists()  # nothing removed
    r = subprocess.run([*args, "--paid", "1"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[:4] == ["make clean: removing A:", f"  {work / 'A.prompts.jsonl'}",
                                         f"  {work / 'A.responses.jsonl'}", f"  {shards / 'A'}/ (1 file)"]
    assert sorted(p.name for p in work.iterdir()) == ["AB.prompts.jsonl"] and not (shards / "A").exists()
    r = subprocess.run(args, capture_output=True, text=True)
    assert r.returncode == 0 and "nothing to remove for A" in r.stdout
