"""mass-jobs: MASS (Multi-Agent Self-Supervision) as declarative batch jobs, locally and on Kubernetes."""

__version__ = "0.1.0"
