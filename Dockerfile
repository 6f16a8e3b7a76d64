# The agent's image: built in one stage, run as non-root on a read-only root filesystem.
#   docker build -t multicluster-scheduler .
# BASE_IMAGE: any image with Python >= 3.11 and pip on its PATH (`./dev image` builds one with
# Debian's Python when no Docker daemon can pull this one).
ARG BASE_IMAGE=python:3.12-slim
FROM ${BASE_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY multicluster multicluster
COPY multicluster_scheduler multicluster_scheduler
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM ${BASE_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels \
    && groupadd --gid 65532 agent && useradd --uid 65532 --gid 65532 --no-create-home agent
USER 65532:65532
ENTRYPOINT ["multicluster-scheduler"]
CMD ["agent"]
