"""A deterministic, tool-heavy conversation for the demo and the end-to-end tests.

Turn 1 states the session's requirements, each with a code like ``RQ-4F1A9C``. Most
later turns ask for a deployment lookup; the tool's result is a log of roughly 1,500 to
3,000 tokens with planted lines (``code_3=TL-3FA9C2``) spread through it and a few
Markdown table rows carrying more codes. The remaining turns are plain chat that asks
the model to recall a requirement, which only works while the head of the conversation
is intact.

Everything is a pure function of the seed: the turn plan comes from ``random.Random``
seeded explicitly, and a lookup result is derived from its argument alone (a SHA-256 of
the service name), so the tool answers the same bytes whoever calls it and however
often.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass
from typing import Final, Literal

from agent_framework import tool

TOOL_NAME: Final = "lookup_deployment"
DEFAULT_TURNS: Final = 60
DEFAULT_SEED: Final = 7
#: Share of the turns after the first that are plain chat instead of a lookup.
CHAT_SHARE: Final = 0.2
#: Planted ``code_N=TL-XXXXXX`` lines per result, spread evenly through the log.
CODE_LINES: Final = 6
#: Further codes planted as Markdown table rows (``| code_7 | TL-XXXXXX | ... |``).
CODE_ROWS: Final = 2
REQUIREMENTS: Final = 5

INSTRUCTIONS: Final = "Answer from the lookups you make. Quote values exactly."

_SERVICES: Final = ("billing-api", "search", "checkout", "ledger", "auth", "catalog", "payments", "notify")
_REGIONS: Final = ("eu-west-1", "us-east-2", "ap-south-1", "eu-central-1")
_STEPS: Final = ("fetch", "build", "migrate", "canary", "rollout", "verify", "drain", "warmup")
_STATUSES: Final = ("ok", "ok", "ok", "retry", "ok", "slow")
_TOPICS: Final = (
    "rollback windows",
    "change freezes",
    "audit trails",
    "canary sizes",
    "on-call paging",
)

LOOKUP_REQUEST: Final = re.compile(r"Look up the deployment log of (?P<service>[\w.-]+) and tell me (?P<code>code_\d+)")
REQUIREMENT_REQUEST: Final = re.compile(r"requirement (?P<label>R\d+)")

TurnKind = Literal["requirements", "lookup", "chat"]


@dataclass(frozen=True, slots=True)
class Turn:
    """One user turn of the workload.

    Attributes:
        number: 1-based turn number.
        kind: ``"requirements"`` (turn 1), ``"lookup"`` or ``"chat"``.
        text: The user message.
        service: For a lookup, the tool argument the model will pass.
        code: For a lookup, the planted code name the user asks about (``"code_3"``).
        expected: The planted value a correct answer quotes (a ``TL-`` or ``RQ-`` code),
            or ``None`` when the turn asks nothing.
    """

    number: int
    kind: TurnKind
    text: str
    service: str | None = None
    code: str | None = None
    expected: str | None = None


@dataclass(frozen=True, slots=True)
class Workload:
    """A generated conversation: the user turns and the facts planted in it.

    Attributes:
        seed: The seed it was generated from.
        turns: The user turns, in order.
        requirement_codes: ``RQ-`` code of each requirement, ``R1`` first.
        instructions: Agent instructions to run it with.
    """

    seed: int
    turns: tuple[Turn, ...]
    requirement_codes: tuple[str, ...]
    instructions: str = INSTRUCTIONS

    @property
    def lookups(self) -> int:
        """Number of lookup turns (each costs two model calls)."""
        return sum(turn.kind == "lookup" for turn in self.turns)


def build_workload(turns: int = DEFAULT_TURNS, seed: int = DEFAULT_SEED) -> Workload:
    """The workload of ``turns`` user turns for ``seed``; the same arguments give the same bytes."""
    if turns < 1:
        raise ValueError(f"turns must be at least 1, got {turns!r}")
    rng = random.Random(seed)
    codes = tuple(f"RQ-{rng.randrange(16**6):06X}" for _ in range(REQUIREMENTS))
    plan: list[Turn] = [Turn(number=1, kind="requirements", text=_requirements_text(codes))]
    for number in range(2, turns + 1):
        if rng.random() < CHAT_SHARE:
            index = rng.randrange(REQUIREMENTS)
            text = f"Before the next lookup: remind me what requirement R{index + 1} says, with its code."
            plan.append(Turn(number=number, kind="chat", text=text, expected=codes[index]))
            continue
        service = f"{rng.choice(_SERVICES)}-{rng.randrange(16**4):04x}-t{number:02d}"
        code = f"code_{rng.randrange(CODE_LINES + CODE_ROWS) + 1}"
        text = f"Look up the deployment log of {service} and tell me {code}."
        expected = planted_codes(service)[code]
        plan.append(Turn(number=number, kind="lookup", text=text, service=service, code=code, expected=expected))
    return Workload(seed=seed, turns=tuple(plan), requirement_codes=codes)


def _requirements_text(codes: tuple[str, ...]) -> str:
    lines = ["Requirements for this session. Keep them in mind for every answer:"]
    for index, (code, topic) in enumerate(zip(codes, _TOPICS, strict=True), start=1):
        lines.append(f"- R{index} ({code}): every deployment report must state its {topic} explicitly.")
    return "\n".join(lines)


def planted_codes(service: str) -> dict[str, str]:
    """The codes a lookup of ``service`` plants, by name (``{"code_1": "TL-3FA9C2", ...}``)."""
    rng = _result_rng(service)
    return {f"code_{n}": f"TL-{rng.randrange(16**6):06X}" for n in range(1, CODE_LINES + CODE_ROWS + 1)}


def lookup_result(service: str) -> str:
    """The deployment log of ``service``: a pure function of the name, about 1,500-3,000 tokens.

    ``CODE_LINES`` planted ``code_N=TL-XXXXXX`` lines are spread evenly through the log
    lines, and a Markdown table in the middle carries ``CODE_ROWS`` more codes among
    ordinary rows.
    """
    codes = planted_codes(service)
    rng = _result_rng(service)
    for _ in codes:  # skip the draws planted_codes made, so the log does not repeat them
        rng.randrange(16**6)
    log_lines = [_log_line(rng, service, index) for index in range(rng.randrange(30, 58))]
    names = list(codes)
    line_codes, row_codes = names[:CODE_LINES], names[CODE_LINES:]
    spacing = len(log_lines) // (CODE_LINES + 1)
    for offset, name in enumerate(reversed(line_codes)):
        log_lines.insert(spacing * (CODE_LINES - offset), f"{name}={codes[name]}")
    table = ["", "| code | value | region | health |", "|---|---|---|---|"]
    for name in row_codes:
        table.append(f"| {name} | {codes[name]} | {rng.choice(_REGIONS)} | healthy |")
        table.append(f"| probe-{rng.randrange(100):02d} | n/a | {rng.choice(_REGIONS)} | {rng.choice(_STATUSES)} |")
    table.append("")
    middle = len(log_lines) // 2
    lines = [f"# Deployment log: {service}", *log_lines[:middle], *table, *log_lines[middle:]]
    return "\n".join(lines)


def _result_rng(service: str) -> random.Random:
    return random.Random(int.from_bytes(hashlib.sha256(service.encode()).digest()[:8], "big"))


def _log_line(rng: random.Random, service: str, index: int) -> str:
    minute, second = divmod(index * 37 + rng.randrange(30), 60)
    return (
        f"2026-05-14T10:{minute % 60:02d}:{second:02d}Z {service} step={rng.choice(_STEPS)} "
        f"host=node-{rng.randrange(64):02d} region={rng.choice(_REGIONS)} status={rng.choice(_STATUSES)} "
        f"latency_ms={rng.randrange(20, 900)} build={rng.randrange(16**6):06x}"
    )


@tool(name=TOOL_NAME, approval_mode="never_require")
def lookup_deployment(service: str) -> str:
    """Look up the deployment log of a service; the log carries its release codes."""
    return lookup_result(service)
