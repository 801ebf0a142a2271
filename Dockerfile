# The gpuledger services (scheduler, projector, clock, binder, console) for compose.yaml.
# The console's chart library comes from the npm registry in a build stage of its own
# (scripts/console-assets.sh), so the runtime image carries its file but no node.
FROM node:20-slim AS console-assets
WORKDIR /src
COPY scripts/console-assets.sh scripts/
RUN bash scripts/console-assets.sh

FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY events events
COPY scheduler scheduler
COPY projections projections
COPY replay replay
COPY --from=console-assets /src/projections/console/static/vendor projections/console/static/vendor
RUN pip install --no-cache-dir .
# gpuledger serve --listen 0.0.0.0:8080 (with --token or $GPULEDGER_TOKEN)
EXPOSE 8080
ENTRYPOINT ["gpuledger"]
