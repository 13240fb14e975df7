"""What the benchmark replays: a scripted conversation with planted facts, as a value.

A :class:`Scenario` comes from :func:`generate` (the default, fully determined by its seed;
``docs/bench.md``, "The workload") or from a file (:mod:`maf_compaction.bench.workload_file`).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Final, Literal, TypeAlias, get_args

from . import stdlib_reads

#: The tool the generated scenario's lookups call.
LOOKUP_TOOL: Final = "lookup_records"
#: Tool calls whose result must not be used to find the turn (the record tool of issue 4).
RECALL_TOOL: Final = "recall_earlier_tool_results"

DEFAULT_WINDOW: Final = 32_000
DEFAULT_FILL: Final = 1.5
DEFAULT_TOOL_SHARE: Final = 0.6
DEFAULT_TOOL_TURNS: Final = 6
DEFAULT_MARKERS_PER_TOOL: Final = 8
DEFAULT_SEED: Final = 1
#: Tokens of one filler turn (user text plus reply), roughly.
FILLER_TURN_TOKENS: Final = 2_000
#: Tokens of an ordinary assistant reply, roughly.
REPLY_TOKENS: Final = 150
#: Characters per o200k_base token of the generated prose (measured, see tests).
CHARS_PER_TOKEN: Final = 6.0
#: o200k_base tokens of one default log line of a lookup result (measured: 15.95 on average).
LOG_LINE_TOKENS: Final = 16
#: o200k_base tokens of one dense log line (``--results dense``; measured: 19.97 on average).
DENSE_LOG_LINE_TOKENS: Final = 20

#: What the lookups return: generated logs with planted codes (``synthetic``), number-dense logs (``dense``),
#: or reads of the running Python's standard library (``stdlib``, :mod:`.stdlib_reads`).
ResultsKind: TypeAlias = Literal["synthetic", "dense", "stdlib"]
RESULTS_KINDS: Final[tuple[ResultsKind, ...]] = get_args(ResultsKind)

#: Median seconds a user takes between turns (reading the reply, typing the next message).
DEFAULT_THINK_SECONDS: Final = 60.0
#: Spread of think times: lognormal, this sigma (about one pause in twenty is past five minutes).
THINK_SIGMA: Final = 1.0


def think_seconds(seed: int, turn: int, median: float) -> float:
    """The pause before user turn ``turn`` (1-based; none before the first), drawn from ``seed``."""
    if median <= 0 or turn <= 1:
        return 0.0
    return median * math.exp(random.Random(f"{seed}:think:{turn}").gauss(0.0, THINK_SIGMA))


@dataclass(frozen=True, slots=True)
class Media:
    """A media part: an image or another file, by URI or inline base64 data.

    Attributes:
        media_type: The MIME type (``image/png``, ``application/pdf``...).
        uri: A URL, or ``None`` when ``data`` is given.
        data: Base64 bytes, or ``None`` when ``uri`` is given.
    """

    media_type: str
    uri: str | None = None
    data: str | None = None


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool the scripted model may call.

    Attributes:
        name: The function name.
        description: What the model is told the tool does.
        parameters: The JSON schema of its arguments.
    """

    name: str
    description: str
    parameters: Mapping[str, Any] = field(
        default_factory=lambda: {"type": "object", "properties": {}, "additionalProperties": True}
    )


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One scripted tool call and the exact result the tool returns for it.

    Attributes:
        name: The tool called (one of the scenario's tools).
        arguments: The call's arguments.
        result: The result text.
        media: Media items returned with the result (counted at the estimate).
    """

    name: str
    arguments: Mapping[str, Any]
    result: str
    media: tuple[Media, ...] = ()


@dataclass(frozen=True, slots=True)
class Probe:
    """A question whose correct answer quotes planted values.

    Attributes:
        scope: What the question is about (``"requirements"``, ``"lookup 3"``...).
        expected: The values a correct answer quotes, verbatim.
    """

    scope: str
    expected: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Turn:
    """One user turn and what the scripted model does in it.

    Attributes:
        user: The user's message text (unique within a scenario).
        calls: The tool calls the model makes, in order, one per model call.
        reply: The model's final text for the turn (ignored for a probe turn, whose
            answer is composed from what the model can see).
        probe: Set when the turn asks for planted values.
        media: Media the user attaches to the turn.
    """

    user: str
    calls: tuple[ToolCall, ...] = ()
    reply: str = ""
    probe: Probe | None = None
    media: tuple[Media, ...] = ()


@dataclass(frozen=True, slots=True)
class Fact:
    """A planted value the conversation must keep.

    Attributes:
        label: Its unique name (``code_3_7``, ``R2``, ``correction``).
        value: The value, as it appears in the conversation.
        scope: The part of the conversation it belongs to.
    """

    label: str
    value: str
    scope: str


@dataclass(frozen=True, slots=True)
class Scenario:
    """A whole scripted conversation.

    Attributes:
        name: A short name for reports.
        system: The agent's instructions.
        tools: The tools the model may call.
        turns: The user turns, in order; user texts are unique.
        facts: Every planted value, for the ``facts kept`` metric.
        meta: Free-form figures of how it was made (fill, sizes, seed).
    """

    name: str
    system: str
    tools: tuple[ToolSpec, ...]
    turns: tuple[Turn, ...]
    facts: tuple[Fact, ...] = ()
    meta: Mapping[str, Any] = field(default_factory=dict[str, Any])
    _by_text: Mapping[str, Turn] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        seen: dict[str, Turn] = {}
        for index, turn in enumerate(self.turns):
            if turn.user in seen:
                raise ValueError(f"turns[{index}].user repeats an earlier turn's text; user texts must be unique")
            seen[turn.user] = turn
        object.__setattr__(self, "_by_text", seen)
        names = {t.name for t in self.tools}
        for index, turn in enumerate(self.turns):
            for number, call in enumerate(turn.calls):
                if call.name not in names:
                    raise ValueError(f"turns[{index}].calls[{number}].name: {call.name!r} is not a declared tool")

    def turn_for(self, user_text: str) -> Turn | None:
        """The turn whose user message is ``user_text``, if any."""
        return self._by_text.get(user_text)


def code(seed: int | str, label: str, prefix: str) -> str:
    """A planted value: ``prefix`` and the first 6 hex digits of ``sha256(seed:label)``, uppercase."""
    digest = hashlib.sha256(f"{seed}:{label}".encode()).hexdigest()[:6].upper()
    return f"{prefix}-{digest}"


# ----------------------------------------------------------------------------------------
# The generated scenario
# ----------------------------------------------------------------------------------------

_WORDS: Final = [
    "service",
    "region",
    "rollout",
    "latency",
    "budget",
    "window",
    "replica",
    "shard",
    "queue",
    "ledger",
    "invoice",
    "cache",
    "metric",
    "alert",
    "owner",
    "review",
    "change",
    "freeze",
    "canary",
    "drain",
    "warmup",
    "migrate",
    "verify",
    "deploy",
    "build",
    "fetch",
    "schema",
    "index",
    "tenant",
    "quota",
    "policy",
    "audit",
    "trace",
    "span",
    "batch",
    "stream",
    "pipeline",
    "retry",
    "timeout",
    "backoff",
    "health",
    "probe",
    "route",
    "gateway",
    "cluster",
    "node",
    "pool",
    "volume",
    "snapshot",
    "restore",
]
#: Regions of the default log lines and table rows: no digit, so no distinctive value.
_REGIONS: Final = ("eu-west", "us-east", "ap-south", "eu-central")
#: Regions of the dense log lines (``--results dense``), as cloud region names are spelled.
_DENSE_REGIONS: Final = ("eu-west-1", "us-east-2", "ap-south-1", "eu-central-1")
_STATUSES: Final = ("ok", "ok", "ok", "retry", "ok", "slow")
_SYSTEM: Final = (
    "You are an operations assistant. Use the lookup tool when the user asks for records, "
    "and quote planted values exactly as they appear (for example TL-3FA9C2). "
    "Keep the user's requirements and corrections in mind for the whole session."
)


def prose(
    rng: random.Random,
    tokens: int,
    *,
    words: Sequence[str] = _WORDS,
    chars_per_token: float = CHARS_PER_TOKEN,
    sentence: tuple[int, int] = (8, 16),
) -> str:
    """Deterministic sentences of about ``tokens`` tokens, drawn from ``words`` (no value in them: no digits).

    ``chars_per_token`` sizes them (measured on o200k for the default words); ``sentence`` bounds the words a
    sentence has.
    """
    target = int(tokens * chars_per_token)
    sentences: list[str] = []
    length = 0
    while length < target:
        text = " ".join(rng.choice(words) for _ in range(rng.randint(*sentence)))
        sentences.append(text.capitalize() + ".")
        length += len(text) + 2
    return " ".join(sentences)


def _log_line(rng: random.Random, number: int) -> str:
    """A log line with no distinctive value: no line number, a region without a digit, ``took=345 ms``."""
    return (
        f"{rng.choice(_REGIONS)} {rng.choice(_WORDS)}-{rng.choice(_WORDS)} "
        f"status={rng.choice(_STATUSES)} took={rng.randint(3, 999)} ms shard={rng.randint(0, 63)}"
    )


def _dense_log_line(rng: random.Random, number: int) -> str:
    """A number-dense log line: the line number, the region and the duration are distinctive values."""
    return (
        f"{number:05d} {rng.choice(_DENSE_REGIONS)} {rng.choice(_WORDS)}-{rng.choice(_WORDS)} "
        f"status={rng.choice(_STATUSES)} took={rng.randint(3, 999)}ms shard={rng.randint(0, 63)}"
    )


def _lookup_result(seed: int, lookup: int, tokens: int, markers: int, *, dense: bool = False) -> tuple[str, list[Fact]]:
    """A log of about ``tokens`` tokens with ``markers`` planted codes spread through it.

    Two in three codes are ``[record N] code_L_N=VALUE`` lines; every third is a row of a
    Markdown table placed where its line would be. By default the log lines around them
    carry no distinctive value (:mod:`maf_compaction.core.values`), so a result's
    distinctive values are its planted codes and its table rows' labels, as in the
    published cachebench design; ``dense`` writes number-dense lines instead, with
    hundreds of distinctive values per result.
    """
    rng = random.Random(f"{seed}:lookup:{lookup}")
    facts = [
        Fact(f"code_{lookup}_{n}", code(seed, f"code_{lookup}_{n}", "TL"), f"lookup {lookup}")
        for n in range(1, markers + 1)
    ]
    line = _dense_log_line if dense else _log_line
    regions = _DENSE_REGIONS if dense else _REGIONS
    line_tokens = DENSE_LOG_LINE_TOKENS if dense else LOG_LINE_TOKENS
    lines_total = max(tokens // line_tokens, markers * 2)
    spacing = lines_total / (markers + 1)
    plant_at = {int(spacing * (n + 1)): n for n in range(markers)}
    lines = [f"# records of lookup {lookup}"]
    for number in range(lines_total):
        if number in plant_at:
            fact = facts[plant_at[number]]
            if plant_at[number] % 3 == 2:
                lines += ["", "| label | value | region | status |", "|---|---|---|---|"]
                lines.append(f"| {fact.label} | {fact.value} | {rng.choice(regions)} | {rng.choice(_STATUSES)} |")
                lines.append("")
            else:
                lines.append(f"[record {plant_at[number] + 1}] {fact.label}={fact.value}")
        lines.append(line(rng, number))
    return "\n".join(lines), facts


@dataclass(frozen=True, slots=True)
class GeneratorOptions:
    """The knobs of :func:`generate` (see EVALUATION.md, "Workloads")."""

    context_window: int = DEFAULT_WINDOW
    fill: float = DEFAULT_FILL
    tool_share: float = DEFAULT_TOOL_SHARE
    tool_turns: int = DEFAULT_TOOL_TURNS
    markers_per_tool: int = DEFAULT_MARKERS_PER_TOOL
    seed: int = DEFAULT_SEED
    #: What the lookups return (:data:`ResultsKind`): ``dense`` writes number-dense log lines (line
    #: numbers, regions and durations that are distinctive values) instead of lines whose only
    #: values are the planted codes; ``stdlib`` reads the standard library instead.
    results: ResultsKind = "synthetic"

    def __post_init__(self) -> None:
        if self.context_window < 4_096:
            raise ValueError(f"context_window must be >= 4096, got {self.context_window}")
        if not 0 < self.fill <= 10:
            raise ValueError(f"fill must be in (0, 10], got {self.fill}")
        if not 0 <= self.tool_share < 1:
            raise ValueError(f"tool_share must be in [0, 1), got {self.tool_share}")
        if self.tool_turns < 1:
            raise ValueError(f"tool_turns must be >= 1, got {self.tool_turns}")
        if self.markers_per_tool < 1:
            raise ValueError(f"markers_per_tool must be >= 1, got {self.markers_per_tool}")
        if self.results not in RESULTS_KINDS:
            raise ValueError(f"results must be one of {', '.join(RESULTS_KINDS)}, got {self.results!r}")


@dataclass(frozen=True, slots=True)
class _Lookup:
    """One lookup of a generated workload: the turn that makes it, and the facts its result plants."""

    turn: Turn
    planted: tuple[Fact, ...]
    probe: str

    @staticmethod
    def batch(lookups: list[_Lookup]) -> tuple[list[Turn], list[Fact], list[Turn]]:
        """The lookup turns, their facts and their closing probes (one per lookup, in order)."""
        probes = [
            Turn(user=lookup.probe, probe=Probe(f"lookup {n}", tuple(f.value for f in lookup.planted)))
            for n, lookup in enumerate(lookups, start=1)
        ]
        return [lookup.turn for lookup in lookups], [f for lookup in lookups for f in lookup.planted], probes


def _planted_lookups(opts: GeneratorOptions, result_tokens: int) -> tuple[list[Turn], list[Fact], list[Turn]]:
    """The generated logs with planted codes: the lookup turns, their facts and their closing probes."""
    lookups: list[_Lookup] = []
    for n in range(1, opts.tool_turns + 1):
        result, planted = _lookup_result(
            opts.seed, n, result_tokens, opts.markers_per_tool, dense=opts.results == "dense"
        )
        turn = Turn(
            user=f"Run lookup {n} and keep its planted codes at hand; I will ask for them later.",
            calls=(ToolCall(LOOKUP_TOOL, {"lookup": n}, result),),
            reply=f"Lookup {n} is loaded: {len(planted)} planted codes.",
        )
        lookups.append(_Lookup(turn, tuple(planted), f"Closing check: quote every planted code of lookup {n}."))
    return _Lookup.batch(lookups)


def _stdlib_lookups(
    opts: GeneratorOptions, result_tokens: int, others: str
) -> tuple[list[Turn], list[Fact], list[Turn]]:
    """Reads of the standard library (:mod:`.stdlib_reads`): the lookup turns, their facts and closing probes."""
    reads = stdlib_reads.reads(opts.seed, opts.tool_turns, result_tokens)
    turns = [
        Turn(
            user=f"Lookup {n}: {read.ask}",
            calls=(ToolCall(read.tool, read.arguments, read.text),),
            reply=f"Lookup {n} is loaded: {read.tool} returned {read.text.count(chr(10)) + 1} lines.",
        )
        for n, read in enumerate(reads, start=1)
    ]
    # A fact stands in its own result only: not in any other message, a lookup's own ask, reply, tool name or
    # arguments (a record names the tool it read, whatever it keeps).
    around = [f"{t.user}\n{t.reply}\n{c.name}\n{json.dumps(c.arguments)}" for t in turns for c in t.calls]
    chosen = stdlib_reads.facts_of(reads, "\n".join([others, *around]), opts.markers_per_tool, opts.seed)
    lookups: list[_Lookup] = []
    for n, (read, values, turn) in enumerate(zip(reads, chosen, turns, strict=True), start=1):
        planted = tuple(Fact(f"{read.tool}_{n}_{k}", v, f"lookup {n}") for k, v in enumerate(values, 1))
        lookups.append(
            _Lookup(turn, planted, f"Closing check: quote the names and locations you kept from lookup {n}.")
        )
    return _Lookup.batch(lookups)


def generate(options: GeneratorOptions | None = None) -> Scenario:
    """The default workload: a tool-heavy session sized to ``fill`` times the window.

    Order (after the published cachebench design): requirements in turns 1-2; lookups
    spread evenly through filler turns; a correction a third of the way in; closing
    probes, one for the requirements and correction and one per lookup. The tool
    results carry ``tool_share`` of the total, split evenly over ``tool_turns`` lookups;
    filler turns of about 2,000 tokens make up the rest. ``results`` says what a lookup
    returns (:data:`ResultsKind`).
    """
    opts = options or GeneratorOptions()
    seed = opts.seed
    rng = random.Random(f"{seed}:plan")
    total = int(opts.context_window * opts.fill)
    result_tokens = max(int(total * opts.tool_share / opts.tool_turns), 200)
    filler_count = max(int(total * (1 - opts.tool_share) / FILLER_TURN_TOKENS), opts.tool_turns)

    requirements = [
        Fact("R1", code(seed, "R1", "RQ"), "requirements"),
        Fact("R2", code(seed, "R2", "RQ"), "requirements"),
        Fact("R3", code(seed, "R3", "RQ"), "requirements"),
    ]
    correction = Fact("correction", code(seed, "correction", "FB"), "requirements")
    turns: list[Turn] = [
        Turn(
            user=(
                "Requirements for this session, keep them for the whole conversation:\n"
                f"- R1 ({requirements[0].value}): every rollout goes region by region.\n"
                f"- R2 ({requirements[1].value}): reports go through the batch pipeline."
            ),
            reply="Noted: R1 and R2.",
        ),
        Turn(
            user=f"One more requirement:\n- R3 ({requirements[2].value}): never drain more than one shard at a time.",
            reply="Noted: R3.",
        ),
    ]
    fixed = Turn(
        user=(
            f"Correction ({correction.value}): R2 changes, reports now go through the "
            "streaming pipeline, not the batch pipeline."
        ),
        reply="Understood: streaming pipeline from now on.",
    )
    fillers = [
        Turn(
            user=f"Note {n + 1}: " + prose(rng, FILLER_TURN_TOKENS - REPLY_TOKENS),
            reply=prose(rng, REPLY_TOKENS),
        )
        for n in range(filler_count)
    ]
    if opts.results == "stdlib":
        others = "\n".join([_SYSTEM, *(t.user + "\n" + t.reply for t in (*turns, fixed, *fillers))])
        lookups, planted, probes = _stdlib_lookups(opts, result_tokens, others)
    else:
        lookups, planted, probes = _planted_lookups(opts, result_tokens)
    facts: list[Fact] = [*requirements, correction, *planted]
    # Lookups spread evenly through the filler; the correction a third of the way in.
    body: list[Turn] = []
    slots = {int(i * filler_count / opts.tool_turns): lookups[i] for i in range(opts.tool_turns)}
    correction_at = filler_count // 3
    for index, filler in enumerate(fillers):
        if index in slots:
            body.append(slots[index])
        if index == correction_at:
            body.append(fixed)
        body.append(filler)
    turns += body
    turns.append(
        Turn(
            user="Closing check: quote the codes of R1, R2, R3 and of the correction.",
            probe=Probe("requirements", tuple(f.value for f in (*requirements, correction))),
        )
    )
    turns += probes
    if opts.results == "stdlib":
        tools = tuple(ToolSpec(name, description, schema) for name, description, schema in stdlib_reads.TOOLS)
    else:
        tools = (
            ToolSpec(
                LOOKUP_TOOL,
                "Fetch the records of a numbered lookup. Returns a log with planted codes.",
                {"type": "object", "properties": {"lookup": {"type": "integer"}}, "required": ["lookup"]},
            ),
        )
    return Scenario(
        name="generated",
        system=_SYSTEM,
        tools=tools,
        turns=tuple(turns),
        facts=tuple(facts),
        meta={**asdict(opts), "result_tokens": result_tokens, "filler_turns": filler_count},
    )
