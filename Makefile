# jaxformer: set-up, tests and the paper's recipes. `make help` lists the targets.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

# Which jax build the venv gets: cpu, cuda12 or cuda13 (extras of pyproject.toml). By default the
# CUDA build on a host where nvidia-smi answers (CUDA 13 from driver 580 on, else CUDA 12), the
# CPU build elsewhere; JAX_EXTRA=... overrides. A venv built for another kind is rebuilt.
ifeq ($(origin JAX_EXTRA),undefined)
JAX_EXTRA := $(shell driver=$$(nvidia-smi --query-gpu=driver_version --format=csv,noheader \
  2>/dev/null | head -n 1); if [ -z "$$driver" ]; then echo cpu; \
  elif [ "$${driver%%.*}" -ge 580 ] 2>/dev/null; then echo cuda13; else echo cuda12; fi)
endif
ifeq ($(filter $(JAX_EXTRA),cpu cuda12 cuda13),)
$(error JAX_EXTRA must be cpu, cuda12 or cuda13, got '$(JAX_EXTRA)')
endif
STAMP := $(VENV)/.installed-$(JAX_EXTRA)
OTHER_BUILD := $(filter-out $(STAMP),$(wildcard $(VENV)/.installed-*))

# glibc's malloc backs its large blocks with transparent huge pages (where the kernel allows
# them: THP 'always' or 'madvise'). On 4 KB pages `make demo` took 47M page faults, 97% of them
# on malloc's blocks, which glibc maps afresh as they are allocated, and its time in the kernel
# was a third of its user time. Older glibc ignores the setting; a GLIBC_TUNABLES of your own is
# kept. docs/BENCHMARKS.md has the measurements.
export GLIBC_TUNABLES ?= glibc.malloc.hugetlb=1

.PHONY: help install jax-extra lint docs test test-fast check-core-install demo train-base train-big train-multi30k eval bench \
  gpu-check clean

help:
	@echo "make test        set up $(VENV) (if needed) and run the whole test suite"
	@echo "make test-fast   the tests not marked slow"
	@echo "make check-core-install  the core install (no TensorFlow) in a fresh venv of its own:"
	@echo "                 it installs, imports, trains the demo's short run and translates"
	@echo "make lint        ruff with the house rules (pyproject.toml): no finding allowed"
	@echo "make docs        the documentation site (Sphinx, warnings as errors) in docs/_build/html"
	@echo "make demo        offline end-to-end demo on the embedded corpus (WORKDIR=, DEMO_STEPS=)"
	@echo "make train-base  the paper's base recipe on WMT14 EN-DE (WORKDIR=, TFDS_DATA_DIR=, ARGS=)"
	@echo "make train-big   the paper's big recipe on WMT14 EN-DE (WORKDIR=, TFDS_DATA_DIR=, ARGS=)"
	@echo "make train-multi30k  Multi30k EN-DE on CPU, then BLEU on test_2016_flickr (DATA_DIR=)"
	@echo "make eval        BLEU on newstest2014 (WORKDIR=, AVERAGE_LAST=, TFDS_DATA_DIR=, ARGS=)"
	@echo "make bench       benchmarks (data, train step + MFU, memory, checkpoints, decoding) as JSON"
	@echo "make gpu-check   a new host's first command: device line, then fast path, training,"
	@echo "                 decoding and checkpoints checked on it, as a pass/fail table"
	@echo "make jax-extra   print the jax build make installs here (JAX_EXTRA=cpu|cuda12|cuda13)"
	@echo "make install     set up $(VENV) with jaxformer, its tests' tools and that jax build"
	@echo "make clean       remove $(VENV) and the build outputs"

