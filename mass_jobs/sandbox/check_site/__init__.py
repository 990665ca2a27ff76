"""Holds the sitecustomize.py that guard checks start Python with (mass_jobs/sandbox/check_job.py CHECK_ENV)."""
