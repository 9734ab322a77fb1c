#!/bin/sh
# Entrypoint of the voiceedge image: the ufrag secret from a compose secret (a file) into the
# environment the relay and transceivers read, then the command.
#   VOICEEDGE_UFRAG_SECRET_FILE  file holding the secret (default /run/secrets/ufrag_secret)
set -e
f=${VOICEEDGE_UFRAG_SECRET_FILE:-/run/secrets/ufrag_secret}
if [ -z "$VOICEEDGE_UFRAG_SECRET" ] && [ -r "$f" ]; then
    VOICEEDGE_UFRAG_SECRET=$(tr -d '\n' < "$f")
    export VOICEEDGE_UFRAG_SECRET
fi
exec "$@"
