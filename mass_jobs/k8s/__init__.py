"""Kubernetes for mass-jobs: the Argo compiler (hera), manifest builders and schema checks.

`mass render argo --out argo/` writes the WorkflowTemplates and the CronWorkflow;
`--manifests manifests/` and `--chart charts/mass-jobs/` write the plain objects and the Helm
chart templates from the same builders (see `codegen.py`).
"""
