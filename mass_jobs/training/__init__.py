"""LoRA SFT as `mass train` runs it under torchrun or a PyTorchJob: the window sampler (`sampler`:
task uniform, then orchestrator vs worker/auxiliary), LoRA setup (`lora`), the loss over masked
windows (`loss`), the LR schedule, data- or fully-sharded ranks (`dist`), resumable checkpoints and the
loop itself. Reads only the spec's typed sections; never the store or a step."""
