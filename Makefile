# syncbench: `make demo` runs the main job, `make test` runs the checks. Both install on first use.
PY := .venv/bin/python
VENV_STAMP := .venv/.installed-stamp

.PHONY: install demo test test-fast bench lint clean gpu-results

$(VENV_STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(VENV_STAMP)

install: $(VENV_STAMP)

demo: $(VENV_STAMP)
	.venv/bin/syncbench run experiments/config/sweeps/quick.toml --overwrite

test: $(VENV_STAMP)
	.venv/bin/ruff check .
	$(PY) -m pytest -q --durations=15

bench: $(VENV_STAMP)
	.venv/bin/syncbench bench --transport
	.venv/bin/syncbench bench --harness
	.venv/bin/syncbench bench --workers 4 --sizes 4K,64K,1M,16M,64M
	.venv/bin/syncbench bench --workers 8 --sizes 4K,16K,64K --strategies ring,halving_doubling,native
	.venv/bin/syncbench bench --workers 4 --sizes 16M --bandwidth 1Gbit --latency 50us
	.venv/bin/syncbench bench --workers 4 --p2p sockets
	.venv/bin/syncbench bench --workers 8 --strategies ring,halving_doubling,reduce_broadcast,all_to_all,naive_ring,native,ddp --p2p sockets
	.venv/bin/syncbench bench --ps

# The correctness core for iteration (budget 3 minutes on 2 cores): strategies against their references on thread
# ranks (the generic matrix and errors), sweep parsing, the results schema and store, run metrics, report numbers.
# No Ray, no namespaces. 203 s on the quiet machine (2026-11-23) before the matrix ran its cases on a pool of thread
# ranks with duplicate op coverage cut; since: 128 s at a load average of 21 falling to 10 (2026-11-24), 80 s of CPU
# (the matrix and errors alone: 97 s of CPU before, under 54 s after).
FAST_TESTS := tests/strategies/test_strategy_matrix.py tests/strategies/test_strategy_errors.py \
	tests/reports/test_report_numbers.py tests/reports/test_honest.py tests/experiments/test_sweep.py \
	tests/experiments/test_store.py tests/experiments/test_run_metrics.py \
	tests/reports/test_deterministic_verdicts.py tests/reports/test_tta_intervals.py \
	tests/reports/test_barrier_free_time_to_target.py tests/reports/test_reconcile.py tests/reports/test_teaching.py \
	tests/experiments/test_validate.py
test-fast: $(VENV_STAMP)
	.venv/bin/ruff check .
	SYNCBENCH_TEST_BUDGET_S=180 $(PY) -m pytest -q -m "not ray and not netns and not gpu and not slow" $(FAST_TESTS)

lint: $(VENV_STAMP)
	.venv/bin/ruff check .

clean:
	rm -rf .venv results .pytest_cache .ruff_cache

# On a GPU machine: the scaling sweep (ResNet-50, VGG-16 at 224x224, 1-8 workers sharing the GPU) and its
# results under docs/results/<gpu name>/, plus the 1-worker harness ratio on the GPU.
gpu-results: $(VENV_STAMP)
	.venv/bin/syncbench run experiments/config/sweeps/scaling.toml --out results/scaling --resume
	.venv/bin/python -m experiments.pipeline.publish results/scaling
	.venv/bin/syncbench bench --harness --device cuda --workload resnet50 --image-size 224
