"""The run as a whole: the step table (`table.PIPELINE`) and the compiled plan every executor reads
(`nodes`), the local runner and its node handlers (`runner`, `handlers`, `run_lease`, `progress`)
and `mass plan`'s arithmetic (`planning`)."""
