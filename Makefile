# Set-up and everyday commands.  `make run` and `make test` install whatever
# is missing first (Debian packages, kernel headers for BCC, the virtualenv).
VENV := .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: setup run test lint unit integration clean

setup:
	@./scripts/setup-host.sh

run: setup
	@./scripts/demo.sh

lint: setup
	$(VENV)/bin/ruff check alfwrapper tests examples
	$(VENV)/bin/ruff format --check alfwrapper tests examples
	$(VENV)/bin/mypy
	mandoc -Tlint -W warning man/*.1

test: setup lint
	$(PY) -m pytest $(PYTEST_ARGS)

unit: setup
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
