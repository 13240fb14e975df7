# The two commands of the README: `make demo` and `make test`. Both create the virtual
# environment on first use and install the package with the pinned versions in
# constraints.txt, so a fresh machine gets exactly what was tested.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo bench docs test test-long lint typecheck pytest bench-speed bench-sessions bench-load clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml constraints.txt
	$(BIN)/python -m pip install --quiet --upgrade "pip==$$(sed -n 's/^pip==//p' constraints.txt)"
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[dev]"
	touch $(STAMP)

# The default grid: fills 0.9, 1.5 and 3.0 x every row x 3 seeds at a 32K window; then the same fills and seeds on
# the other workloads (value-dense logs, reads of the standard library) for the control, the framework's default,
# anchored trimming and the composition.
WORKLOAD_ROWS := none,context_window,anchored,tool_and_user_summary_anchored
demo: $(STAMP)
	$(BIN)/python -W "ignore:maf-compaction is experimental" -m maf_compaction.bench
	$(BIN)/python -W "ignore:maf-compaction is experimental" -m maf_compaction.bench --results dense \
		--rows $(WORKLOAD_ROWS)
	$(BIN)/python -W "ignore:maf-compaction is experimental" -m maf_compaction.bench --results stdlib \
		--rows $(WORKLOAD_ROWS)

# The full grid: 5 seeds, every cache rule; JSON and plots under bench-results/ (git-ignored).
bench: $(STAMP)
	$(BIN)/python -W "ignore:maf-compaction is experimental" -m maf_compaction.bench --seeds 5 --cache openai \
		--json bench-results/openai.json --plot bench-results/openai.png
	$(BIN)/python -W "ignore:maf-compaction is experimental" -m maf_compaction.bench --seeds 5 \
		--cache openai-free-tool-choice --json bench-results/openai-free-tool-choice.json \
		--plot bench-results/openai-free-tool-choice.png
	$(BIN)/python -W "ignore:maf-compaction is experimental" -m maf_compaction.bench --seeds 5 --cache anthropic \
		--json bench-results/anthropic.json --plot bench-results/anthropic.png

# The bench tables in README.md and docs/bench.md, regenerated from pinned runs (tests/test_docs.py checks them).
docs: $(STAMP)
	$(BIN)/python -W "ignore:maf-compaction is experimental" -m maf_compaction.bench docs --write

lint: $(STAMP)
	$(BIN)/ruff check src tests docs/examples
	$(BIN)/ruff format --check src tests

typecheck: $(STAMP)
	$(BIN)/pyright

# Test files spread over the machine's cores (a file's tests stay in one worker, so its module-level caches are
# built once); about 5.5 minutes on 2 cores.
pytest: $(STAMP)
	$(BIN)/python -m pytest -q -n auto --dist loadfile

test: lint typecheck pytest

# The property tests with many more examples, drawn afresh (about 20 minutes).
test-long: $(STAMP)
	HYPOTHESIS_PROFILE=long $(BIN)/python -m pytest -q tests/test_anchored_properties.py tests/test_grouping.py \
		tests/test_regroup.py tests/test_record_cache.py tests/test_records_properties.py tests/test_user_summaries_properties.py \
		tests/test_snapshot_envelope.py tests/test_composition_properties.py \
		tests/test_sessions_properties.py tests/test_core_replay_properties.py

bench-speed: $(STAMP)
	$(BIN)/python -W "ignore:maf-compaction is experimental" -m maf_compaction.bench speed

# The session registry's read and write per phase at 10, 100 and 1,000 sessions (docs/sessions-bench.md).
bench-sessions: $(STAMP)
	$(BIN)/python -W "ignore:maf-compaction is experimental" -m maf_compaction.bench sessions

# Turns per second through the registry and through Redis, beside the no-compaction baseline (docs/sessions-bench.md).
bench-load: $(STAMP)
	$(BIN)/python -W "ignore:maf-compaction is experimental" -m maf_compaction.bench load

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .ruff_cache .hypothesis agent-file-memory
