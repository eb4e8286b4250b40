# Docker image + test matrix (issue 6). Included at the end of the Makefile.
#   make docker-base    local Debian bookworm base (debootstrap + docker import)
#   make docker-build   build the image of each TF in DOCKER_TFS
#   make docker-test    build each image, run `make test` in every TF x controller cell
#   make docker-run     run the main job (`make run`) in the image of $(TF)
# Starts dockerd (Debian docker.io) when no daemon answers. See docs/docker.md.
DOCKER_TFS ?= 2.15.1 2.16.2 2.17.1 2.18.1 2.19.1 2.21.0
DOCKER_CONTROLLERS ?= gloo mpi
BASE_IMAGE ?= python:3.11-slim
LOCAL_BASE_IMAGE ?= horovod-prio/base:bookworm
DOCKER_ENV = DOCKER_TFS='$(DOCKER_TFS)' DOCKER_CONTROLLERS='$(DOCKER_CONTROLLERS)' \
	BASE_IMAGE='$(BASE_IMAGE)' LOCAL_BASE_IMAGE='$(LOCAL_BASE_IMAGE)' PYTEST_ARGS='$(PYTEST_ARGS)'

.PHONY: docker-base docker-build docker-test docker-run
docker-base:
	@$(DOCKER_ENV) bash docker/matrix.sh base

docker-build:
	@$(DOCKER_ENV) bash docker/matrix.sh build

docker-test:
	@$(DOCKER_ENV) bash docker/matrix.sh test

docker-run:
	@$(DOCKER_ENV) bash docker/matrix.sh run $(TF)
