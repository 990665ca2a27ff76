"""`mass plan SPEC`: what a run will do and need, from the spec and the model's config alone.

- `counts`: per generation, the episodes, model calls, SFT windows, steps and tokens the spec asks
  for (exact where the spec fixes them, an upper bound where the data decides), and the same
  numbers read back from a stored run.
- `memory`: training memory per GPU (weights, adapter, optimizer state, activations, logits) from
  the model's config instantiated on the meta device (no weights), with the LoRA targets the
  trainer would resolve.
- `schedule`: the pipeline table (`mass_jobs.pipeline.table.PIPELINE`) simulated as the Argo DAG runs it,
  against running every episode one after another, and drawn as a Gantt chart.

    mass plan examples/paper.yaml --config examples/qwen3.5-27b-config.json --gantt plan.png
"""
