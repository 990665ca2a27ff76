"""Holds mass_policy.py, the policy host every sandboxed Python finds on its PYTHONPATH (mass_jobs/sandbox/run.py POLICY_SITE)."""
