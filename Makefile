PY := .venv/bin/python
VENV_STAMP := .venv/.installed

.PHONY: install demo test bench lint clean

$(VENV_STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(VENV_STAMP)

install: $(VENV_STAMP)

demo: $(VENV_STAMP)
	.venv/bin/syncbench run experiments/sweeps/quick.toml

test: $(VENV_STAMP)
	.venv/bin/ruff check .
	.venv/bin/python -m pytest -q

bench: $(VENV_STAMP)
	.venv/bin/syncbench bench --transport

lint: $(VENV_STAMP)
	.venv/bin/ruff check .