# $(call install_wheels,VENV,EXTRAS): jaxformer with those extras. pip resolves, downloads and
# builds the wheels, so that pip's configuration holds (index, certificates, constraints, local
# wheel folders); then uv, which pip fetches into a working folder (not into the venv), installs
# them from that folder alone: it unpacks and byte-compiles on every core, where pip takes one file
# after another (docs/BENCHMARKS.md, "Data, memory and checkpoints"). The bytecode is written at
# install because a process may not write it (PYTHONDONTWRITEBYTECODE), and would then compile
# every module it imports. By name, not by file, so that `pip freeze` names versions, not the
# folder. The folder (wheels, uv's unpacked cache) lies beside the venv, on its disk: the venv's
# files are then links to the cache's, not copies, and a small /tmp does not have to hold them.
define install_wheels
$(1)/bin/python -m pip install --quiet --upgrade pip
tmp=$$(mktemp -d '$(1).install.XXXXXX') && trap 'rm -rf "$$tmp"' EXIT && \
  $(1)/bin/python -m pip install --quiet --target "$$tmp/uv" uv && \
  $(1)/bin/python -m pip wheel --quiet --wheel-dir "$$tmp/wheels" '.[$(2)]' && \
  "$$tmp/uv/bin/uv" pip install --quiet --cache-dir "$$tmp/cache" --python $(1)/bin/python \
    --no-index --find-links "$$tmp/wheels" --compile-bytecode 'jaxformer[$(2)]'
endef

DEV_EXTRAS = test,docs,wmt,$(JAX_EXTRA)
# The venv is (re)installed when pyproject.toml changes, and rebuilt from scratch when it holds
# another jax build than JAX_EXTRA's. jaxformer itself is then installed editable over its wheel,
# and its modules byte-compiled where they lie, as uv compiled every other package's: an
# editable install writes no bytecode, so where a process may not (PYTHONDONTWRITEBYTECODE) each
# command would compile them all; a module edited since is read from its source (Python checks
# each file's time and size).
$(STAMP): pyproject.toml
	$(if $(OTHER_BUILD),@echo "$(VENV) holds jax's $(patsubst $(VENV)/.installed-%,%,$(OTHER_BUILD)) build: rebuilding it for $(JAX_EXTRA)")
	$(if $(OTHER_BUILD),rm -rf $(VENV))
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(call install_wheels,$(VENV),$(DEV_EXTRAS))
	$(PY) -m pip install --quiet --no-deps -e .
	$(PY) -m compileall -q jaxformer
	touch $(STAMP)

install: $(STAMP)

jax-extra:
	@echo $(JAX_EXTRA)

# Two pytest workers (pytest-xdist), one per core, each running whole test files, the longest
# files first (tests/conftest.py). A third worker, to fill the waits on subprocesses and the
# network, made the run slower on 2 cores: the tests and the processes they start then share
# the cores three ways (docs/benchmarks-log.md, "The test suite's time: gpu-check and the
# demo-sized model").
test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=10

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# The guides (MyST markdown) and the API reference from the docstrings; a warning (a broken
# reference, a public name without a docstring) is an error.
docs: $(STAMP)
	$(VENV)/bin/sphinx-build -E -a -W --keep-going -q -b html docs docs/_build/html

# The core install, as `pip install jaxformer` gives it: no TensorFlow (WMT14's extra, wmt, is
# not installed), in a fresh venv; CI runs it after the suite (.ci/run).
CORE_VENV ?= .venv-core
check-core-install:
	rm -rf $(CORE_VENV)
	$(PYTHON) -m venv $(CORE_VENV)
	$(call install_wheels,$(CORE_VENV),cpu)
	@if $(CORE_VENV)/bin/python -c 'import tensorflow' 2>/dev/null; then \
	  echo "the core install has TensorFlow"; exit 1; fi
	$(CORE_VENV)/bin/python -c 'import jaxformer.cli'
	dir=$$(mktemp -d) && cd $$dir && \
	  $(abspath $(CORE_VENV))/bin/python $(abspath experiments/demo.py) --workdir w \
	    --num-steps 6 --train-pairs 3000 --test-pairs 12 && \
	  echo "the red dog sleeps" | $(abspath $(CORE_VENV))/bin/jaxformer translate --model w && \
	  rm -rf $$dir

