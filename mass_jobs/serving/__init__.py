"""Models as endpoints: where a model's weights are (`model_dirs`, `pretrained`; `shards`, read and
written shard by shard), how they are served
(`serve`, the embedded OpenAI-compatible server, and its `prefix_cache`; `backends`, embedded or vLLM; `precision`, `fp8`,
`tool_parsers`), how they are called (`llm.ModelClient`, `roles`: which model plays which role) and
recorded (`proxy`, `proxy_records`)."""
