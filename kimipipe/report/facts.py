"""What the build report shows, read from the files a build leaves: no plotting here.

`read_facts(paths, say)` sorts every line of every file by its fields, through the view
`kp-infer report` reads them with too (kimipipe/recorded/lines.py), and keeps per dataset
what the plots need:

    a line with `input_ids`/`output_ids`   a token record (kp-tokenize): its lengths and
                                           `prompt_tokens_delta`/`completion_tokens_delta`
                                           when kp-tokenize wrote them, and its sampled IDs
                                           against the re-encoding (`output_ids_source`,
                                           `resegmented`, `sampled_fallback`); its answer counts
                                           only when no response record has its id
    a line with `response`                 an answer (kp-infer): usage, provider, finish
                                           reason, latency, `finished_at`, the answers
                                           `refused` before it, `conversation`/`turn`/
                                           `turns` when it is a turn of a conversation,
                                           `identity` when its run checked it (--tokenizer;
                                           and the quarantine in OUTPUT.identity.json beside
                                           a responses file)
    a line with `kind` and `status`        a failure (--failures): its kind, its refused
                                           answers and their cost, its `time`
    an answer's or a failure's             `retried` (the attempts sent again, by cause,
                                           at its `finished_at` or `time`) and `api` (the
                                           host that answered; the stand-in's answers are
                                           told by their `gen-standin-` generation ids)
    a line with `line` and `reason`        a reject (kp-tokenize --rejects)
    a directory, or a kp-shard.manifest    a shard set (kp-shard; a parent of several sets
                                           is each of them): the rows' lengths, and
                                           `kp-shard verify`'s verdict on it, checked now

A record's dataset is its `dataset` field; a reject's is that of the record with its id,
else the file name's first part (`B3.rejects.jsonl`); a shard set's is the manifest's
`options.name`. Money is counted as `kp-infer report` counts it (kept answers plus every
refused answer; an older failure line without `refused` counts its `cost` once when its
kind is a refusal), so both give the same spend. An unfinished last line (a run still
writing) is skipped with a note; any other bad line is `PATH:LINE`.

Memory: a few numbers per answer and per row (a $100 build is some 10^4 to 10^6 of
them), never a record's text or its token IDs.
"""

from __future__ import annotations

import datetime
import os
from array import array
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ..errors import InputError
from ..kinds import RefusalKind
from ..recorded.api import is_standin
from ..recorded.identity_table import IdentityTable
from ..recorded.lines import RecordLine, read_lines
from ..recorded.providers_table import ProviderTable
from ..records import Refusal, Usage
from ..shard.readback import read_lengths, shard_sets, verify
from ..shard.writer import LEGACY_MANIFEST, MANIFEST
from ..tokenize.stats import SampledTable

# The trainer `max_length`s the rows are measured against (tokens).
MAX_LENGTHS = (4096, 8192, 16384, 32768)


@dataclass
class BuildLimits:
    """What the build was asked to stay within (make's variables, or kp-infer's flags)."""

    total_cost: float | None = None
    max_cost: float | None = None
    token_budget: int | None = None  # each dataset's, unless named in token_budgets
    token_budgets: dict[str, int | None] = field(default_factory=dict)
    title: str = "kimipipe build report"

    def budget(self, dataset: str) -> int | None:
        return self.token_budgets.get(dataset, self.token_budget)


def parse_time(text: str | None) -> float | None:
    """Seconds since the epoch of an ISO 8601 UTC time (`...Z`), or None."""
    if not text:
        return None
    try:
        return datetime.datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


@dataclass(slots=True)
class AnswerFacts:
    provider: str
    completion: int
    reasoning: int
    prompt: int
    cost: float
    finish: str
    latency: float | None
    at: float | None  # when it was written (epoch seconds), if the record says
    conversation: Any = None
    turn: int | None = None
    turns: int | None = None


@dataclass(slots=True)
class Paid:
    """A payment on the spend-over-time axis: a kept answer, or a refused one."""

    at: float | None
    cost: float
    order: int  # its place in the files, for records without a time


@dataclass(slots=True)
class RefusedAnswer:
    provider: str
    kind: str
    cost: float


