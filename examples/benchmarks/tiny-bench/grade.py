"""Grader of tiny-bench: compares workspace/answer.txt with the task's reference.json; prints the score as JSON."""

import json
import os
from pathlib import Path

expected = json.loads((Path(os.environ["MASS_BENCH_TASK"]) / "reference.json").read_text())["answer"]
answer = Path(os.environ["MASS_BENCH_WORKSPACE"]) / "answer.txt"
if not answer.is_file():
    score = 0.0
else:
    score = 1.0 if answer.read_text().strip() == expected else 0.5
print(json.dumps({"score": score}))
