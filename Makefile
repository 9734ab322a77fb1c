# voiceedge: the two commands of the README, and a few more.
#   make scenario REGION=apac   run the main scenario for clients in REGION
#   make check                  the fast tier: unit and component tests (no root needed)
#   make test                   run the whole test suite (needs root: namespaces, iptables)
SHELL := /bin/bash
PY_SYSTEM := /usr/bin/python3
VENV := .venv
BIN := $(VENV)/bin
REGION ?= apac
SCENARIO ?= scenarios/default.yaml
SWEEP ?= scenarios/sweep.yaml

.PHONY: deps venv browsers scenario sweep check test test-deps budgets bench-relay bench-hostile clean help

help:
	@echo "make scenario REGION=apac   run the scenario for clients in REGION"
	@echo "make sweep REGION=apac      run the shipped sweep (the public internet's rtt_scale; docs/sweeps.md)"
	@echo "make check                  the fast tier: unit and component tests, no world, namespace,"
	@echo "                            browser or docker; no root (about 110 s on 2 cores; docs/contributing.md)"
	@echo "make test                   run the whole test suite (what CI runs; needs root)"
	@echo "make budgets                run the compact CI scenarios; check the latency and fault budgets"
	@echo "make bench-relay            benchmark the relay's forwarding cost and added latency"
	@echo "make bench-hostile          hostile input against a live edge (fuzz, flood, signaling, hygiene)"
	@echo "make browsers               install Debian's chromium, for browser clients (docs/browser.md)"
	@echo "make compose-test           the edge on docker-compose, end to end (docs/deployment.md)"
	@echo "make asan-test              the native extensions' tests under AddressSanitizer"
	@echo "make fuzz                   fuzz the media plane, the impairment core, the relay's admission and fast path (FUZZ_RUNS=100000 each)"

deps:
	@scripts/install-debian-deps.sh

# Debian's /usr/bin/python3 with its site-packages: that is where Debian's mininet lives
# (PyPI's mininet has no mnexec). The stamp re-installs only when pyproject.toml or a C source
# changes. uv installs (about 20 s on a fresh clone here, pip 37 s: it fetches in parallel);
# --reinstall-package rebuilds the extensions, which uv's cache would otherwise keep. Bytecode
# is compiled here, the project's too: where PYTHONDONTWRITEBYTECODE is set (these machines)
# nothing writes it later, and every process of a run would compile what it imports again
# (without it, importing the services and the analysis took 1.9-2.8 s against 1.4-1.5).
PACKAGES := voiceedge services topology scenarios analysis bench tests
$(BIN)/.installed: pyproject.toml services/relay/_fastpath.c services/relay/_admission.c services/mediaplane/_mediaplane.c services/mediaplane/srtp_gcm.c services/mediaplane/srtp_gcm.h topology/impairment/_engine.c | deps
	@test -x $(BIN)/python || $(PY_SYSTEM) -m venv --system-site-packages $(VENV)
	@test -x $(BIN)/uv || $(BIN)/pip install -q --disable-pip-version-check 'uv>=0.9,<1'
	@$(BIN)/uv pip install -q --python $(BIN)/python --compile-bytecode \
		--reinstall-package voiceedge -e '.[test]'
	@$(BIN)/python -m compileall -q $(PACKAGES) >/dev/null
	@touch $@

venv: deps $(BIN)/.installed

# Debian's chromium, only where browser clients run: the tests (tests/test_browser.py and the
# CI scenario's Chromium sessions) and a scenario whose clients include chromium.
browsers:
	@scripts/install-debian-deps.sh browsers

# Exit status 0 when a client type of scenario file $(1)'s mix needs a browser (chromium).
wants_browsers = $(BIN)/python -c 'import sys; from scenarios.spec import Scenario; \
	sys.exit(0 if Scenario.load(sys.argv[1]).needs_browser else 1)' $(1) 2>/dev/null

scenario: venv
	@if $(call wants_browsers,$(SCENARIO)); then scripts/install-debian-deps.sh browsers; fi
	@$(BIN)/voiceedge scenario $(SCENARIO) --region $(REGION)

