# One image, several entrypoints (not built in CI here):
#   tracefleet operator ...                          the operator (Helm chart's Deployment)
#   tracefleet proxy ...                             the capture proxy (harness pods' native sidecar)
#   python -m tracefleet.runner.pod seal             sealer Jobs
#   python -m tracefleet.runner.pod evaluate         evaluator Jobs (when the job names no image)
#   tracefleet run ...                               local mode
# Harness images add their agent CLI on top:  FROM ghcr.io/tracefleet/tracefleet:0.1.0 + npm i -g @openai/codex
#
#   docker build -t ghcr.io/tracefleet/tracefleet:0.1.0 .
FROM python:3.11-slim AS build
WORKDIR /src
RUN pip install --no-cache-dir --upgrade pip wheel
COPY pyproject.toml setup.py README.md ./
COPY src ./src
COPY operator ./operator
COPY proxy ./proxy
COPY runner ./runner
COPY traces ./traces
COPY engine ./engine
RUN pip wheel --no-cache-dir --wheel-dir /wheels '.[operator]'

FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends git ca-certificates tini \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --gid 65532 tracefleet && useradd --uid 65532 --gid 65532 --create-home tracefleet
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
USER 65532:65532
ENV PYTHONUNBUFFERED=1 HOME=/home/tracefleet
EXPOSE 8080 8100 9090
ENTRYPOINT ["tini", "--"]
CMD ["tracefleet", "operator", "--all-namespaces"]
