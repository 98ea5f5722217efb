"""Library behind bench/bench: the benchmark matrix, the runner, the report.

Every bench script (bench/bench, bench/bench-cpu, bench/bench-verify,
bench/bench-warm) imports benchlib first: it sits beside them, so Python
finds it without help, and it makes the test harness tests/lib importable as the package
``lib``, as the tests import it (``from lib.digest import sha256_file``).
This is the one place that knows where tests/ lies.

matrix    what to run: arms, sources, servers, latencies, presets (data only)
procs     child processes: spawn, timed wait with rusage, cleanup on exit
sources   source images on tmpfs, with their sha256
runner    one run: fresh server, mount, copy, unmount, verify, stats
report    markdown tables, machine description, nbdkit stats parsing
plot      throughput-vs-latency PNGs (matplotlib)
"""

import sys
from pathlib import Path

TOP = Path(__file__).resolve().parents[2]               # the source tree
if str(TOP / "tests") not in sys.path:
    sys.path.insert(0, str(TOP / "tests"))
