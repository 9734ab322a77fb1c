# One image for every service of the edge (relay, transceiver, signaling, agent; the redis
# service too when the base has redis-server). docs/deployment.md, "docker-compose".
#
#   docker build -t voiceedge .                                   # official slim Python, PyPI
#   docker build --build-arg BASE=voiceedge-base:bookworm \
#                --build-arg OFFLINE=1 -t voiceedge .             # local Debian base, wheelhouse
#
# BASE: any Debian-like image with python3 >= 3.11 and its venv module. The C extensions (the
# relay's fast path and admission, the media plane, the impairment engine) compile at install
# time: gcc, the Python headers and those of OpenSSL, libsrtp2 and Opus must be there (the slim
# image gets them from apt below; scripts/base-image.sh puts them into voiceedge-base:bookworm).
# conntrack is for the compose stack's relay-conntrack guard (deploy/compose/conntrack_guard.py).
# OFFLINE=1: install only from deploy/compose/wheels/ (filled by `pip wheel` on the host;
# scripts/compose-test does it), for builds without a route to PyPI or a Debian mirror.
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}
ARG OFFLINE=
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 LANG=C.UTF-8 PATH=/opt/voiceedge/bin:$PATH
RUN if ! command -v gcc >/dev/null || ! command -v redis-server >/dev/null \
            || ! [ -x /usr/sbin/conntrack ] || ! [ -f /usr/include/openssl/evp.h ] \
            || ! [ -f /usr/include/srtp2/srtp.h ] || ! [ -f /usr/include/opus/opus.h ]; then \
        [ -z "$OFFLINE" ] || { echo "OFFLINE build: the base image needs gcc, the OpenSSL, libsrtp2 and Opus headers, redis-server and conntrack (scripts/base-image.sh)" >&2; exit 1; }; \
        apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev libssl-dev \
            libsrtp2-dev libopus-dev redis-server conntrack \
        && rm -rf /var/lib/apt/lists/*; \
    fi; \
    PY=$(command -v python3.11 || command -v python3); "$PY" -m venv /opt/voiceedge
COPY deploy/compose/wheels/ /wheels/
RUN if [ -n "$OFFLINE" ]; then \
        pip install -q --disable-pip-version-check --no-index --find-links /wheels 'setuptools>=74.1' wheel; \
    else pip install -q --disable-pip-version-check --upgrade 'setuptools>=74.1' wheel; fi
COPY pyproject.toml README.md /src/
COPY voiceedge /src/voiceedge
COPY services /src/services
COPY topology /src/topology
COPY scenarios /src/scenarios
COPY analysis /src/analysis
COPY bench /src/bench
RUN cd /src && if [ -n "$OFFLINE" ]; then \
        pip install -q --disable-pip-version-check --no-index --find-links /wheels --no-build-isolation .; \
    else pip install -q --disable-pip-version-check --no-build-isolation .; fi \
    && cd / && python -c 'import services.relay._fastpath' \
    && rm -rf /wheels /src /root/.cache
COPY deploy/compose/entrypoint.sh /usr/local/bin/voiceedge-entrypoint
COPY deploy/compose/conntrack_guard.py /usr/local/lib/voiceedge/conntrack_guard.py
WORKDIR /var/lib/voiceedge
ENTRYPOINT ["/usr/local/bin/voiceedge-entrypoint"]
CMD ["voiceedge", "--help"]
