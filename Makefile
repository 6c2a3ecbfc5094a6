# Set-up and everyday commands.  `make run` and `make test` install whatever
# is missing first (Debian packages, kernel headers for BCC, the virtualenv).
VENV := .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

PREFIX ?= /usr/local
UNITDIR ?= $(PREFIX)/lib/systemd/system
GENERATORDIR ?= $(PREFIX)/lib/systemd/system-generators
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
DEB := dist/alfwrapper_$(VERSION)_all.deb

.PHONY: help setup dev venv run test lint unit test-fast clean install uninstall deb bench mutate completion

setup:
	@./scripts/setup-host.sh
	@if [ -d .git ]; then install -D -m 755 scripts/commit-msg .git/hooks/commit-msg; fi

# The targets, each with its one line.
help:
	@echo "make run        the echo service behind alfwrapper (installs what is missing)"
	@echo "make test       lint and every test tier, as CI runs it"
	@echo "make test-fast  the unit and host tiers (as root: BPF on this kernel), on every core"
	@echo "make unit       the unit tier"
	@echo "make lint       ruff, mypy, the import layers, the man pages, the commit messages"
	@echo "make dev        only what make lint and make unit need (a few packages, the venv)"
	@echo "make bench      docs/benchmarks.md from a run on this machine"
	@echo "make mutate     break each feature on purpose: its tests must notice"
	@echo "make deb        dist/alfwrapper_*.deb;  make install / uninstall: into PREFIX"

# What make lint and make unit need, and no more: a few Debian packages (mandoc, the
# libraries alfwrapper imports) and the virtualenv (scripts/setup-host.sh --dev).
dev:
	@./scripts/setup-host.sh --dev
	@if [ -d .git ]; then install -D -m 755 scripts/commit-msg .git/hooks/commit-msg; fi

# The virtualenv alone: nothing else on this host changes (what make install needs).
venv:
	@./scripts/setup-host.sh --venv-only

run: setup
	@./scripts/demo.sh

# Bash completion, generated from the argparse definitions by shtab (python3-shtab;
# alfwrapper/completion.py).
completion: venv
	mkdir -p build/completion
	$(PY) -m alfwrapper.completion \
		> build/completion/alfwrapper.tmp
	mv build/completion/alfwrapper.tmp build/completion/alfwrapper