test-fast: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder -m 'not slow'

# The offline demo: generate the embedded corpus, train, average, score, plot (experiments/demo.py).
demo: WORKDIR ?= workdirs/demo
demo: $(STAMP)
	$(PY) experiments/demo.py --workdir $(WORKDIR) $(if $(DEMO_STEPS),--num-steps $(DEMO_STEPS)) $(ARGS)

# Shortcuts for the `jaxformer` command. The paper's recipes (jaxformer/recipes/*.py) stop at
# once, with the command that prepares WMT14, when tfds has not prepared it. ARGS passes more
# flags, e.g. ARGS="--accum-steps 8 --set model.dropout_rate=0.2". VARIANT=C3 trains a row of
# Table 3 (jaxformer/recipes/table3.py) instead.
JAXFORMER := $(VENV)/bin/jaxformer
train-base: WORKDIR ?= workdirs/$(or $(VARIANT),base)
train-big: WORKDIR ?= workdirs/$(or $(VARIANT),big)
TFDS_FLAG = $(if $(TFDS_DATA_DIR),--tfds-data-dir $(TFDS_DATA_DIR))
train-base train-big: $(STAMP)
	$(JAXFORMER) train --config $(subst train-,,$@) --workdir $(WORKDIR) $(TFDS_FLAG) \
	  $(if $(VARIANT),--variant $(VARIANT)) $(ARGS)

# BLEU of a trained workdir on tfds newstest2014 (ARGS="--src F --ref F" for local files).
eval: $(STAMP)
	@test -n "$(WORKDIR)" || { echo "make eval: set WORKDIR=, e.g. make eval WORKDIR=workdirs/base" >&2; exit 2; }
	$(JAXFORMER) eval --model $(WORKDIR) $(if $(AVERAGE_LAST),--average-last $(AVERAGE_LAST)) \
	  $(TFDS_FLAG) $(ARGS)

# Multi30k EN->DE on CPU (jaxformer/recipes/multi30k.py): train, then BLEU on test_2016_flickr
# with the checkpoints the run averaged (the last 5; fewer after a run shortened with ARGS), or
# its newest checkpoint where it averaged none (ARGS="--set train.average_last=0", or a run
# stopped by SIGTERM before its end, which exits 0: docs/training.md).
# Each file is read unpacked or as the Multi30k repository ships it (train.en.gz, ...).
DATA_DIR ?= ../shared/data/multi30k
m30k = $(firstword $(wildcard $(DATA_DIR)/$(1) $(DATA_DIR)/$(1).gz) $(DATA_DIR)/$(1))
train-multi30k: WORKDIR ?= workdirs/multi30k
train-multi30k: $(STAMP)
	$(JAXFORMER) train --config multi30k --workdir $(WORKDIR) \
	  --train-src $(call m30k,train.en) --train-tgt $(call m30k,train.de) \
	  --eval-src $(call m30k,val.en) --eval-tgt $(call m30k,val.de) $(ARGS)
	$(JAXFORMER) eval --model "$$(ls -d $(WORKDIR)/average-last* 2>/dev/null | sort -V | \
	  tail -n 1 | grep . || echo $(WORKDIR))" \
	  --src $(call m30k,test_2016_flickr.en) --ref $(call m30k,test_2016_flickr.de)

# Real corpora for benchmarks live beside the repository, never in it.
SHARED_DATA ?= ../shared/data
bench: $(STAMP)
	$(PY) experiments/bench --data-dir $(SHARED_DATA) $(ARGS)

# A new host's first command: the device line, then fused attention, its training on packed rows,
# bf16 training, decoding and checkpoints checked on jax's backend, as a pass/fail table (80 s
# on 2 CPU cores, with a one-layer model; on an H100 its first four rows took under 200 s).
gpu-check: $(STAMP)
	$(PY) experiments/gpu_check.py $(ARGS)

clean:
	rm -rf $(VENV) $(CORE_VENV) .pytest_cache build *.egg-info docs/_build
