# syntax=docker/dockerfile:1
#
# Two images from one file, each with only its own extra installed:
#
#   docker build --target operator -t neuronfleet/operator:0.1.0 .   # kopf + kubernetes, no vLLM
#   docker build --target engine   -t neuronfleet/engine:0.1.0 .     # vLLM + the Neuron scheduler
#
# ENGINE_BASE is the engine's base image. The default (plain Python) has no Neuron runtime: it runs
# only the simulated Neuron device (`serve --device sim`), and the operator's compile and serving pods,
# which use the Neuron device, refuse to start on it with one line saying so. For Neuron hosts build
# on the AWS Neuron deep learning container for vLLM inference, which brings the Neuron runtime,
# neuronx-cc and the vLLM Neuron plugin (its Python must be 3.11+):
#
#   docker build --target engine --build-arg ENGINE_BASE=<Neuron DLC image:tag> -t neuronfleet/engine:0.1.0 .
#
# The environment sees the base image's packages (--system-site-packages), so the DLC's Neuron
# packages stay importable. Builds run `uv sync --locked`: the images get exactly uv.lock.
# Each image's environment is two layers: the dependencies, installed from the lock alone, then the
# project, installed from its sources. A source change rebuilds only the project's small layer; the
# dependencies' layer is reused as it is, with the same digest.
# The engine's environment (about 10 GB: PyTorch and CUDA) is installed in its final stage, with uv
# and the sources mounted from throwaway stages, so no build copies it from one stage to another.
#
# NEURONFLEET_LOCK_DIGEST and NEURONFLEET_SOURCES_DIGEST are for builders whose layer cache does not
# hash what a RUN step mounts (buildah: `podman build --layers`, what `make images` runs): a digest of
# what each install reads (of the lock stage's files, what uv resolves from; the sources and the lock
# stage's files whole), declared just before it, keys the step, so a change misses the cache.
# BuildKit hashes mounts itself: leave them unset.

ARG PYTHON_BASE=python:3.11-slim-bookworm
ARG ENGINE_BASE=${PYTHON_BASE}

# ---- throwaway stages: uv, the lock, the sources ----

FROM ${PYTHON_BASE} AS uv-install
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3 -m venv /opt/uv && /opt/uv/bin/pip install --no-cache-dir uv==0.13.8

# Copied, not installed here: buildah 1.28 (podman build --layers) has mounted this stage without the
# files of its cached RUN ("couldn't find .../opt/uv"); a stage that RUN --mount reads ends in a COPY.
FROM ${PYTHON_BASE} AS uv
COPY --from=uv-install /opt/uv /opt/uv

FROM ${PYTHON_BASE} AS lock
COPY pyproject.toml uv.lock /src/
# The workspace's other member (the dev harness): uv reads its metadata; no image installs it.
COPY devcluster/pyproject.toml /src/devcluster/

FROM lock AS sources
# Only building the project reads the readme (its metadata): an edit leaves the dependencies' layer.
COPY README.md /src/
COPY engine /src/engine
COPY operator /src/operator

# ---- the operator: built in its own stages, the environment copied out as two layers ----

FROM uv AS operator-deps
ENV UV_COMPILE_BYTECODE=1 UV_LINK_MODE=copy UV_PYTHON_DOWNLOADS=never UV_PROJECT_ENVIRONMENT=/opt/neuronfleet
ARG UV_CACHE_DIR=/root/.cache/uv
ARG NEURONFLEET_LOCK_DIGEST
# Dependencies first, from the lock alone, so a source change does not reinstall them.
RUN --mount=type=bind,from=lock,source=/src,target=/src \
    --mount=type=cache,target=/root/.cache/uv \
    /opt/uv/bin/uv sync --project /src --locked --no-dev --extra operator --no-install-project

FROM operator-deps AS operator-build
ARG UV_CACHE_DIR=/root/.cache/uv
ARG NEURONFLEET_SOURCES_DIGEST
WORKDIR /opt/neuronfleet
# The project as a wheel (the mount is writable: the build writes beside the sources), then its own
# files (package, metadata, scripts) set apart in /project for a layer of their own; the build fails
# if the wheel installed anything else.
RUN --mount=type=bind,from=sources,source=/src,target=/src,rw \
    --mount=type=cache,target=/root/.cache/uv \
    /opt/uv/bin/uv sync --project /src --locked --no-dev --extra operator --no-editable \
    && ! grep -Ev '^(neuronfleet/|neuronfleet-[^/]+\.dist-info/|\.\./\.\./\.\./bin/neuronfleet-)' \
        lib/python3*/site-packages/neuronfleet-*.dist-info/RECORD \
    && mkdir /project \
    && cp -a --parents bin/neuronfleet-* lib/python3*/site-packages/neuronfleet \
        lib/python3*/site-packages/neuronfleet-*.dist-info /project/

FROM ${PYTHON_BASE} AS operator
# The dependencies, then the project: a source change replaces only the second, small layer.
COPY --from=operator-deps /opt/neuronfleet /opt/neuronfleet
COPY --from=operator-build /project/ /opt/neuronfleet/
ENV PATH=/opt/neuronfleet/bin:${PATH} HOME=/tmp PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
# Numeric, so Kubernetes can check runAsNonRoot without reading /etc/passwd.
USER 1000:1000
# Liveness (kopf) and the operator's metrics, where the Helm chart puts them.
EXPOSE 8080 9090
ENTRYPOINT ["neuronfleet-operator"]
# The Helm chart passes the full command line (liveness endpoint, metrics port, namespaces).
CMD ["run"]

# ---- the engine: installed in place, uv and the sources only mounted (no uv, cache or sources kept) ----

FROM ${ENGINE_BASE} AS engine
ENV UV_COMPILE_BYTECODE=1 UV_LINK_MODE=copy UV_PYTHON_DOWNLOADS=never UV_PROJECT_ENVIRONMENT=/opt/neuronfleet
# Where uv keeps downloads: a cache mount here; a builder may point it at a mounted cache of its own.
ARG UV_CACHE_DIR=/root/.cache/uv
ARG NEURONFLEET_LOCK_DIGEST
# Dependencies first, from the lock alone, so a source change does not reinstall them.
RUN --mount=type=bind,from=uv,source=/opt/uv,target=/opt/uv \
    --mount=type=bind,from=lock,source=/src,target=/src \
    --mount=type=cache,target=/root/.cache/uv \
    /opt/uv/bin/uv venv --system-site-packages /opt/neuronfleet \
    && /opt/uv/bin/uv sync --project /src --locked --no-dev --extra engine --no-install-project
ARG NEURONFLEET_SOURCES_DIGEST
# The project as a wheel; the mount is writable because the build writes beside the sources (discarded).
RUN --mount=type=bind,from=uv,source=/opt/uv,target=/opt/uv \
    --mount=type=bind,from=sources,source=/src,target=/src,rw \
    --mount=type=cache,target=/root/.cache/uv \
    /opt/uv/bin/uv sync --project /src --locked --no-dev --extra engine --no-editable
ENV PATH=/opt/neuronfleet/bin:${PATH} HOME=/tmp PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
# The operator's pods run as 1000:1000 (neuronfleet.operator.plan.RUN_AS).
USER 1000:1000
EXPOSE 8000
ENTRYPOINT ["neuronfleet-engine"]
# The operator always passes the command (compile or serve) and its arguments.
CMD ["--help"]
