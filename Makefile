# Transformer 从原理到实现 -- build and test.
#
# `make help` lists every target with the `## ...` text written after it below.
# Needs only make and python3 (the version in pyproject.toml's requires-python, with the
# venv module); every other tool is installed into .venv from requirements.txt.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
.DELETE_ON_ERROR:

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.requirements.stamp
# pytest-xdist workers for the unit tests and for nbval
JOBS   ?= 2
# Extra pip options, e.g. PIP_ARGS="--extra-index-url https://download.pytorch.org/whl/cpu"
# on a Linux machine where the plain torch==2.13.0 wheel would pull CUDA packages.
PIP_ARGS ?=

# Only the code folders that exist (bench/ and scripts/ may not yet).
LINT_PATHS := $(wildcard src tests bench scripts book/_ext conftest.py)
JB_BUILD   := $(BIN)/jupyter-book build . -W -n --keep-going

.PHONY: help venv book test lint format compat unit nbval jupyter claims browser pdf bench notebooks check-chapter zh-corpus clean distclean \
	lab lab-test

help:  ## this list of targets (from the `##` comments of the Makefile)
	@awk -F ':.*## ' '/^[a-zA-Z][a-zA-Z_-]*:.*## / {printf "  make %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# The stamp is rebuilt (pip install re-run) whenever requirements.txt or
# pyproject.toml is newer than the last successful install.
$(STAMP): requirements.txt pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install $(PIP_ARGS) -r requirements.txt
	@# Build matplotlib's font cache now: a first build inside a notebook cell prints
	@# to stderr, which the book build (stderr_output: warn, -W) treats as an error.
	$(BIN)/python -c "import matplotlib.font_manager"
	@touch $@

venv: $(STAMP)  ## only set up .venv (re-run automatically when requirements.txt or pyproject.toml changes)

book: $(STAMP)  ## set up .venv, build the HTML book strictly -> _build/html/index.html
	rm -rf _build
	$(JB_BUILD)
	@echo "HTML book: _build/html/index.html"

lint: $(STAMP)  ## ruff check and ruff format --check (src at 88 columns, C901 complexity <= 10)
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/ruff format --check $(LINT_PATHS)

format: $(STAMP)  ## ruff format and ruff check --fix: what `make lint` checks, applied
	$(BIN)/ruff format $(LINT_PATHS)
	$(BIN)/ruff check --fix $(LINT_PATHS)

unit: $(STAMP)  ## the unit tests (tests/, without the browser and JupyterLab tests)
	$(BIN)/pytest -n $(JOBS) tests

# Executes every jupytext notebook under book/ (collected by conftest.py).
# --dist loadfile keeps one notebook on one worker; exit code 5 ("no tests
# collected") only means that no chapter notebook exists yet.
# One intra-op thread per worker: two workers with two torch threads each on a
# 2-core machine oversubscribe the cores and slow small-tensor cells down badly.
nbval: $(STAMP)  ## execute every page of book/ under nbval
	OMP_NUM_THREADS=1 $(BIN)/pytest --nbval-lax --nbval-current-env -p no:cacheprovider \
	    -n $(JOBS) --dist loadfile book/ \
	  || { rc=$$?; if [ $$rc -eq 5 ]; then echo "nbval: no notebooks under book/ yet"; else exit $$rc; fi; }

# Every notebook page converted to .ipynb and executed by nbclient in a temporary folder
# outside the repository: what a learner who downloads a page gets (tests/jupyter).
jupyter: $(STAMP)  ## run every page as .ipynb in a temp folder outside the repository (nbclient)
	OMP_NUM_THREADS=1 $(BIN)/pytest -p no:cacheprovider -n $(JOBS) tests/jupyter

# Every page under nbval with other base seeds (COURSE_SEED): a claim must hold for any seed.
# Not part of `make test` (it runs the book once per seed); summary in _build/claims/summary.md.
SEEDS ?= 1 2 3
claims: $(STAMP)  ## run every page under nbval with base seeds 1 2 3 (SEEDS=...) -> _build/claims/
	$(BIN)/python scripts/claims.py --seeds $(SEEDS) --jobs $(JOBS)

# The built book in a real browser (tests/browser; `pytest tests` skips that folder):
# headless Chromium (Debian package `chromium`, installed by scripts/install_browser_deps.sh) driven by
# Playwright, against _build/html served on 127.0.0.1 by the test fixture. Checks
# every page of _toc.yml; full-page screenshots go to _build/screenshots/.
browser: $(STAMP)  ## browser tests of the built book (after make book) -> _build/screenshots/
	bash scripts/install_browser_deps.sh
	$(BIN)/pytest -p no:cacheprovider tests/browser

# The whole book as one PDF: the single-page HTML build (it reuses the executed pages of
# `make book` in _build/.doctrees) printed by the browser tests' Chromium with the book's print
# style (solutions expanded); then checks that every page, figure number and solution is in
# the PDF and that the Chinese fonts are embedded (pdffonts). Not part of `make test`.
pdf: $(STAMP)  ## the whole book as one PDF (after make book: nothing runs twice) -> _build/pdf/book.pdf
	bash scripts/install_browser_deps.sh
	$(BIN)/python scripts/book_pdf.py

# JupyterLab 4.4 + jupyterlab-myst 2.7 (requirements-lab.txt) in .venv. The pins of requirements.txt
# are constraints: pip stops rather than change one of them.
LAB_STAMP := $(VENV)/.lab.stamp