# A scenario's sweep: every architecture at every point (docs/sweeps.md); SWEEP_ARGS, e.g.
# --resume results/sweep-sweep-apac-<time> or --max-minutes 90.
sweep: venv
	@if $(call wants_browsers,$(SWEEP)); then scripts/install-debian-deps.sh browsers; fi
	@$(BIN)/voiceedge sweep $(SWEEP) --region $(REGION) $(SWEEP_ARGS)

# The tiers (docs/contributing.md). `make check`: the unit and component tests (loopback, real
# redis-server), three workers on the two cores (many of its tests wait on loopback services:
# 110 s against 135 with two); no root needed. `make test`: everything, as CI runs it; the
# same tier first, the same way, then the tests that need a world, a namespace, Chromium or
# dockerd: the `shareable` files (behaviour only, in namespaces of their own; mostly waiting)
# two at a time, with the native extensions' tests under AddressSanitizer beside them
# (scripts/asan-test: behaviour only too, its output printed after theirs), the others one at
# a time (they measure latency and CPU, or look at the whole machine: side by side they would
# skew each other). With PYTEST_ARGS, one pytest run of what they select, e.g.
# PYTEST_ARGS=tests/test_x.py.
CHECK_MARKERS := not world and not netns and not browser and not docker

check: venv
	@$(BIN)/python -m pytest -q -n 3 -m "$(CHECK_MARKERS)" $(PYTEST_ARGS)

# One apt-get run for the base packages and chromium (test-deps), then the venv.
test-deps:
	@scripts/install-debian-deps.sh base browsers

test: test-deps venv
ifeq ($(strip $(PYTEST_ARGS)),)
	@status=0; \
	$(BIN)/python -m pytest -q -n 3 -m "$(CHECK_MARKERS)" || status=$$?; \
	asan_log=$$(mktemp); scripts/asan-test >$$asan_log 2>&1 & asan=$$!; \
	$(BIN)/python -m pytest -q -n 2 --dist loadfile -m "shareable and not ($(CHECK_MARKERS))" \
		|| status=$$?; \
	wait $$asan || status=$$?; cat $$asan_log; rm -f $$asan_log; \
	$(BIN)/python -m pytest --durations=15 -m "not shareable and not ($(CHECK_MARKERS))" \
		|| status=$$?; \
	exit $$status
else
	@$(BIN)/python -m pytest $(PYTEST_ARGS)
endif

budgets: venv
	@$(BIN)/voiceedge budgets

bench-relay: venv
	@$(BIN)/voiceedge bench relay $(BENCH_ARGS)

bench-hostile: venv
	@$(BIN)/voiceedge bench hostile $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build *.egg-info

# The edge on docker-compose, end to end, with its own dockerd in a network namespace
# (docs/deployment.md, "docker-compose"). Not part of `make test`.
.PHONY: compose-test
compose-test: venv browsers
	@scripts/compose-test

# The native extensions' tests under AddressSanitizer and UBSan (scripts/asan-test): built with
# the sanitizers in a temporary folder, tests/test_mediaplane.py (or PYTEST_ARGS) against them.
.PHONY: asan-test
asan-test: venv
	@scripts/asan-test $(PYTEST_ARGS)

# Coverage-guided fuzzing of the native entry points (bench/fuzz_mediaplane.py,
# bench/fuzz_impairment.py, bench/fuzz_admission.py, bench/fuzz_fastpath.py): Debian's clang
# and PyPI's atheris, installed here only; FUZZ_RUNS
# inputs each (default 100000: about 5 min for the media plane).
FUZZ_RUNS ?= 100000
.PHONY: fuzz
fuzz: venv
	@scripts/install-debian-deps.sh fuzz
	@$(BIN)/pip install -q --disable-pip-version-check 'atheris>=2.3,<4'
	@$(BIN)/python -m bench.fuzz_mediaplane --runs $(FUZZ_RUNS)
	@$(BIN)/python -m bench.fuzz_impairment --runs $(FUZZ_RUNS)
	@$(BIN)/python -m bench.fuzz_admission --runs $(FUZZ_RUNS)
	@$(BIN)/python -m bench.fuzz_fastpath --runs $(FUZZ_RUNS)
