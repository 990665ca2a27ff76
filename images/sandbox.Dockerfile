# Agent pods: the harness container (`mass episode --in /in --out /out --sandbox ... --qwen ...`,
# uid 1000), the sandbox sidecar (`mass sandbox-serve`, uid 2000: tools, shell commands) and the
# qwen-code sidecar (`mass sandbox-serve --qwen-only`, uid 3000) with Python, Node and qwen-code, as
# non-root users with passwd entries (node's os.userInfo() fails without one);
# Argo mounts /in, /out and emptyDirs (the root filesystem is read-only).
# Build: make images (context = repository root).
FROM node:20.18.1-bookworm-slim AS node
RUN npm install --global --no-audit --no-fund @qwen-code/qwen-code@0.15.10

# 3.11.14+: tarfile fixes of CVE-2025-4517 and CVE-2025-8194 (get_dir does not rely on them).
FROM python:3.11.14-slim-bookworm
ENV PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HOME=/tmp MASS_QWEN_BIN=/usr/local/bin/qwen
# bubblewrap: shell commands get their own filesystem view where the pod allows user namespaces;
# elsewhere the sandbox says so in each status.json and the pod is the boundary.
RUN apt-get update && apt-get install -y --no-install-recommends bubblewrap && rm -rf /var/lib/apt/lists/*
COPY --from=node /usr/local/bin/node /usr/local/bin/node
COPY --from=node /usr/local/lib/node_modules /usr/local/lib/node_modules
RUN ln -s /usr/local/lib/node_modules/@qwen-code/qwen-code/cli.js /usr/local/bin/qwen \
 && ln -s /usr/local/lib/node_modules/npm/bin/npm-cli.js /usr/local/bin/npm \
 && useradd --uid 1000 --create-home --shell /usr/sbin/nologin agent \
 && useradd --uid 2000 --user-group --home-dir /tmp --no-create-home --shell /usr/sbin/nologin sandbox \
 && useradd --uid 3000 --user-group --home-dir /tmp --no-create-home --shell /usr/sbin/nologin qwen
WORKDIR /opt/mass-jobs
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0
COPY pyproject.toml ./
COPY mass_jobs ./mass_jobs
RUN pip install . && mass episode --help >/dev/null && mass sandbox-serve --help >/dev/null \
 && python3 mass_jobs/episodes/qwen_patch.py /usr/local/lib/node_modules/@qwen-code/qwen-code/cli.js \
 && node --version && qwen --version
USER 1000:1000
WORKDIR /tmp
