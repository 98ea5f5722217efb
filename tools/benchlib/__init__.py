"""Library behind tools/bench: the benchmark matrix, the runner, the report.

matrix    what to run: arms, sources, servers, latencies, presets (data only)
procs     child processes: spawn, timed wait with rusage, cleanup on exit
sources   source images on tmpfs, with their sha256
runner    one run: fresh server, mount, copy, unmount, verify, stats
report    markdown tables, machine description, nbdkit stats parsing
plot      throughput-vs-latency PNGs (matplotlib)
"""
