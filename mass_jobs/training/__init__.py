"""LoRA SFT internals used by `mass train`: LoRA setup, LR schedule, checkpoints and the training loop."""