lint: dev
	$(VENV)/bin/ruff check alfwrapper tests examples benchmarks
	$(VENV)/bin/ruff format --check alfwrapper tests examples benchmarks
	$(VENV)/bin/mypy
	$(PY) tests/layers.py
	mandoc -Tlint -W warning man/*.[1-9]
	$(PY) tests/commits.py

test: setup lint
	$(PY) -m pytest -n 3 --dist loadscope $(PYTEST_ARGS)

# Writes docs/benchmarks.md and docs/*.png from a run on this machine (as root).
bench: setup
	$(PY) benchmarks/bench.py --out docs

# Breaks each feature on purpose in a scratch clone of HEAD and runs its tests
# (tests/mutate.py); every mutation must be killed.  As root; about ten minutes.
mutate: setup
	$(PY) tests/mutate.py

unit: dev
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

# The fast tiers (tests/helpers/tiers.py): tests/unit (pure Python) and tests/host (as
# root: BPF on this kernel, no network namespaces or systemd), on every core
# (pytest-xdist; a test file stays on one worker).
test-fast: setup
	$(PY) -m pytest tests/unit tests/host -n auto --dist loadfile $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis

# The Debian package, from this tree as it is (tracked and new files), built
# with debhelper and dh-python in build/deb, checked by lintian.
deb: setup
	rm -rf build/deb && mkdir -p build/deb/alfwrapper-$(VERSION) dist
	git ls-files -co --exclude-standard | while read -r f; do [ -e "$$f" ] && echo "$$f"; done \
		| tar -cf - -T - | tar -xf - -C build/deb/alfwrapper-$(VERSION)
	cd build/deb/alfwrapper-$(VERSION) && env PATH=/usr/sbin:/usr/bin:/sbin:/bin dpkg-buildpackage -us -uc -b >../build.log 2>&1 \
		|| { tail -n 30 ../build.log >&2; exit 1; }
	mv build/deb/alfwrapper_$(VERSION)_all.deb $(DEB)
	lintian --fail-on error $(DEB)
	@echo "built $(DEB); install it with: apt-get install ./$(DEB)"

# From the wheel, away from the checkout: the Python package in
# $(PREFIX)/lib/alfwrapper/python, run by /usr/bin/python3 (Debian's BCC
# bindings are built for it), a launcher in $(PREFIX)/bin, the units in
# $(UNITDIR) with $(PREFIX)'s paths, policies, man pages.  Under DESTDIR
# nothing on this host is changed beyond the files.
LIBDIR := $(PREFIX)/lib/alfwrapper
SHAREDIR := $(PREFIX)/share/alfwrapper
UNITS := $(wildcard units/*.service units/*.socket units/*.timer)
install: venv completion
	rm -rf build/wheel
	$(PY) -m pip wheel -q --no-deps --no-build-isolation -w build/wheel .
	rm -rf $(DESTDIR)$(LIBDIR)/python
	$(PY) -m pip install -q --no-deps --no-index --no-compile --target $(DESTDIR)$(LIBDIR)/python \
		build/wheel/alfwrapper-$(VERSION)-*.whl
	# pip's scripts are replaced by the launcher below; direct_url.json names this checkout.
	rm -rf $(DESTDIR)$(LIBDIR)/python/bin $(DESTDIR)$(LIBDIR)/python/alfwrapper-*.dist-info/direct_url.json
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(SHAREDIR) $(DESTDIR)$(LIBDIR)/policy \
		$(DESTDIR)$(PREFIX)/share/man/man1 $(DESTDIR)$(PREFIX)/share/man/man5 \
		$(DESTDIR)$(PREFIX)/share/man/man8 $(DESTDIR)$(UNITDIR) \
		$(DESTDIR)$(PREFIX)/share/bash-completion/completions
	printf '#!/usr/bin/python3 -I\nimport sys\nsys.path.insert(0, "%s/python")\nfrom alfwrapper.door import main\nsys.exit(main())\n' \
		"$(LIBDIR)" > $(DESTDIR)$(PREFIX)/bin/alfwrapper
	chmod 755 $(DESTDIR)$(PREFIX)/bin/alfwrapper
	install -m 644 build/completion/alfwrapper $(DESTDIR)$(PREFIX)/share/bash-completion/completions/
	install -m 644 policies/*.toml $(DESTDIR)$(LIBDIR)/policy/
	install -m 644 examples/echo_server.py examples/spa_knock.py $(DESTDIR)$(SHAREDIR)/
	install -d $(DESTDIR)$(PREFIX)/lib/sysusers.d
	install -m 644 sysusers/alfwrapper.conf $(DESTDIR)$(PREFIX)/lib/sysusers.d/
	install -m 644 man/alfwrapper.1 $(DESTDIR)$(PREFIX)/share/man/man1/
	install -m 644 man/alfwrapper.policy.5 $(DESTDIR)$(PREFIX)/share/man/man5/
	install -m 644 man/alfwrapper-loader.8 $(DESTDIR)$(PREFIX)/share/man/man8/
	install -d $(DESTDIR)$(GENERATORDIR)
	sed -e 's|/usr/bin/alfwrapper|$(PREFIX)/bin/alfwrapper|g' units/alfwrapper-generator \
		> $(DESTDIR)$(GENERATORDIR)/alfwrapper-generator
	chmod 755 $(DESTDIR)$(GENERATORDIR)/alfwrapper-generator
	for u in $(UNITS); do \
		sed -e 's|/usr/bin/alfwrapper|$(PREFIX)/bin/alfwrapper|g' \
		    -e 's|/usr/share/alfwrapper/|$(SHAREDIR)/|g' "$$u" \
			> $(DESTDIR)$(UNITDIR)/$$(basename "$$u"); \
	done
	@if [ -z "$(DESTDIR)" ]; then \
		systemd-sysusers $(PREFIX)/lib/sysusers.d/alfwrapper.conf; \
		echo "installed in $(PREFIX); now: systemctl daemon-reload && systemctl start alfwrapper-echo.socket"; \
	else \
		echo "installed under $(DESTDIR)$(PREFIX)"; \
	fi

uninstall:
	rm -rf $(DESTDIR)$(LIBDIR) $(DESTDIR)$(SHAREDIR)
	rm -f $(DESTDIR)$(PREFIX)/bin/alfwrapper $(DESTDIR)$(PREFIX)/share/man/man1/alfwrapper.1 \
		$(DESTDIR)$(PREFIX)/share/man/man5/alfwrapper.policy.5 \
		$(DESTDIR)$(PREFIX)/share/man/man8/alfwrapper-loader.8 \
		$(DESTDIR)$(PREFIX)/share/bash-completion/completions/alfwrapper \
		$(DESTDIR)$(PREFIX)/lib/sysusers.d/alfwrapper.conf \
		$(DESTDIR)$(GENERATORDIR)/alfwrapper-generator
	for u in $(UNITS); do rm -f $(DESTDIR)$(UNITDIR)/$$(basename "$$u"); done
	@echo "removed alfwrapper from $(DESTDIR)$(PREFIX) (the system users alfwrapper and alfwrapper-loader stay)"