@dataclass(slots=True)
class Retried:
    """Attempts sent again after a retryable failure: N of CAUSE (kinds.RetryCause: "429"
    a rate limit), on the record written AT (the answer's or the failure's time)."""

    at: float | None
    cause: str
    n: int


@dataclass
class Verdict:
    """`kp-shard verify` on a shard set, run when the report was made (shard/readback.py)."""

    directory: str
    problems: list[str]
    shards: int = 0
    rows: int = 0


@dataclass
class TokenDeltas:
    """Per provider: provider's count minus kimipipe's, per token record that has them."""

    prompt: dict[str, list[int]] = field(default_factory=dict)
    completion: dict[str, list[int]] = field(default_factory=dict)

    def add(self, provider: str, prompt: int | None, completion: int | None) -> None:
        if prompt is not None:
            self.prompt.setdefault(provider, []).append(prompt)
        if completion is not None:
            self.completion.setdefault(provider, []).append(completion)

    def __bool__(self) -> bool:
        return bool(self.prompt or self.completion)


@dataclass
class Rows:
    """Token counts per training row (4 bytes a row a column), and where they came from."""

    source: str = ""  # "shards" or "token records"
    prompt: array = field(default_factory=lambda: array("I"))
    output: array = field(default_factory=lambda: array("I"))
    dropped: Counter = field(default_factory=Counter)  # kp-shard's drops, by reason

    def add(self, n_in: int, n_out: int) -> None:
        self.prompt.append(n_in)
        self.output.append(n_out)

    def __len__(self) -> int:
        return len(self.prompt)

    def totals(self) -> list[int]:
        return [a + b for a, b in zip(self.prompt, self.output, strict=True)]

    def kept_whole(self) -> dict[int, float]:
        """{max_length: share of rows whose prompt + output fits whole}."""
        totals = self.totals()
        n = len(totals)
        return {m: (sum(t <= m for t in totals) / n if n else 0.0) for m in MAX_LENGTHS}


@dataclass
class DatasetFacts:
    name: str
    answers: list[AnswerFacts] = field(default_factory=list)
    paid: list[Paid] = field(default_factory=list)
    refused: list[RefusedAnswer] = field(default_factory=list)
    failures: Counter = field(default_factory=Counter)
    rejects: Counter = field(default_factory=Counter)  # reason's label -> n
    deltas: TokenDeltas = field(default_factory=TokenDeltas)
    sampled: SampledTable = field(default_factory=SampledTable)  # sampled IDs vs re-encoding
    rows: Rows = field(default_factory=Rows)
    token_rows: Rows = field(default_factory=lambda: Rows("token records"))
    shard_sets: list[str] = field(default_factory=list)
    identity: IdentityTable = field(default_factory=IdentityTable)  # kp-infer --tokenizer
    retried: list[Retried] = field(default_factory=list)
    # (the host that answered, whether the stand-in did) -> answers and failures
    apis: Counter = field(default_factory=Counter)
    verdicts: list[Verdict] = field(default_factory=list)

    def retries(self) -> Counter:
        """{cause: attempts sent again}."""
        out: Counter = Counter()
        for r in self.retried:
            out[r.cause] += r.n
        return out

    @property
    def spend(self) -> float:
        return sum(p.cost for p in self.paid)

    def table(self) -> ProviderTable:
        table = ProviderTable()
        for a in self.answers:
            table.answer(a.provider, a.completion, a.reasoning, a.finish, a.cost, a.latency)
        for r in self.refused:
            table.refusal(r.provider, r.kind, r.cost)
        return table

    def training_rows(self) -> Rows:
        """The shards' rows when a shard set was read, else the token records'."""
        return self.rows if self.shard_sets or len(self.rows) else self.token_rows


