"""The run as a whole: the step table every executor reads (`table.PIPELINE`), the local runner
(`runner`, `run_lease`, `progress`) and `mass plan`'s arithmetic (`planning`)."""
