"""The agent episode, the unit of the method: its input (`episode.EpisodeInput.from_spec`, episode.json),
its harnesses (`harness.run_episode`: `builtin`, `qwen_code`, their `tools` and `delegation`), the
sandbox container of an agent pod (`sandbox_service`, `sandbox_client`), the signed outputs (`proof`),
the trace it leaves (`threads`, `trace_shape`, `audit`) and the one protocol every step runs episodes by
(`rollouts`: prepare -> agent -> ingest, or the same episode run here)."""
