"""Analyses beyond the main loop: workflow information proxies (`information`), the local text embedder (`embed`)."""
