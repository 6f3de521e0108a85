# The learner's part of the Makefile, shared by the course repository and `make handout`'s copy:
# a .venv created on first use, and `make lab`. Everything runs in .venv.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.zerocourse-installed
# Where `make lab` keeps YOUR copies of the notebooks (git-ignored, never overwritten).
WORKDIR ?= my-notebooks
LAB_ARGS ?=

$(STAMP): requirements.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade --quiet pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -e .
	@touch $(STAMP)

# The course's modules compiled once (their .pyc beside them): every kernel, rank host and
# fork server imports them, and a machine with PYTHONDONTWRITEBYTECODE would compile them in
# each (~0.3 CPU-s). Up-to-date files are skipped.
setup: $(STAMP)
	@$(PY) -m compileall -q $(wildcard zerocourse autograder) >/dev/null

# Copy the course's notebooks into $(WORKDIR) once: files already there are yours and are
# never overwritten, so `git pull` brings new notebooks without touching your work.
lab: setup
	@mkdir -p $(WORKDIR)
	@for d in notebooks/*/; do \
	  id=$$(basename $$d); \
	  if [ ! -e "$(WORKDIR)/$$id" ]; then cp -r "$$d" "$(WORKDIR)/$$id"; echo "new notebook: $(WORKDIR)/$$id"; fi; \
	done
	$(VENV)/bin/jupyter lab --notebook-dir=$(WORKDIR) $$( [ "$$(id -u)" = 0 ] && echo --allow-root ) $(LAB_ARGS)

# Run a notebook's tests the way the grader does, before submitting.
check: setup
	@test -n "$(NOTEBOOK)" || { echo "usage: make check NOTEBOOK=my-notebooks/00_setup/00_setup.ipynb"; exit 2; }
	$(PY) autograder/check.py "$(NOTEBOOK)"

clean-venv:
	rm -rf $(VENV)
