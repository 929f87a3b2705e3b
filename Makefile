# syncbench: `make demo` runs the main job, `make test` runs the checks. Both install on first use.
PY := .venv/bin/python
VENV_STAMP := .venv/.installed-stamp

.PHONY: install demo test test-fast mutations bench lint clean gpu-results gpu-check

$(VENV_STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	# Chakra's schema and reader for the trace tests, without its analysis stack (HolisticTraceAnalysis, jupyter:
	# 100 packages the reader does not import); `pip install syncbench[trace]` takes it whole
	$(PY) -m pip install -q --no-deps mlc-chakra
	touch $(VENV_STAMP)

install: $(VENV_STAMP)

demo: $(VENV_STAMP)
	.venv/bin/syncbench run experiments/config/sweeps/quick.toml --overwrite

test: $(VENV_STAMP)
	.venv/bin/ruff check .
	$(PY) -m pytest -q --durations=15

bench: $(VENV_STAMP)
	.venv/bin/syncbench bench transport
	.venv/bin/syncbench bench harness
	.venv/bin/syncbench bench --workers 4 --sizes 4K,64K,1M,16M,64M
	.venv/bin/syncbench bench --workers 8 --sizes 4K,16K,64K --strategies ring,halving_doubling,native
	.venv/bin/syncbench bench --workers 4 --sizes 16M --bandwidth 1Gbit --latency 50us
	.venv/bin/syncbench bench --workers 4 --p2p sockets
	.venv/bin/syncbench bench --workers 8 --strategies ring,halving_doubling,reduce_broadcast,all_to_all,naive_ring,native,ddp --p2p sockets
	.venv/bin/syncbench bench ps

# The correctness core for iteration (budget 3 minutes on 2 cores): every test but those marked ray, netns, gpu,
# slow, simgrid or timing. A new test file is in by default; a slow one opts out by marker (tests/conftest.py's SLOW_MODULES for a
# whole file, @pytest.mark.slow for one test). In it: strategies against their references on thread ranks (the
# generic matrix and errors), the hand-worked traffic tables, strategy details, compression, the barrier-free
# parameter server, sweep parsing, the results schema and store, run metrics, time to target, the model and the
# report's numbers, and the reduced validation matrix (`simgrid_fast`: the model against SimGrid alpha_beta, every
# strategy, about 15 s; skipped with the reason without SimGrid). Other SimGrid simulations (`simgrid`) and
# wall-clock tests (`timing`, load-sensitive) are left to make test; the bugs of tests/mutations.py that only timing
# tests once caught (pool-counters-carry-over, async-push-not-scaled-by-n, ssp-bound-one-step-loose) are caught in
# the fast tier by tests that script the order of events instead of a clock.
FAST_MARKERS := not ray and not netns and not gpu and not slow and not simgrid and not timing
test-fast: $(VENV_STAMP)
	.venv/bin/ruff check .
	SYNCBENCH_TEST_BUDGET_S=180 $(PY) -m pytest -q -m "$(FAST_MARKERS)"

# Plant each bug of tests/mutations.py's table in a copy of git HEAD and run the tests that must catch it
# (make test-fast's first, a wider set if it survives); the result goes to docs/mutations.md.
mutations: $(VENV_STAMP)
	$(PY) -m tests.mutations --write docs/mutations.md

lint: $(VENV_STAMP)
	.venv/bin/ruff check .

clean:
	rm -rf .venv results .pytest_cache .ruff_cache

# On a GPU machine: the scaling sweep (ResNet-50, VGG-16 at 224x224, 1-8 workers sharing the GPU) and its
# results under docs/results/<gpu name>/, plus the 1-worker harness ratio on the GPU.
gpu-results: $(VENV_STAMP)
	.venv/bin/syncbench run experiments/config/sweeps/scaling.toml --out results/scaling --resume
	.venv/bin/python -m experiments.pipeline.publish results/scaling
	.venv/bin/syncbench bench harness --device cuda --workload resnet50 --image-size 224

# On the GPU machine, nothing installed (the image's own torch; no Ray, plotly or jsonschema needed): the prepared
# check of docs/gpu.md (environment, harness vs plain PyTorch, measured profiles, every strategy on CUDA, a trimmed
# scaling sweep), about 6 minutes on an H200, its files in $(OUT). The CPU dry run: tests/experiments/test_gpu_check.py.
OUT ?= gpu-check
GPU_CHECK_DEVICE ?= cuda
gpu-check:
	PYTHONPATH=. timeout 480 python3 -m experiments.gpu_check --out $(OUT) --device $(GPU_CHECK_DEVICE)
