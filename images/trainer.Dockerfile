# PyTorchJob replicas: `torchrun --no-python mass train ...` on CUDA torch + peft (from pyproject).
# Build: make images (context = repository root).
# 3.11.14+: tarfile fixes of CVE-2025-4517 and CVE-2025-8194 (get_dir does not rely on them).
FROM python:3.11.14-slim-bookworm

ENV PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HOME=/tmp
RUN useradd --uid 1000 --create-home --shell /usr/sbin/nologin trainer
WORKDIR /opt/mass-jobs
# The CUDA 12.8 build of the pinned torch brings its CUDA libraries as wheels (no CUDA base image).
RUN pip install --index-url https://download.pytorch.org/whl/cu128 torch==2.13.0
COPY pyproject.toml ./
COPY mass_jobs ./mass_jobs
RUN pip install . && python -c "import peft, torch.distributed.run" && mass train --help >/dev/null
USER 1000:1000
