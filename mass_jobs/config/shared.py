"""What every typed model of the project shares: objects closed to unknown keys, the id and URL
shapes, and upper bounds on budgets."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

ID_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"  # DNS-label shaped: ids become k8s labels and S3 keys
URL = r"^https?://[^\s/?#]+[^\s]*$"
URL_OR_LOCAL = r"^(local|https?://[^\s/?#]+[^\s]*)$"
# Upper bounds on budgets: far above any real run, far below what exhausts a cluster or overflows a seed.
MAX_EPISODES = 10_000
MAX_RETRIES = 100
MAX_STEPS = 10_000_000
MAX_TOKENS = 1 << 24
MAX_SEED = 2**32 - 1
DAY_S = 86_400


class Closed(BaseModel):
    """Unknown keys are errors everywhere (a typo must never silently fall back to a default)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
