# ZeRO by hand: two commands for everyone (`make lab`, `make test`), more for instructors.
# Everything runs in .venv, created on first use.
.DEFAULT_GOAL := help
include setup.mk

.PHONY: help setup sandbox-tools lab test test-gpu test-browser test-hub hub hub-down screenshots release check-release grade feedback check export formgrader handout bench wheelhouse clean-venv

help:
	@echo "make lab       set up .venv and open the course in JupyterLab (your copies: $(WORKDIR)/)"
	@echo "make test      set up .venv and run every test"
	@echo "make test-gpu       the course on NCCL: needs one GPU per rank (4); says so and fails without"
	@echo "make test-browser   only the browser test (JupyterLab + Notebook 7 in headless Chromium)"
	@echo "make test-hub       only the JupyterHub test (deploy/hub/, as root: users, exchange, grading)"
	@echo "make hub USERS=file [HUB_ARGS=...]   set up and start the course's JupyterHub (root)"
	@echo "make hub-down                        remove it: users, folders, processes (root)"
	@echo "make release   regenerate notebooks/ from solutions/ (instructors)"
	@echo "make grade SUBMISSIONS=dir OUT=dir   autograde <student>/<assignment>/<assignment>.ipynb"
	@echo "make feedback OUT=dir               after manual grading: regenerate feedback and grades.csv"
	@echo "make check NOTEBOOK=path.ipynb      run a notebook's tests before submitting"
	@echo "make export OUT=dir                 grades for an LMS (one row per learner) + feedback zips"
	@echo "make formgrader OUT=dir             open formgrader on a graded folder (manual grading)"
	@echo "make handout OUT=dir                a learner repository: no solutions/, tests/ or hidden tests"

# `make grade` runs every submission's kernel under bubblewrap (autograder/sandbox_kernel.py).
sandbox-tools:
	@command -v bwrap >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing bubblewrap (the grading sandbox)"; \
	    apt-get update -qq >/dev/null && apt-get install -y -qq bubblewrap >/dev/null; \
	  else echo "bubblewrap missing: sudo apt-get install bubblewrap (or grade with ZEROCOURSE_SANDBOX=0)"; fi; }

# Two pytest workers: the grading battery mostly waits on timeouts and kernels, so it overlaps
# well with the rest even on 2 cores. Work units are groups (tests/conftest.py): a file whose
# tests share a module fixture goes whole to one worker, the tests of the other files one by
# one, longest first. Beside them, in a second lane (`||`), the browser test and then the hub
# test: they mostly wait (on a browser, servers, kernels: 127 CPU-s in 4:46 alone), so beside
# the workers they cost little CPU, and one after the other they never share apt, a browser or
# a port. The last lines give each part's wall time.
TEST_WORKERS ?= 2
test: setup sandbox-tools
	$(PY) tests/run_parts.py \
	  "parallel part=$(PY) -m pytest tests -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder --durations=25 --ignore=tests/test_browser.py --ignore=tests/test_hub.py" \
	  "||" \
	  "browser=$(PY) -m pytest tests/test_browser.py" \
	  "hub=$(PY) -m pytest tests/test_hub.py"

# The course on NCCL (tests/gpu_suite.py): the launcher probe, every solution top to bottom, the
# graded cells with the reference solutions and the bench's stages, with one GPU per rank. On a
# machine without them it says so in one line and exits 1. GPU_ARGS="--dry-run" shows the plan.
GPU_ARGS ?=
test-gpu: setup
	@$(PY) tests/gpu_suite.py $(GPU_ARGS)

# The notebooks in JupyterLab and Notebook 7, driven in headless Chromium (part of `make test`;
# it installs Debian's chromium + chromium-driver itself when it can, and skips saying why if not).
test-browser: setup
	$(PY) -m pytest tests/test_browser.py

