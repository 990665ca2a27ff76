"""One pure core per step of a generation: search, collect, guard, rank, render_sft (with `sft_threads`
and `sft_tokens`), train, select, merge, evaluate (with `select_panel`) and report. Each takes a
RunContext and its inputs, writes its outputs through Steps in the store and is resumable; the CLI in
`commands` and the executors in `pipeline` and `k8s` only call it."""
