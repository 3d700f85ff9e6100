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

ARG PYTHON_BASE=python:3.11-slim-bookworm
ARG ENGINE_BASE=${PYTHON_BASE}

# ---- build stages: uv, the locked dependencies, the project as a wheel (not editable) ----

FROM ${PYTHON_BASE} AS operator-build
ENV UV_COMPILE_BYTECODE=1 UV_LINK_MODE=copy UV_PYTHON_DOWNLOADS=never \
    UV_PROJECT_ENVIRONMENT=/opt/neuronfleet PIP_DISABLE_PIP_VERSION_CHECK=1
RUN pip install --no-cache-dir uv==0.13.8
WORKDIR /src
# Dependencies first, so a source change does not reinstall them.
COPY pyproject.toml uv.lock README.md ./
RUN uv sync --locked --no-dev --extra operator --no-install-project
COPY engine engine
COPY operator operator
COPY devcluster devcluster
RUN uv sync --locked --no-dev --extra operator --no-editable

FROM ${ENGINE_BASE} AS engine-build
ENV UV_COMPILE_BYTECODE=1 UV_LINK_MODE=copy UV_PYTHON_DOWNLOADS=never \
    UV_PROJECT_ENVIRONMENT=/opt/neuronfleet PIP_DISABLE_PIP_VERSION_CHECK=1
RUN pip install --no-cache-dir uv==0.13.8
WORKDIR /src
COPY pyproject.toml uv.lock README.md ./
RUN uv venv --system-site-packages /opt/neuronfleet \
    && uv sync --locked --no-dev --extra engine --no-install-project
COPY engine engine
COPY operator operator
COPY devcluster devcluster
RUN uv sync --locked --no-dev --extra engine --no-editable

# ---- final stages: the base image plus the environment; no uv, pip cache or sources ----

FROM ${PYTHON_BASE} AS operator
COPY --from=operator-build /opt/neuronfleet /opt/neuronfleet
ENV PATH=/opt/neuronfleet/bin:${PATH} HOME=/tmp PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
# Numeric, so Kubernetes can check runAsNonRoot without reading /etc/passwd.
USER 1000:1000
# Liveness (kopf) and the operator's metrics, where the Helm chart puts them.
EXPOSE 8080 9090
ENTRYPOINT ["neuronfleet-operator"]
# The Helm chart passes the full command line (liveness endpoint, metrics port, namespaces).
CMD ["run"]

FROM ${ENGINE_BASE} AS engine
COPY --from=engine-build /opt/neuronfleet /opt/neuronfleet
ENV PATH=/opt/neuronfleet/bin:${PATH} HOME=/tmp PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
# The operator's pods run as 1000:1000 (neuronfleet.operator.plan.RUN_AS).
USER 1000:1000
EXPOSE 8000
ENTRYPOINT ["neuronfleet-engine"]
# The operator always passes the command (compile or serve) and its arguments.
CMD ["--help"]
