#!/usr/bin/env bash
# Entrypoint of the horovod_prio image: the Keras setting for this image's TF,
# then the command (default: make run). Lives in the image at /opt/horovod_prio/docker/.
. /usr/local/lib/horovod_prio/keras-env.sh
exec "$@"
