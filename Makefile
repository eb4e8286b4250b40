# horovod_prio — the two commands are `make run` and `make test`.
TF ?= 2.15.1
ifeq ($(TF),2.15.1)
VENV ?= .venv
else
VENV ?= .venv-tf$(TF)
# Keras 2 on TF >= 2.16 comes from tf_keras (TF 2.15 has no tf_keras: don't set it there).
export TF_USE_LEGACY_KERAS := 1
endif
BIN := $(VENV)/bin
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
export PATH := $(CURDIR)/$(BIN):$(PATH)
PYTEST_ARGS ?=

.PHONY: install test run bench clean conformance
install:
	@bash tools/install.sh $(VENV) $(TF)

# make test has just installed the stack: a missing piece fails the run (never a skip).
test: install
	HOROVOD_PRIO_REQUIRE_STACK=1 $(BIN)/python -m pytest $(PYTEST_ARGS)

# Horovod 0.28.1's own TensorFlow suites, as shipped and with the import swapped, under
# horovodrun -np 2 (Gloo and MPI). Their files come from a Horovod source tree
# (a checkout or its git directory with tag v0.28.1): HOROVOD_SRC=...
HOROVOD_SRC ?=
conformance: install
	@test -n "$(HOROVOD_SRC)" || { echo "make conformance HOROVOD_SRC=<a Horovod checkout or git dir with tag v0.28.1>" >&2; exit 2; }
	$(BIN)/python tools/horovod_tests.py --src "$(HOROVOD_SRC)" $(CONFORMANCE_ARGS)

run: install
	$(BIN)/python -m horovod_prio.examples.run_default

# The README's headline matrix (about 28 min, measured; BENCH_ARGS=--quick: a few minutes). Needs root.
BENCH_ARGS ?=
bench: install
	$(BIN)/python -m benchmarks.headline $(BENCH_ARGS)

clean:
	rm -rf build *.egg-info horovod_prio/scheduler/*.so horovod_prio/tensorflow/kernels/*.so \
	  $(VENV)/.stamps/prio-*

include docker/docker.mk
