"""What asking again a prompt fixed under its ID costs a resume: kp-infer's check that each
answer in the output was asked with its prompt's messages as they are now
(infer/resume.py `changed_prompts`), against the resume's own pass over the same output
(`previous_work`: the IDs, the spend and the tokens).

    .venv/bin/python bench/bench_resume_changed.py                 # 50,000 answers, 2 kB prompts
    .venv/bin/python bench/bench_resume_changed.py --answers 200000 --prompt-chars 500

Prints one JSON line: the output's size, each pass's seconds (best of --repeat) and the
check's over the resume pass's (the ratio: what the check adds to a resume's reading).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kimipipe.infer.inputs import validate_input  # noqa: E402
from kimipipe.infer.resume import changed_prompts, previous_work  # noqa: E402


def best(repeat: int, run) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        run()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--answers", type=int, default=50_000)
    parser.add_argument("--prompt-chars", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kp-bench-") as d:
        prompts, output = os.path.join(d, "p.jsonl"), os.path.join(d, "r.jsonl")
        text = "x" * args.prompt_chars
        with open(prompts, "w") as p, open(output, "w") as r:
            for i in range(args.answers):
                rec = {"id": f"p{i}", "dataset": "B3",
                       "messages": [{"role": "system", "content": "Be brief."},
                                    {"role": "user", "content": f"{i} {text}"}]}
                p.write(json.dumps(rec) + "\n")
                r.write(json.dumps({**rec, "response": {"content": text, "reasoning": text},
                                    "usage": {"cost": 0.001}}) + "\n")
        scan = validate_input(prompts, prompts)
        config = SimpleNamespace(output=output)
        check = best(args.repeat, lambda: changed_prompts(scan, scan.ids, config, print))
        resume = best(args.repeat, lambda: previous_work(output, None, print, repair=False))
        print(json.dumps({"answers": args.answers, "output_mb": round(os.path.getsize(output) / 1e6),
                          "changed_prompts_s": round(check, 3), "previous_work_s": round(resume, 3),
                          "check_over_resume_pass": round(check / resume, 2)}))


if __name__ == "__main__":
    main()