@dataclass
class BuildFacts:
    paths: list[str]
    datasets: dict[str, DatasetFacts] = field(default_factory=dict)
    timed: bool = True  # every payment has a time (else the spend is drawn in file order)

    def of(self, name: str) -> DatasetFacts:
        return self.datasets.setdefault(name, DatasetFacts(name))

    def merged(self) -> DatasetFacts:
        """The whole build as one dataset."""
        every = DatasetFacts("all")
        for d in self.datasets.values():
            every.answers += d.answers
            every.paid += d.paid
            every.refused += d.refused
            every.failures.update(d.failures)
            every.rejects.update(d.rejects)
            for provider, values in d.deltas.prompt.items():
                every.deltas.prompt.setdefault(provider, []).extend(values)
            for provider, values in d.deltas.completion.items():
                every.deltas.completion.setdefault(provider, []).extend(values)
            every.sampled.merge(d.sampled)
            rows = d.training_rows()
            every.rows.prompt.extend(rows.prompt)
            every.rows.output.extend(rows.output)
            every.rows.dropped.update(rows.dropped)
            every.shard_sets += d.shard_sets
            every.identity.merge(d.identity)
            every.retried += d.retried
            every.apis.update(d.apis)
            every.verdicts += d.verdicts
        every.rows.source = " + ".join(sorted({d.training_rows().source for d in self.datasets.values()
                                               if len(d.training_rows())}))
        return every


@dataclass
class Conversations:
    turns: Counter  # answered turns per conversation -> conversations
    complete: int
    cut: int  # the last kept turn ended by length: its later turns were not sent
    unfinished: int  # fewer turns than `turns` for another reason (a failure, a run going on)



def conversations(d: DatasetFacts) -> Conversations | None:
    by: dict = {}
    for a in d.answers:
        if a.conversation is not None:
            by.setdefault(str(a.conversation), []).append(a)
    if not by:
        return None
    turns: Counter = Counter()
    complete = cut = unfinished = 0
    for answers in by.values():
        answers.sort(key=lambda a: a.turn or 0)
        turns[len(answers)] += 1
        last = answers[-1]
        planned = max((a.turns or 0) for a in answers)
        if len(answers) >= planned:
            complete += 1
        elif last.finish == "length":
            cut += 1
        else:
            unfinished += 1
    return Conversations(turns, complete, cut, unfinished)


def reject_label(reason: str) -> str:
    """A reject's reason, short enough to group by (its text up to the first colon)."""
    head = reason.split(":", 1)[0].strip()
    return head if len(head) <= 60 else head[:57] + "..."


def _count_ids(raw: msgspec.Raw) -> int:
    text = bytes(raw)
    return text.count(b",") + 1 if text.strip(b" []\t\r\n") else 0


