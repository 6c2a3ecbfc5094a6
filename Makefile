# Set-up and everyday commands.  `make run` and `make test` install whatever
# is missing first (Debian packages, kernel headers for BCC, the virtualenv).
VENV := .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

PREFIX ?= /usr/local
UNITDIR ?= /etc/systemd/system

.PHONY: setup run test lint unit integration clean install bench mutate

setup:
	@./scripts/setup-host.sh

run: setup
	@./scripts/demo.sh

lint: setup
	$(VENV)/bin/ruff check alfwrapper tests examples benchmarks
	$(VENV)/bin/ruff format --check alfwrapper tests examples benchmarks
	$(VENV)/bin/mypy
	mandoc -Tlint -W warning man/*.[1-9]

test: setup lint
	$(PY) -m pytest $(PYTEST_ARGS)

# Writes docs/benchmarks.md and docs/*.png from a run on this machine (as root).
bench: setup
	$(PY) benchmarks/bench.py --out docs

# Breaks each feature on purpose in a scratch clone of HEAD and runs its tests
# (tests/mutate.py); every mutation must be killed.  As root; about ten minutes.
mutate: setup
	$(PY) tests/mutate.py

unit: setup
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis

# Installs a launcher for this checkout's virtualenv (keep the checkout where the
# service's user can read it), the example service, the man page and the units.
install: setup
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/alfwrapper \
		$(DESTDIR)$(PREFIX)/share/man/man1 $(DESTDIR)$(PREFIX)/share/man/man5 \
		$(DESTDIR)$(PREFIX)/share/man/man8 \
		$(DESTDIR)$(PREFIX)/lib/alfwrapper/policy $(DESTDIR)$(UNITDIR)
	printf '#!/bin/sh\nexec %s/.venv/bin/alfwrapper "$$@"\n' "$(CURDIR)" \
		> $(DESTDIR)$(PREFIX)/bin/alfwrapper
	chmod 755 $(DESTDIR)$(PREFIX)/bin/alfwrapper
	install -m 644 examples/echo_server.py $(DESTDIR)$(PREFIX)/share/alfwrapper/
	install -m 644 man/alfwrapper.1 $(DESTDIR)$(PREFIX)/share/man/man1/
	install -m 644 man/alfwrapper.policy.5 $(DESTDIR)$(PREFIX)/share/man/man5/
	install -m 644 man/alfwrapper-loader.8 $(DESTDIR)$(PREFIX)/share/man/man8/
	install -m 644 policies/*.toml $(DESTDIR)$(PREFIX)/lib/alfwrapper/policy/
	install -d $(DESTDIR)$(PREFIX)/share/alfwrapper/lighttpd/www
	install -m 644 examples/lighttpd/lighttpd.conf $(DESTDIR)$(PREFIX)/share/alfwrapper/lighttpd/
	install -m 644 examples/lighttpd/www/index.html $(DESTDIR)$(PREFIX)/share/alfwrapper/lighttpd/www/
	install -m 644 units/*.socket units/*.service units/*.timer examples/lighttpd/*.socket \
		examples/lighttpd/*.service $(DESTDIR)$(UNITDIR)/
	@echo "installed; now: systemctl daemon-reload && systemctl start alfwrapper-echo.socket"
