"""The expensive models the suite shares, built before the tests (`make test-models`, part of `make test`).

The warm tiny model ships built (models/tiny-warm); this rebuilds it only when its key (seed, builder
version) no longer matches, with its progress on the console (5 minutes on 2 cores): built inside the
suite it was charged to whichever test asked first and ran beside other tests' processes.
"""

from __future__ import annotations

import sys

from tests.fixtures.warm_model import warm_dir


def main() -> int:
    from mass_jobs.pipeline.progress import clock, warm_printer
    from mass_jobs.tiny.warm import cached_build

    _, seconds = cached_build(warm_dir(), seed=0, on_step=warm_printer(every=300), say=lambda t: print(t, flush=True))
    if seconds is not None:
        print(f"warm tiny model built in {clock(seconds)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