class _Reader:
    def __init__(self, say: Callable[[str], None]):
        self.facts: BuildFacts = BuildFacts([])
        self.say = say
        self.order = 0
        self.answered: set[tuple[str, str]] = set()  # (dataset, id) of the response records
        # (dataset, id, answer, refused, what _sent reads) of the token records' answers
        self.from_tokens: list[tuple[str, str | None, AnswerFacts, list[Refusal], RecordLine]] = []
        self.dataset_of: dict[str, str] = {}  # id -> dataset, for the rejects
        self.rejects: list[tuple[str, str, str]] = []  # (id, reason, dataset from the file name)

    def read(self, path: str) -> None:
        self.facts.paths.append(path)
        if path != "-" and (os.path.isdir(path) or os.path.basename(path) in (MANIFEST, LEGACY_MANIFEST)):
            for directory in shard_sets(path if os.path.isdir(path) else os.path.dirname(path) or "."):
                self._shards(directory)
            return
        file_dataset = os.path.basename(path).split(".", 1)[0] if path != "-" else "-"
        for lineno, line in read_lines(path, self.say):
            self._line(line, path, lineno, file_dataset)
        if file_dataset in self.facts.datasets:  # (its identity file names its providers)
            self.facts.of(file_dataset).identity.quarantined_beside(path)

    def _line(self, line: RecordLine, path: str, lineno: int, file_dataset: str) -> None:
        if line.is_tokens:
            dataset = self.facts.of(line.dataset or file_dataset)
            provider = line.provider or "unknown"
            dataset.token_rows.add(_count_ids(line.input_ids), _count_ids(line.output_ids))
            dataset.deltas.add(provider, line.prompt_tokens_delta, line.completion_tokens_delta)
            dataset.sampled.add_record(provider, line.output_ids_source, line.sampled_parts,
                                       line.resegmented, line.sampled_fallback)
            if line.id is not None:
                self.dataset_of[line.id] = dataset.name
            if line.usage is not None:
                sent = RecordLine(api=line.api, generation_id=line.generation_id, retried=line.retried)
                self.from_tokens.append((dataset.name, line.id, self._answer(line), line.refused, sent))
        elif line.is_response:
            dataset = self.facts.of(line.dataset or file_dataset)
            if line.id is not None:
                self.answered.add((dataset.name, line.id))
                self.dataset_of[line.id] = dataset.name
            answer = self._answer(line)
            self._keep(dataset, answer, line.refused)
            dataset.identity.kept(line.provider, line.identity, line.usage or Usage())
            self._sent(dataset, line, answer.at)
        elif line.is_failure:
            dataset = self.facts.of(line.dataset or file_dataset)
            dataset.failures[line.kind] += 1
            at = parse_time(line.time)
            for r in line.refusals():
                self._refusal(dataset, r, at)
            self._sent(dataset, line, at)
        elif line.is_reject:
            self.rejects.append((line.id, reject_label(line.reason), file_dataset))
        else:
            raise InputError("not a response, token, failure or reject record", path, lineno)

    def _answer(self, line: RecordLine) -> AnswerFacts:
        usage = line.usage or Usage()
        return AnswerFacts(line.provider or "unknown", usage.completion_tokens, usage.reasoning_tokens,
                      usage.prompt_tokens, usage.cost, line.finish_reason or "none", line.latency_s,
                      parse_time(line.finished_at), line.conversation, line.turn, line.turns)

    @staticmethod
    def _sent(dataset: DatasetFacts, line: RecordLine, at: float | None) -> None:
        """Where an answer or a failure was asked (its API) and what it took (its retries)."""
        dataset.apis[(line.api or "not recorded", is_standin(line.generation_id))] += 1
        for cause, n in (line.retried or {}).items():
            dataset.retried.append(Retried(at, cause, n))

    def _keep(self, dataset: DatasetFacts, answer: AnswerFacts, refused: list[Refusal]) -> None:
        dataset.answers.append(answer)
        self._pay(dataset, answer.at, answer.cost)
        for r in refused:
            self._refusal(dataset, r, answer.at)

    def _refusal(self, dataset: DatasetFacts, r: Refusal, at: float | None) -> None:
        dataset.refused.append(RefusedAnswer(r.provider or "unknown", r.kind, r.cost))
        if r.kind == RefusalKind.IDENTITY:
            dataset.identity.checked(r.provider, r.offset, None, refused=True)
        self._pay(dataset, at, r.cost)

    def _pay(self, dataset: DatasetFacts, at: float | None, cost: float) -> None:
        self.order += 1
        dataset.paid.append(Paid(at, cost, self.order))
        if at is None:
            self.facts.timed = False

    def _shards(self, directory: str) -> None:
        checked = verify(directory)
        try:
            manifest, lengths = read_lengths(directory)
        except InputError:
            if not checked.problems:
                raise
            # a set verify finds broken: its verdict is shown, its rows cannot be counted
            name = os.path.basename(os.path.abspath(directory))
            self.facts.of(name).verdicts.append(Verdict(directory, checked.problems))
            return
        name = manifest.options.name or os.path.basename(os.path.abspath(directory))
        dataset = self.facts.of(name)
        dataset.shard_sets.append(directory)
        dataset.verdicts.append(Verdict(directory, checked.problems, checked.shards, checked.records))
        dataset.rows.source = "shards"
        dataset.rows.prompt.extend(lengths.prompt)
        dataset.rows.output.extend(lengths.output)
        dataset.rows.dropped.update({k: v for k, v in manifest.dropped.items() if v})

    def finish(self) -> BuildFacts:
        for name, rid, answer, refused, sent in self.from_tokens:
            if (name, rid) not in self.answered:
                self._keep(self.facts.of(name), answer, refused)
                self._sent(self.facts.of(name), sent, answer.at)
        for rid, label, file_dataset in self.rejects:
            self.facts.of(self.dataset_of.get(rid, file_dataset)).rejects[label] += 1
        if not any(d.paid for d in self.facts.datasets.values()):
            self.facts.timed = False
        return self.facts


def read_facts(paths: list[str], say: Callable[[str], None], datasets: list[str] = ()) -> BuildFacts:
    """The facts of PATHS (see the module docstring); DATASETS are shown even with no file."""
    reader = _Reader(say)
    for name in datasets:
        reader.facts.of(name)
    for path in paths:
        reader.read(path)
    return reader.finish()
