"""Try the README's anchored agent without a provider key, and see what compaction does call by call.

    python docs/examples/try_offline.py            # needs the bench extra: pip install ".[bench]" in a checkout

The agent is the README's quickstart agent (``create_harness_agent`` with the harness's
defaults, ``AnchoredCompactionStrategy`` for both phases, ``store=False``) with its real
``OpenAIChatClient``, pointed at :class:`maf_compaction.bench.offline.OfflineProvider`: a
scripted model on ``127.0.0.1`` that looks each service up with the README's tool and
quotes the code it asked for, billed by a simulated prompt cache. Two things differ from the
README so that compaction has work within a few turns: the window is 24,000 tokens, and the
tool returns the deployment log around the README's record (about 3,000 tokens per lookup).

Each line of the report is one request: its size, the share the cache served, how many of
the previous request's messages it no longer carries byte for byte and which (a result
shortened as it ages out of the tail, a shed, or the harness's todo list, which leaves the
calls inside the tool loop), a line counting the results newly shortened, and the lines the
strategy logged about what it took out.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import tempfile

from agent_framework import create_harness_agent, tool
from agent_framework_openai import OpenAIChatClient

from maf_compaction import AnchoredCompactionStrategy, TiktokenTokenizer, measure_agent_overhead
from maf_compaction.bench.offline import OfflineProvider, Question

CONTEXT_WINDOW = 24_000
MAX_OUTPUT = 2_000
SERVICES = [f"svc-{n}" for n in range(12)]
LOG_LINES = 120


def code_of(service: str) -> str:
    """The code the README's tool reports for ``service`` (one per service, so each answer is checkable)."""
    return f"TL-{3000 + int(service.split('-')[1]) * 7:04X}"


@tool(approval_mode="never_require")
def lookup_deployment(service: str) -> str:
    """Look up the current deployment record of a service."""
    log = [f"{service} rollout step {i}: health=ok latency=12ms replicas={3 + i % 4}" for i in range(LOG_LINES)]
    record = f"service={service}\nregion=westeurope\nrelease=2026.11.3\ncode_1={code_of(service)}"
    return "\n".join([*log, record])


QUESTIONS = [
    Question(
        f"Look up the deployment of {service} and quote its code_1.",
        tool="lookup_deployment",
        arguments={"service": service},
        expected=(code_of(service),),
    )
    for service in SERVICES
]


async def ask(agent: object, questions: list[Question]) -> list[str]:
    """Ask ``questions`` in one session; the replies, in order."""
    session = agent.create_session()  # type: ignore[attr-defined]
    return [(await agent.run(q.text, session=session)).text for q in questions]  # type: ignore[attr-defined]


def main() -> int:
    """Run the agent against the offline provider and print the replies and the report."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    os.chdir(tempfile.mkdtemp(prefix="try-offline-"))  # the harness's file memory writes here
    tokenizer = TiktokenTokenizer()
    with OfflineProvider(QUESTIONS, window=CONTEXT_WINDOW, encoder=tokenizer) as offline:
        client = OpenAIChatClient(model="gpt-6-luna", api_key="sk-offline", base_url=offline.base_url)
        options = {"store": False}  # client-side history: what compaction works on
        instructions = "Answer from the lookups you make. Quote values exactly."
        overhead = measure_agent_overhead(
            create_harness_agent(client, name="assistant", agent_instructions=instructions, tools=[lookup_deployment]),
            tokenizer,
        )
        budget = overhead.budget(CONTEXT_WINDOW, MAX_OUTPUT, margin=1_000)
        strategy = AnchoredCompactionStrategy(max_input_tokens=budget, tokenizer=tokenizer)
        agent = create_harness_agent(
            client,
            name="assistant",
            agent_instructions=instructions,
            tools=[lookup_deployment],
            max_context_window_tokens=CONTEXT_WINDOW,
            max_output_tokens=MAX_OUTPUT,
            before_compaction_strategy=strategy,
            after_compaction_strategy=strategy,
            tokenizer=tokenizer,
            default_options=options,
        )
        replies = asyncio.run(ask(agent, QUESTIONS))
        print(f"budget {budget:,} tokens ({overhead})")
        for question, reply in zip(QUESTIONS, replies, strict=True):
            print(f"{question.text}\n  -> {reply}")
        print(offline.report())
        answered = sum(all(v in reply for v in q.expected) for q, reply in zip(QUESTIONS, replies, strict=True))
        print(f"{answered} of {len(QUESTIONS)} answers quote their code; strategy: {strategy.last_report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
