# Step pods of the Argo templates (validate, search, collect, guard, rank, render, select, merge,
# evaluate, report): the mass CLI on CPU torch. Build: make images (context = repository root).
# 3.11.14+: tarfile fixes of CVE-2025-4517 and CVE-2025-8194 (get_dir does not rely on them).
FROM python:3.11.14-slim-bookworm

ENV PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HOME=/tmp
RUN useradd --uid 1000 --create-home --shell /usr/sbin/nologin mass
WORKDIR /opt/mass-jobs
# torch first from the CPU index (the pyproject pin), then the project from pyproject.toml.
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0
COPY pyproject.toml ./
COPY mass_jobs ./mass_jobs
RUN pip install . && mass --help >/dev/null
USER 1000:1000
