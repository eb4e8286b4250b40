# Sourced (with TF set): Keras 2 on TF >= 2.16 comes from tf_keras and needs
# TF_USE_LEGACY_KERAS=1; on TF <= 2.15 that variable makes tf.keras look for
# tf_keras too, so it is left unset there unless the caller set it.
case "${TF:-}" in
  2.1[0-5].*|2.[0-9].*) ;;
  *) export TF_USE_LEGACY_KERAS="${TF_USE_LEGACY_KERAS:-1}" ;;
esac
