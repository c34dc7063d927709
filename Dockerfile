# One image per service: docker build --build-arg SERVICE=scheduler -t alnair/scheduler .
# Each image holds alnair-common and that one service (its own dependencies only).
FROM python:3.11-slim AS build
ARG SERVICE
RUN pip install --no-cache-dir uv
WORKDIR /src
COPY libs/common libs/common
COPY services/${SERVICE} services/${SERVICE}
RUN uv venv /opt/alnair && \
    VIRTUAL_ENV=/opt/alnair uv pip install --no-cache ./libs/common ./services/${SERVICE}

FROM python:3.11-slim
ARG SERVICE
ENV PATH=/opt/alnair/bin:$PATH SERVICE=${SERVICE}
COPY --from=build /opt/alnair /opt/alnair
USER 65532:65532
ENTRYPOINT ["sh", "-c", "exec python -m alnair.${SERVICE}"]
