# The gpuledger services (scheduler, projector, clock, binder) for compose.yaml.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY events events
COPY scheduler scheduler
COPY projections projections
COPY replay replay
RUN pip install --no-cache-dir .
ENTRYPOINT ["gpuledger"]
