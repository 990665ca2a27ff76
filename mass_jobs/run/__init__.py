"""What one run knows about itself: its store keys (`context.RunContext`) and each generation's model
(`base_model` for L0, `generation_model` for its identity, directories and serving URI)."""
