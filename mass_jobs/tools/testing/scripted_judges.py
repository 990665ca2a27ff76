"""TEST FIXTURE — NEVER A PRODUCT PATH. Scripted judges: a panel for toy runs that has no model.

`HashVerdictJudge` answers every request with a valid structured verdict whose label (A, B or tie)
comes from a hash of the request's messages and seed: the same comparison gets the same answer in
every run (reruns and a second executor reproduce the report) while the panel sees a mix.

    python -m mass_jobs.tools.testing.scripted_judges 8601 8602     # what examples/paper-mini.yaml names
"""

from __future__ import annotations

import hashlib
import json
import sys
import threading

from mass_jobs.tools.testing.scripted_endpoint import Reply, ScriptedEndpoint


class HashVerdictJudge(ScriptedEndpoint):
    def __init__(self, port: int = 0):
        super().__init__(model="hash-judge", port=port)
        self.answers: list[str] = []  # labels in answer order, to tie stored verdicts to what was said
        self.asked: list[str] = []  # each request's digest, in order: which questions, however interleaved
        self.senders: dict[str, list[dict]] = {}  # digest -> each asking request's headers (who asked)

    def next_reply(self, headers: dict[str, str], body: dict) -> tuple[str, Reply]:
        request = json.dumps([body.get("messages"), body.get("seed")], sort_keys=True).encode()
        # (the label depends on the question only, never on who asked)
        digest = hashlib.sha256(request).digest()
        label = ("A", "B", "tie")[int.from_bytes(digest[:8], "big") % 3]
        with self._lock:
            self.answers.append(label)
            self.asked.append(digest.hex())
            self.senders.setdefault(digest.hex(), []).append(dict(headers))
        return "*", Reply.text(json.dumps({"winner": label, "rationale": f"scripted verdict {digest.hex()[:12]}"}))


def main(argv: list[str]) -> int:
    if not argv or not all(a.isdigit() for a in argv):
        print("usage: python -m mass_jobs.tools.testing.scripted_judges PORT [PORT ...]", file=sys.stderr)
        return 2
    judges = [HashVerdictJudge(int(p)).start() for p in argv]
    print("TEST FIXTURE scripted judges (no model) at " + " ".join(j.base_url for j in judges), flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    for j in judges:
        j.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
