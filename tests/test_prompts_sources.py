"""kp-prompts on real public dataset files: what each gives, and why.

The files are extracts of public repositories' data (LLaMA-Factory's demos, FastChat's
conversations and judge questions, Arena-Hard, the OpenAI cookbook, speculators' and
SpecForge's own test rows, LLaVA, axolotl, Stanford Alpaca, OpenAssistant, UltraChat).
Nobody in this project wrote them, and they are not in its tree: the tests read them in
place from ../shared/public-sources/ beside the clone (`KP_PUBLIC_SOURCES=DIR` points
elsewhere), whose README.md gives each file's origin and licence. A test that cannot find
one skips naming the path, an error in CI (conftest.py, `KP_NO_SKIP`).

SOURCES says, for each file, what `kp-prompts FILE --turns all|last --dataset T` gives:
the prompts written, the follow-ups among them, and the summary line (or the error). Each
figure is reasoned record by record from the file and docs/kp-prompts.md, in `why`; none
was copied from kimipipe's output.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from conftest import PUBLIC_SOURCES, kp, public_source

from kimipipe.prompts.formats import FORMATS


# The summary's clauses are "skipped N with <what> (<first records>)", "N conversations
# ended early, before a turn that is not plain text (first: ...)", "N tool declarations
# left out" and "skipped N duplicates (dropped: X repeats Y)" (docs/kp-prompts.md). `{f}`
# stands for the file's name below.
def cannot_tell(*fields: str) -> str:
    """kp-prompts' refusal of a record of no layout it reads, naming the fields it has and
    every field a format is detected by (from FORMATS, so a new format changes no test)."""
    detected = [f"`{key}`" for fmt in FORMATS.values() for key in fmt.detect]
    return ("cannot tell the format: the record has " + ", ".join(f"`{f}`" for f in fields)
            + f"; expected a {', '.join(detected[:-1])} or {detected[-1]} field (or force one "
            "with --format) at `$`")


@dataclass(frozen=True)
class Gives:
    prompts: int = 0
    follow_ups: int = 0
    said: str = ""  # stderr after "kp-prompts: "
    code: int = 0


def wrote(prompts: int, follow_ups: int = 0, more: str = "") -> Gives:
    # a conversation's later turns are requests too: said beside the prompts (make plan's unit)
    requests = f" ({prompts + follow_ups} requests, one per user turn)" if follow_ups else ""
    said = (f"wrote {prompts} prompt{'' if prompts == 1 else 's'}{requests}"
            + (f"; {more}" if more else ""))
    return Gives(prompts, follow_ups, said)


def error(message: str) -> Gives:
    return Gives(said=message, code=2)


@dataclass(frozen=True)
class Source:
    why: str
    all: Gives
    last: Gives
    args: tuple[str, ...] = ()


SOURCES: dict[str, Source] = {
    # --- LLaMA-Factory (hiyouga/LLaMA-Factory data/) ---
    "llamafactory_alpaca_en_demo.json": Source(
        "Alpaca: one instruction each, no tools, all distinct: one prompt per record in both modes.",
        wrote(3), wrote(3)),
    "llamafactory_alpaca_zh_demo.json": Source(
        "Alpaca in Chinese: 8 distinct instructions (3 with an `input`, joined after a blank "
        "line), no history: one prompt each.",
        wrote(8), wrote(8)),
    "llamafactory_identity.json": Source(
        "Alpaca: four distinct instructions, empty inputs: one prompt each.",
        wrote(4), wrote(4)),
    "llamafactory_v1_sft_demo.jsonl": Source(
        "OpenAI messages with v1's `{\"type\": \"text\", \"value\"}` parts, one user turn each.",
        wrote(3), wrote(3)),
    "llamafactory_glaive_toolcall_en_demo.json": Source(
        "Elements 1 and 4 declare tools and call one after their first human turn; element 5 "
        "(the file's 23rd) declares tools and calls none; elements 2 and 3 have neither. "
        "`last` skips the three with a declaration. `all` writes 5: 1 and 4 end before their "
        "`function_call` (element 1 keeps one follow-up, element 4 none), 2 and 3 keep every "
        "human turn (4 and 3 follow-ups), 5 has one human turn: 8 follow-ups, 3 declarations "
        "left out.",
        wrote(5, 8, "2 conversations ended early, before a turn that is not plain text (first: "
                    "{f}:2 (element 1), {f}:121 (element 4)); 3 tool declarations left out"),
        wrote(2, 0, "skipped 3 with a tool declaration ({f}:2 (element 1), {f}:121 (element 4), "
                    "{f}:174 (element 5))")),
    "llamafactory_glaive_toolcall_zh_demo.json": Source(
        "Elements 1, 3 and 4 declare tools and call one right after their first human turn "
        "(element 3's second human turn comes after its call); element 2's `tools` is \"[]\", "
        "no declaration, and it has two human turns. `all`: 4 prompts, element 2's one "
        "follow-up, three ended early, three declarations left out. `last`: the three skipped.",
        wrote(4, 1, "3 conversations ended early, before a turn that is not plain text (first: "
                    "{f}:2 (element 1), {f}:44 (element 3), {f}:81 (element 4)); "
                    "3 tool declarations left out"),
        wrote(1, 0, "skipped 3 with a tool declaration ({f}:2 (element 1), {f}:44 (element 3), "
                    "{f}:81 (element 4))")),
    "llamafactory_mllm_demo.json": Source(
        "Both rows carry `images` and open their first user turn with `<image>`: nothing is "
        "left before the placeholder, so both are skipped in both modes.",
        wrote(0, 0, "skipped 2 with a non-text part ({f}:2 (element 1), {f}:26 (element 2))"),
        wrote(0, 0, "skipped 2 with a non-text part ({f}:2 (element 1), {f}:26 (element 2))")),
    "llamafactory_mllm_audio_demo.json": Source(
        "`audios` and an `<audio>` opening each row's only user turn: the three skipped.",
        wrote(0, 0, "skipped 3 with a non-text part ({f}:2 (element 1), {f}:17 (element 2), "
                    "{f}:32 (element 3))"),
        wrote(0, 0, "skipped 3 with a non-text part ({f}:2 (element 1), {f}:17 (element 2), "
                    "{f}:32 (element 3))")),
    "llamafactory_mllm_video_audio_demo.json": Source(
        "`videos` and `audios`, each user turn opening with `<video><audio>`: the three skipped.",
        wrote(0, 0, "skipped 3 with a non-text part ({f}:2 (element 1), {f}:20 (element 2), "
                    "{f}:38 (element 3))"),
        wrote(0, 0, "skipped 3 with a non-text part ({f}:2 (element 1), {f}:20 (element 2), "
                    "{f}:38 (element 3))")),
    "llamafactory_v1_multimodal_demo.jsonl": Source(
        "24 rows (then a blank line, not a record), each opening its first user turn with an "
        "`image_url` part: all skipped as non-text; the summary names the first three.",
        wrote(0, 0, "skipped 24 with a non-text part ({f}:1, {f}:2, {f}:3, ...)"),
        wrote(0, 0, "skipped 24 with a non-text part ({f}:1, {f}:2, {f}:3, ...)")),
    "llamafactory_dpo_en_demo.json": Source(
        "ShareGPT with `chosen`/`rejected` answers, which are not read. Element 2 has a "
        "`system` turn, kept; element 5 has three human turns (`all`: 2 follow-ups).",
        wrote(3, 2), wrote(3)),
    "llamafactory_dpo_zh_demo.json": Source(
        "ShareGPT, one human turn each (the answers are `chosen`/`rejected`): one prompt each.",
        wrote(3), wrote(3)),
    "llamafactory_kto_en_demo.json": Source(
        "OpenAI messages with a `label`. User turns 1, 3, 3, 1, 3, 3: elements 2, 3 and 5 give "
        "2 follow-ups each under `all`. Element 6 repeats element 5's messages except the "
        "final answer, which neither mode sends: a duplicate in both (hash IDs: named by "
        "place).",
        wrote(5, 6, "skipped 1 duplicate (dropped: {f}:115 (element 6) repeats {f}:86 (element 5))"),
        wrote(5, 0, "skipped 1 duplicate (dropped: {f}:115 (element 6) repeats {f}:86 (element 5))")),
    "llamafactory_readme_sharegpt.json": Source(
        "Top-level `system` and `tools`, a `function_call` after the first human turn. `last` "
        "skips it (a tool declaration); `all` keeps the system prompt and the first human "
        "turn, ended before the call.",
        wrote(1, 0, "1 conversation ended early, before a turn that is not plain text (first: "
                    "{f}:2 (element 1)); 1 tool declaration left out"),
        wrote(0, 0, "skipped 1 with a tool declaration ({f}:2 (element 1))")),
    "llamafactory_reason_tool_use_demo_50.jsonl": Source(
        "Lines 1 and 2 declare tools (line 2 calls one, a `tool_call` part); line 3 declares "
        "none but its answers hold `reasoning` parts. `last` skips all three (2 declarations, "
        "1 non-text). `all` writes 3: answers are dropped, so reasoning parts do not matter; "
        "line 2 ends before its call.",
        wrote(3, 0, "1 conversation ended early, before a turn that is not plain text (first: "
                    "{f}:2); 2 tool declarations left out"),
        wrote(0, 0, "skipped 2 with a tool declaration ({f}:1, {f}:2), 1 with a non-text part ({f}:3)")),
    "llamafactory_v1_dpo_demo.jsonl": Source(
        "`chosen_messages`/`rejected_messages`: no layout kp-prompts reads (a preference pair "
        "is two answers, not a prompt source): an error at line 1.",
        error("{f}:1: " + cannot_tell("chosen_messages", "rejected_messages")),
        error("{f}:1: " + cannot_tell("chosen_messages", "rejected_messages"))),
    "llamafactory_wiki_demo.txt": Source(
        "Plain text, one passage per line (4 lines, distinct), read with `--format text`: "
        "one prompt each.",
        wrote(4), wrote(4), ("--format", "text")),
    # --- FastChat (lm-sys/FastChat) ---
    "fastchat_dummy_conversation.json": Source(
        "identity_3, _4 and _5 repeat the user turns of identity_0, _1 and _2. `all` "
        "(answers dropped) writes 3 and names the 3 dropped, with 1 + 0 + 2 follow-ups; "
        "`last` keeps the source's answers, which differ except for identity_4.",
        wrote(3, 3, "skipped 3 duplicates (dropped: identity_3 repeats identity_0, identity_4 "
                    "repeats identity_1, identity_5 repeats identity_2)"),
        wrote(5, 0, "skipped 1 duplicate (dropped: identity_4 repeats identity_1)")),
    "fastchat_dummy_conversation_with_system.json": Source(
        "identity_0-5 carry a top-level `system` naming Vicuna (0, 2, 4) or Vick (1, 3, 5), "
        "so 3-5 repeat the user turns of 0-2 under another system prompt: all distinct. "
        "identity_6-11 have none, and 9-11 repeat 6-8's user turns. User turns per record "
        "2, 1, 3 (twice over): `all` writes 9 with 1 + 0 + 2 follow-ups each three, dropping "
        "9-11. `last`: the answers differ between 6 and 9 and between 8 and 11; 7 and 10 "
        "are one question each, the same: 11 written.",
        wrote(9, 9, "skipped 3 duplicates (dropped: identity_9 repeats identity_6, identity_10 "
                    "repeats identity_7, identity_11 repeats identity_8)"),
        wrote(11, 0, "skipped 1 duplicate (dropped: identity_10 repeats identity_7)")),
    "fastchat_mt_bench_question.jsonl": Source(
        "MT-Bench: user turns only, two each: `all` writes 3 prompts (ids from `question_id`) "
        "with one follow-up each; `last` is an error (no answers to build history from).",
        wrote(3, 3),
        error("{f}:1: no answers to build a later turn's history from: read these with --turns "
              "all, not --turns last at `$.turns[1]`")),
    "fastchat_vicuna_bench_question.jsonl": Source(
        "Vicuna bench: MT-Bench's layout with one turn each, ten distinct: ten prompts in "
        "both modes (one user turn needs no history).",
        wrote(10), wrote(10)),
    "fastchat_mt_bench_reference_answer_gpt4.jsonl": Source(
        "Reference answers (`choices[].turns` under `question_id`, no question): no prompt "
        "source, an error at line 1.",
        error("{f}:1: " + cannot_tell("question_id", "answer_id", "model_id", "choices", "tstamp")),
        error("{f}:1: " + cannot_tell("question_id", "answer_id", "model_id", "choices", "tstamp"))),
    # --- Arena-Hard (lmarena/arena-hard-auto) ---
    "arena_hard_v0.1_question_turns.jsonl": Source(
        "Arena-Hard v0.1: MT-Bench's layout with each turn an object `{\"content\"}`; one turn "
        "each, ten distinct: ten prompts in both modes.",
        wrote(10), wrote(10)),
    "arena_hard_v2.0_question.jsonl": Source(
        "Arena-Hard v2.0: `{\"uid\", \"prompt\"}`, eight distinct: eight prompts (hash IDs: "
        "the id field is `uid`, not `id`).",
        wrote(8), wrote(8)),
    # --- OpenAI cookbook ---
    "openai_cookbook_toy_chat_fine_tuning.jsonl": Source(
        "Line 4 has no user turn (skipped); line 2 has four user turns (`all`: 3 follow-ups).",
        wrote(3, 3, "skipped 1 without a user turn"), wrote(3, 0, "skipped 1 without a user turn")),
    # --- speculators' and SpecForge's own test rows ---
    "speculators_sharegpt_vicuna_unfiltered.jsonl": Source(
        "One ShareGPT conversation (turns with extra `markdown`/`text` fields, plain text), "
        "three human turns: `all` 1 prompt with 2 follow-ups.",
        wrote(1, 2), wrote(1)),
    "speculators_ultrachat_200k.jsonl": Source(
        "UltraChat: `prompt` and `messages`; `messages` is read (formats are tried in table "
        "order), four user turns: 3 follow-ups under `all`.",
        wrote(1, 3), wrote(1)),
    "speculators_dolphin_r1.jsonl": Source(
        "One human turn; the answer's `reasoning_content` is the source's answer, not read.",
        wrote(1), wrote(1)),
    "speculators_gsm8k.jsonl": Source(
        "GSM8K's `question`/`answer`: no field kp-prompts reads, an error at line 1.",
        error("{f}:1: " + cannot_tell("question", "answer")),
        error("{f}:1: " + cannot_tell("question", "answer"))),
    "speculators_hermes_function_calling.jsonl": Source(
        "Hermes function calling: `tools`, and a system prompt listing them in `<tools>` XML, "
        "then a human turn, a `<tool_call>` answer and a `tool` turn. Both are declarations: "
        "`all` leaves them out (the prompt is the human turn alone) and ends before the tool "
        "turn, one declaration per record; `last` skips it.",
        wrote(1, 0, "1 conversation ended early, before a turn that is not plain text (first: "
                    "{f}:1); 1 tool declaration left out"),
        wrote(0, 0, "skipped 1 with a tool declaration ({f}:1)")),
    "specforge_tool_use_conversation.jsonl": Source(
        "`tools`, a system and a user turn, then assistant turns with `tool_calls`: `all` "
        "keeps the system and user turns, ended before the first call; `last` skips it.",
        wrote(1, 0, "1 conversation ended early, before a turn that is not plain text (first: "
                    "{f}:1); 1 tool declaration left out"),
        wrote(0, 0, "skipped 1 with a tool declaration ({f}:1)")),
    "specforge_vlm_conversation.jsonl": Source(
        "A blank line, then one record with a singular `image` and no `<image>` in its turns: "
        "media with nowhere to cut before, skipped in both modes (line 2).",
        wrote(0, 0, "skipped 1 with a non-text part ({f}:2)"),
        wrote(0, 0, "skipped 1 with a non-text part ({f}:2)")),
    # --- LLaVA, axolotl, Stanford Alpaca, OpenAssistant, UltraChat ---
    "llava_finetune_custom_data_example.json": Source(
        "LLaVA: `image`, and `<image>` opening the first human turn: nothing before it, "
        "skipped in both modes.",
        wrote(0, 0, "skipped 1 with a non-text part ({f}:2 (element 1))"),
        wrote(0, 0, "skipped 1 with a non-text part ({f}:2 (element 1))")),
    "axolotl_conversation.json": Source(
        "One pretty-printed JSON object, read as one record: ShareGPT, six human turns "
        "(`all`: 5 follow-ups).",
        wrote(1, 5), wrote(1)),
    "axolotl_alpaca.json": Source(
        "Alpaca, two instructions with inputs: two prompts.",
        wrote(2), wrote(2)),
    "stanford_alpaca_seed_tasks.jsonl": Source(
        "Stanford Alpaca's seed tasks: `instruction` and one `instances[0]` each, its `input` "
        "joined as Alpaca's is (7 of the 12 have one); twelve distinct, ids `seed_task_N`.",
        wrote(12), wrote(12)),
    "oasst_en_100_message.jsonl": Source(
        "OpenAssistant message trees, read along the best-ranked thread. Line 1: the root's "
        "answers have no replies (no follow-up). Lines 2, 3, 4: the rank-0 answer has one "
        "prompter reply each (a follow-up each), ids the root's `message_id`.",
        wrote(4, 3), wrote(4)),
    "oasst_en_100_tree.jsonl": Source(
        "The same trees as the message file's lines 1-3, wrapped as `{message_tree_id, "
        "prompt}`: 3 prompts, 0 + 1 + 1 follow-ups.",
        wrote(3, 2), wrote(3)),
    "oasst_en_100_text.jsonl": Source(
        "Each line a bare JSON string: not a record, an error at line 1.",
        error("{f}:1: expected a JSON object, got string at `$`"),
        error("{f}:1: expected a JSON object, got string at `$`")),
    "ultrachat_ultra_eval.json": Source(
        "`{\"class\", \"data\"}`: no field kp-prompts reads, an error at the first element.",
        error("{f}:2: element 1: " + cannot_tell("class", "data")),
        error("{f}:2: element 1: " + cannot_tell("class", "data"))),
}


def run(name: str, *args: str):
    public_source(name)
    return kp("prompts", name, *args, "--dataset", "T", cwd=PUBLIC_SOURCES)


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_public_sources_give_the_expected_counts(name):
    source = SOURCES[name]
    for turns, expected in (("all", source.all), ("last", source.last)):
        r = run(name, "--turns", turns, *source.args)
        recs = r.records() if r.code == 0 else []
        got = Gives(len(recs), sum(len(x.get("follow_ups", [])) for x in recs),
                    r.stderr.strip().removeprefix("kp-prompts: "), r.code)
        assert got == Gives(expected.prompts, expected.follow_ups,
                            expected.said.format(f=name), expected.code), (name, turns)


def test_every_public_source_is_reasoned_and_its_origin_and_licence_noted():
    """A file added to the shared directory without a reasoned expectation fails here."""
    public_source("README.md")
    files = sorted(p.name for p in PUBLIC_SOURCES.iterdir() if p.name != "README.md")
    assert files == sorted(SOURCES)
    noted = (PUBLIC_SOURCES / "README.md").read_text()
    for name in files:
        row = next(line for line in noted.splitlines() if line.startswith(f"| {name} |"))
        assert "Apache-2.0" in row or "MIT" in row, name


def records(r) -> dict:
    assert r.code == 0, r.stderr
    return {x["id"]: x for x in r.records()}


def source_lines(name: str) -> list[dict]:
    return [json.loads(line) for line in public_source(name).read_text().splitlines() if line.strip()]


def test_a_singular_image_field_is_media_whatever_the_format(tmp_path):
    """SpecForge's VLM row names its picture in `image` (singular) and places no `<image>`:
    never sent as text. The same for a bare prompt with `image`, and singular `video` /
    `audio`."""
    name = "specforge_vlm_conversation.jsonl"
    r = run(name, "--strict")
    assert r.code == 2 and r.stderr.strip() == (
        f"kp-prompts: {name}:2: a non-text part (--strict: kp-prompts reads plain chat only; "
        "without --strict the record is skipped) at `$.image`")
    src = tmp_path / "vqa.jsonl"
    src.write_text('{"prompt": "What is in the picture?", "image": "cat.png"}\n'
                   '{"prompt": "<video>What happens?", "video": "v.mp4"}\n'
                   '{"messages": [{"role": "user", "content": "Transcribe."}], "audio": "a.wav"}\n'
                   '{"prompt": "No media here.", "image": ""}\n')
    r = kp("prompts", src)
    assert [x["messages"] for x in r.records()] == [[{"role": "user", "content": "No media here."}]]
    assert r.stderr == f"kp-prompts: wrote 1 prompt; skipped 3 with a non-text part ({src}:1, {src}:2, {src}:3)\n"


def test_llava_image_placeholder_is_never_sent():
    name = "llava_finetune_custom_data_example.json"
    for turns in ("all", "last", "each"):
        r = run(name, "--turns", turns)
        assert r.code == 0 and r.stdout == b"", r.stderr
    r = run(name, "--strict")
    assert r.code == 2 and r.stderr.strip().endswith("at `$.conversations[0].value`"), r.stderr


def test_a_json_file_holding_one_object_is_one_record(tmp_path):
    name = "axolotl_conversation.json"
    turns = json.loads(public_source(name).read_text())["conversations"]
    human = [t["value"] for t in turns if t["from"] == "human"]
    [rec] = records(run(name)).values()
    assert rec["messages"] == [{"role": "user", "content": human[0]}]
    assert rec["follow_ups"] == human[1:]
    [rec] = records(run(name, "--turns", "last")).values()
    assert len(rec["messages"]) == 11 and rec["messages"][-1]["content"] == human[-1]
    # What is wrong with such a file is said plainly, at its line.
    broken = tmp_path / "broken.json"
    broken.write_text('{\n  "conversations": [\n    {"from": "human", "value": "hi"}\n    {"from": "gpt"}\n  ]\n}\n')
    r = kp("prompts", broken)
    assert r.code == 2 and r.stderr.strip() == (
        f"kp-prompts: {broken}:4: invalid JSON: Expecting ',' delimiter (line 1 opens an object "
        "it does not close, so the file is read as one JSON object: JSONL needs one whole "
        "object per line)")
    two = tmp_path / "two.json"
    two.write_text('{\n  "prompt": "a"\n}\n{\n  "prompt": "b"\n}\n')
    r = kp("prompts", two)
    assert r.code == 2 and r.stderr.strip() == (
        f"kp-prompts: {two}:4: more data after the file's one JSON object (several records go "
        "in a JSON array, or one per line as JSONL)")


def test_stanford_alpaca_seed_tasks_join_their_instance_input(tmp_path):
    name = "stanford_alpaca_seed_tasks.jsonl"
    tasks = source_lines(name)
    recs = records(run(name))
    assert sorted(recs) == sorted(t["id"] for t in tasks)
    for task in tasks:
        given = task["instances"][0]["input"]
        expected = f"{task['instruction']}\n\n{given}" if given else task["instruction"]
        assert recs[task["id"]]["messages"] == [{"role": "user", "content": expected}], task["id"]
    assert recs["seed_task_1"]["messages"][0]["content"].endswith("Night : Day :: Right : Left")
    several = tmp_path / "several.jsonl"
    several.write_text(json.dumps({"instruction": "Antonym of:", "instances": [
        {"input": "hot", "output": "cold"}, {"input": "up", "output": "down"}]}) + "\n")
    r = kp("prompts", several)
    assert r.code == 2 and r.stderr.strip() == (
        f"kp-prompts: {several}:1: 2 instances: kp-prompts reads one (instruction, input) per "
        "record; give each instance a record of its own at `$.instances`")


def test_a_system_prompt_declaring_tools_in_xml_is_left_out_with_them():
    """Hermes: the system prompt lists the tools in `<tools>` XML. Sent, the model would
    answer with a text tool call; it is a tool declaration, left out as `tools` is."""
    name = "speculators_hermes_function_calling.jsonl"
    [row] = source_lines(name)
    assert "<tools>" in row["conversations"][0]["value"]
    [rec] = records(run(name)).values()
    assert rec["messages"] == [{"role": "user", "content": row["conversations"][1]["value"]}]
    r = run(name, "--strict")
    assert r.code == 2 and r.stderr.strip().endswith(
        "without --strict the declaration is left out) at `$.tools`"), r.stderr


def test_openassistant_trees_are_read_along_their_best_ranked_thread():
    name = "oasst_en_100_message.jsonl"
    rows = source_lines(name)
    recs = records(run(name))
    assert list(recs) == [row["message_id"] for row in rows]
    eyes = rows[1]  # its rank-0 answer's one prompter reply is the follow-up
    best = next(a for a in eyes["replies"] if a["rank"] == 0)
    assert recs[eyes["message_id"]]["messages"] == [{"role": "user", "content": eyes["text"]}]
    assert recs[eyes["message_id"]]["follow_ups"] == [best["replies"][0]["text"]]
    last = records(run(name, "--turns", "last"))[eyes["message_id"]]
    assert last["messages"] == [{"role": "user", "content": eyes["text"]},
                                {"role": "assistant", "content": best["text"]},
                                {"role": "user", "content": best["replies"][0]["text"]}]
    trees = records(run("oasst_en_100_tree.jsonl"))
    assert trees == {k: v for k, v in recs.items() if k in trees} and len(trees) == 3


def test_arena_hard_v0_1_turn_objects_are_read_as_mt_bench_turns():
    name = "arena_hard_v0.1_question_turns.jsonl"
    rows = source_lines(name)
    recs = records(run(name))
    assert list(recs) == [row["question_id"] for row in rows]
    assert [x["messages"] for x in recs.values()] == [
        [{"role": "user", "content": row["turns"][0]["content"]}] for row in rows]