# The course on JupyterHub, end to end in headless Chromium (deploy/hub/README.md). Needs root
# (it creates and removes users); installs JupyterHub, configurable-http-proxy (npm) and
# chromium itself, and skips saying why where it cannot. Screenshots: artifacts/hub/.
test-hub: setup sandbox-tools
	$(PY) -m pytest tests/test_hub.py

# A shared deployment (deploy/hub/README.md): USERS is a file of "learner NAME" /
# "instructor NAME" lines; HUB_ARGS e.g. "--port 8000 --mem-gib 3 --cpus 2".
hub: setup sandbox-tools
	@test -n "$(USERS)" || { echo "usage: make hub USERS=deploy/hub/users.example [HUB_ARGS=...]"; exit 2; }
	deploy/hub/setup.sh "$(USERS)" $(HUB_ARGS)

hub-down:
	deploy/hub/teardown.sh $(HUB_ARGS)

# Refresh the README's screenshots from a browser run.
screenshots: test-browser
	cp artifacts/browser/environment_check.png artifacts/browser/memory_calculator.png \
	   artifacts/browser/zero3_timeline.png docs/screenshots/

release: setup
	$(PY) autograder/release.py

check-release: setup
	$(PY) autograder/release.py --check

grade: setup sandbox-tools
	@test -n "$(SUBMISSIONS)" -a -n "$(OUT)" || { echo "usage: make grade SUBMISSIONS=dir OUT=dir"; exit 2; }
	$(PY) autograder/grade.py "$(SUBMISSIONS)" "$(OUT)" $(if $(JOBS),--jobs $(JOBS))

# After reviewing manually graded cells in formgrader: new feedback and grades.csv.
feedback: setup
	@test -n "$(OUT)" || { echo "usage: make feedback OUT=dir (the folder make grade wrote)"; exit 2; }
	$(PY) autograder/grade.py --refresh "$(OUT)"

export: setup
	@test -n "$(OUT)" || { echo "usage: make export OUT=dir (the folder make grade wrote)"; exit 2; }
	$(PY) autograder/export.py "$(OUT)"

# Formgrader on a graded folder, from anywhere and as root (manual grading, then `make feedback`).
FORMGRADER_PORT ?= 8890
formgrader: setup
	@test -d "$(OUT)" -a -f "$(OUT)/gradebook.db" || { echo "usage: make formgrader OUT=dir (a folder make grade wrote: it holds gradebook.db)"; exit 2; }
	cd "$(OUT)" && ZEROCOURSE_NBGRADER_ROOT="$$(pwd)" ZEROCOURSE_GRADEBOOK="sqlite:///$$(pwd)/gradebook.db" \
	  "$(CURDIR)/$(VENV)/bin/jupyter" lab --config="$(CURDIR)/autograder/formgrader_config.py" \
	  --port=$(FORMGRADER_PORT) --no-browser $$( [ "$$(id -u)" = 0 ] && echo --allow-root ) \
	  --ServerApp.default_url=/formgrader

handout: setup
	@test -n "$(OUT)" || { echo "usage: make handout OUT=dir (a new folder: the learner repository)"; exit 2; }
	$(PY) autograder/handout.py "$(OUT)"

# `make bench BENCH_ARGS="--only class --class-size 20"`: parts and options of zerocourse/bench.py.
BENCH_ARGS ?=
bench: setup
	$(PY) -m zerocourse.bench $(BENCH_ARGS)

# For a room without internet: every wheel the course installs, in one folder. Copy the course
# and wheelhouse/ to the room's machines, then: PIP_NO_INDEX=1 PIP_FIND_LINKS=$$PWD/wheelhouse make lab
# (torch from PyTorch's CPU index, as on machines without a GPU; pass TORCH_INDEX= for PyPI's build).
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
wheelhouse:
	$(PYTHON) -m pip download --quiet --dest wheelhouse $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) -r requirements.txt pip setuptools wheel
	@du -sh wheelhouse

