"""What is not a step: benchmarks (`bench`, `bench_serve`, `benchmark`), studies over finished runs
(`analysis`) and the test fixtures that ship with the package (`testing`: scripted endpoints)."""
