# Sourced by the RUN steps of docker/Dockerfile. Points pip and apt at the
# settings passed in as build secrets (see the Dockerfile header); with no
# secrets it changes nothing, so the image builds anywhere with the defaults.
s=/run/secrets
if [ -s "$s/pipconf" ]; then export PIP_CONFIG_FILE="$s/pipconf"; fi
if [ -s "$s/cacert" ]; then
  export PIP_CERT="$s/cacert" SSL_CERT_FILE="$s/cacert" REQUESTS_CA_BUNDLE="$s/cacert" CURL_CA_BUNDLE="$s/cacert"
fi
if [ -s "$s/aptconf" ]; then export APT_CONFIG="$s/aptconf"; fi
unset s