$(LAB_STAMP): requirements-lab.txt $(STAMP)
	grep -E '^[A-Za-z0-9_.-]+==' requirements.txt > $(VENV)/constraints.txt
	$(BIN)/python -m pip install $(PIP_ARGS) -r requirements-lab.txt -c $(VENV)/constraints.txt
	@touch $@

# A learner's JupyterLab on the repository (the chapters: right-click -> Open With -> Notebook).
lab: $(LAB_STAMP)  ## JupyterLab (4.4 + jupyterlab-myst) on the repository: open book/chNN_*.md as a notebook
	$(BIN)/jupyter-lab

# Each chapter opened in JupyterLab in headless Chromium, run top to bottom and checked: hidden
# cells collapsed, no raw directive, no error output (tests/jupyter/lab). LAB_CHAPTERS=... limits it.
lab-test: $(LAB_STAMP)  ## each chapter run in JupyterLab in headless Chromium
	bash scripts/install_browser_deps.sh
	OMP_NUM_THREADS=1 $(BIN)/pytest -p no:cacheprovider tests/jupyter/lab

# Each step stops the run on failure; the strict book build from a clean _build
# comes next to last, and the browser tests of that build last. The browser dependencies
# (Chromium, fonts-noto-cjk, ...) are installed first, before any page executes: the figures'
# Chinese labels need the font (the script also refreshes matplotlib's font cache).
test: $(STAMP)  ## everything CI runs: lint, unit, nbval, jupyter, strict book build, browser tests
	bash scripts/install_browser_deps.sh
	$(MAKE) --no-print-directory lint
	$(MAKE) --no-print-directory unit
	$(MAKE) --no-print-directory nbval
	$(MAKE) --no-print-directory jupyter
	$(MAKE) --no-print-directory lab-test
	$(MAKE) --no-print-directory book
	$(MAKE) --no-print-directory browser

# Benchmarks of the package against PyTorch's own modules (CPU by default, CUDA when
# present); writes bench/results/<device>.json and figures. Not part of `make test`.
# BENCH_ARGS, e.g. --nbval-junit _build/nbval.xml (reuse a report) or --skip-chapters.
bench: $(STAMP)  ## benchmarks (not part of make test) -> bench/results/
	$(BIN)/python -m bench.run --full $(BENCH_ARGS)

notebooks: $(STAMP)  ## .ipynb copies of the chapters and appendices with code -> _build/notebooks/
	@mkdir -p _build/notebooks
	@shopt -s nullglob; n=0; \
	for f in book/*.md; do \
	  grep -q '^kernelspec:' "$$f" || continue; \
	  out=_build/notebooks/$$(basename "$${f%.md}").ipynb; \
	  $(BIN)/jupytext --quiet --to ipynb --output "$$out" "$$f"; \
	  echo "$$f -> $$out"; n=$$((n + 1)); \
	done; \
	echo "make notebooks: $$n notebook(s) in _build/notebooks/"

check-chapter: $(STAMP)  ## strict build of one chapter: make check-chapter CH=book/chNN_x.md
	@test -n "$(CH)" || { echo "usage: make check-chapter CH=book/chNN_name.md [ARGS=--allow-missing-refs]"; exit 2; }
	$(BIN)/python scripts/check_chapter.py "$(CH)" $(ARGS)

# The Chinese corpus tc.load_text_corpus("zh") is the book's own prose: after editing a page, rewrite it
# (tests/test_zh_corpus.py fails while it is out of date).
zh-corpus: $(STAMP)  ## rewrite src/transformer_course/corpus/zh_book.txt from the prose of book/
	$(BIN)/python scripts/make_zh_corpus.py

clean:  ## remove build outputs (keeps .venv)
	rm -rf _build .pytest_cache .hypothesis .ruff_cache
	find . -path ./$(VENV) -prune -o \( -name __pycache__ -o -name .ipynb_checkpoints \) -type d -prune -exec rm -rf {} +

distclean: clean  ## clean, and remove .venv
	rm -rf $(VENV)

# Mutation testing (not part of `make test`): mutmut, pinned in requirements-mutation.txt and
# installed into .venv here, mutates the package modules named in MODULES and runs the unit tests
# against every mutant (a scratch copy under _build/mutation/work; the checkout is not touched).
# Score and surviving mutants -> _build/mutation/summary.md and summary.json.
#   make mutation MODULES="sampling training"      one or more modules of src/transformer_course
#   make mutation MODULES=masks TESTS=tests/test_masks.py   fewer tests: faster, maybe a lower score
MODULES ?= attention masks positional norms blocks models sampling training
TESTS   ?=
MUTATION_STAMP := $(VENV)/.mutation.stamp

$(MUTATION_STAMP): requirements-mutation.txt $(STAMP)
	$(BIN)/python -m pip install $(PIP_ARGS) -r requirements-mutation.txt
	@touch $@

.PHONY: mutation
mutation: $(MUTATION_STAMP)  ## mutation testing (MODULES=..., TESTS=...) -> _build/mutation/summary.md
	OMP_NUM_THREADS=1 $(BIN)/python scripts/mutation.py --jobs $(JOBS) --modules $(MODULES) \
	    $(if $(strip $(TESTS)),--tests $(TESTS))

# Code rot caught early (not part of `make test`): a scratch venv in _build/compat/venv with the
# newest torch, numpy, matplotlib and jupyter-book<2 the package index serves (the rest from
# requirements.txt), then the unit tests and nbval there. Report: _build/compat/report.md.
compat:  ## unit tests + nbval against the newest torch/numpy/matplotlib/jupyter-book<2 -> _build/compat/
	bash scripts/compat.sh $(PYTHON) $(JOBS) $(PIP_ARGS)
