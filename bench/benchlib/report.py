"""Markdown report: machine, command, tables, ratios, raw runs.

bench/results/benchmarks-results.md may hold hand-written text (method, tuning
notes); the
bench replaces only what lies between BEGIN and END below.
"""

import os
import platform
import re
import statistics
import subprocess
import time

OLD_BEGIN = "<!-- BEGIN bench/bench output (regenerated; edit outside) -->"
OLD_END = "<!-- END bench/bench output -->"


def begin(preset):
    return (f"<!-- BEGIN bench/bench output, preset {preset} (regenerated; "
            f"edit outside) -->")


def end(preset):
    return f"<!-- END bench/bench output, preset {preset} -->"

_UNITS = {"bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30,
          "TiB": 1 << 40, "PiB": 1 << 50, "EiB": 1 << 60}
_STATS_RE = re.compile(r"^(\w+): (\d+) ops, ([\d.]+) s, ([\d.]+) (\w+)")


def parse_stats(path):
    """nbdkit-stats-filter output -> {op: {"ops": n, "bytes": b, "s": t}}."""
    out = {}
    try:
        with open(path) as f:
            for line in f:
                m = _STATS_RE.match(line)
                if m and m.group(1) != "total":
                    out[m.group(1)] = dict(
                        ops=int(m.group(2)), s=float(m.group(3)),
                        bytes=int(float(m.group(4)) * _UNITS.get(m.group(5), 1)))
    except OSError:
        pass
    return out


# ---- machine ------------------------------------------------------------

def _first_line(argv):
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=10)
        text = (r.stdout or r.stderr).strip()
        return text.splitlines()[0] if text else "?"
    except (OSError, subprocess.SubprocessError):
        return "not found"


def _lines(argv):
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=10)
        return (r.stdout + r.stderr).strip().splitlines()
    except (OSError, subprocess.SubprocessError):
        return []


def _git(repo, *args):
    """git's output lines, or None when git fails (no checkout)."""
    try:
        r = subprocess.run(["git", "-C", repo, *args], capture_output=True,
                           text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip().splitlines() if r.returncode == 0 else None


def machine(nbdferry):
    model = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem = "?"
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) // 1024 // 1024} GiB"
    nbdcopy = _lines(["nbdcopy", "--version"])
    libnbd = next((l for l in nbdcopy if l.startswith("libnbd")), "?")
    debian = "?"
    try:
        with open("/etc/debian_version") as f:
            debian = f.read().strip()
    except OSError:
        pass
    ferry = _first_line([nbdferry, "--version"]) if nbdferry else "not built"
    # bench/benchlib/report.py -> the repository's root.
    repo = os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))
    rev, dirty = _git(repo, "rev-parse", "--short", "HEAD"), None
    if rev is None:
        rev = "unknown: not run from a git checkout"
    else:
        rev = rev[0] if rev else "?"
        dirty = _git(repo, "status", "--porcelain", "--",
                     "daemon", "fs", "views", "digest", "transport",
                     "common")
    if dirty:
        rev += f"; {len(dirty)} uncommitted file(s) in the daemon's sources"
    return [
        ("CPU", f"{os.cpu_count()} x {model}"),
        ("memory", mem),
        ("kernel", platform.release()),
        ("Debian", debian),
        ("nbdkit", _first_line(["nbdkit", "--version"])),
        ("libnbd", libnbd),
        ("nbdfuse", _first_line(["nbdfuse", "--version"])),
        ("qemu-img", _first_line(["qemu-img", "--version"])),
        ("qemu-nbd", _first_line(["qemu-nbd", "--version"])),
        ("nbd-server", _first_line(["nbd-server", "-V"])),
        ("coreutils cp", _first_line(["cp", "--version"])),
        ("nbdferry", f"{ferry} (git {rev})"),
    ]


# ---- aggregation --------------------------------------------------------

def group(results):
    """{(exp, source, server, latency, arm): [results]} in first-seen order."""
    g = {}
    for r in results:
        g.setdefault((r["exp"], r["source"], r["server"], r["latency"],
                      r["arm"]), []).append(r)
    return g


# Daemon status fields shown in the details table: (JSON path, header, format).
# Dotted paths reach into nested objects; absent fields show as a dash.
DAEMON_KEYS = [
    ("writer_wait_s", "writers waiting s", ".2f"),
    ("nothing_in_flight_s", "nothing in flight s", ".2f"),
    ("in_flight_peak", "peak in flight", ".0f"),
    ("tcp.nagle_stall_samples", "TCP Nagle-stall samples", ".0f"),
    ("tcp.samples", "TCP samples", ".0f"),
]


def status_value(r, path):
    v = r.get("daemon_status") or {}
    for part in path.split("."):
        if not isinstance(v, dict) or part not in v:
            return None
        v = v[part]
    return v if isinstance(v, (int, float)) else None


def cell_summary(runs):
    ok = [r for r in runs if r["ok"]]
    s = dict(n=len(runs), ok=len(ok), label=runs[0]["label"])
    if not ok:
        return s
    mibs = [r["mibs"] for r in ok]
    s.update(min=min(mibs), med=statistics.median(mibs), max=max(mibs))
    secs = [r["seconds"] for r in ok]
    s.update(s_min=min(secs), s_max=max(secs))

    def med(key):
        v = [r[key] for r in ok if r.get(key) is not None]
        return statistics.median(v) if v else None

    for k in ("seconds", "cpu_client", "cpu_daemon", "cpu_server",
              "umount_seconds", "foreign_cpu"):
        s[k] = med(k)
    for k, _, _ in DAEMON_KEYS:
        v = [status_value(r, k) for r in ok]
        v = [x for x in v if x is not None]
        if v:
            s[k] = statistics.median(v)
    s["digest"] = digest_summary(ok)
    for op in ("write", "zero", "trim", "flush"):
        ops = [r["stats"].get(op, {}).get("ops", 0) for r in ok if r["stats"]]
        byt = [r["stats"].get(op, {}).get("bytes", 0) for r in ok if r["stats"]]
        if ops:
            s[op + "_ops"] = statistics.median(ops)
            s[op + "_bytes"] = statistics.median(byt)
    return s


def digest_state(r):
    """The inline digest's final state: settled by the runner, or (older
    runs) as the status showed it when the copy ended."""
    if r.get("digest_state"):
        return r["digest_state"]
    dg = (r.get("daemon_status") or {}).get("digest")
    return dg.get("state") if isinstance(dg, dict) else None


def digest_summary(runs):
    """'complete 3/3, = source, +0.4 s' etc.; '' when no run hashed."""
    states = [digest_state(r) for r in runs]
    states = [x for x in states if x and x != "disabled"]
    if not states:
        return ""
    parts = [f"{st} {states.count(st)}/{len(runs)}"
             for st in dict.fromkeys(states)]
    match = [r.get("digest_match") for r in runs
             if r.get("digest_match") is not None]
    if match:
        parts.append("= source" if all(match) else "DIFFERS from source")
    lag = [r["digest_lag_s"] for r in runs
           if r.get("digest_state") == "complete" and "digest_lag_s" in r]
    if lag:
        parts.append(f"ready {statistics.median(lag):.2f} s after the copy")
    return ", ".join(parts)


def fmt(v, spec=".0f", none="–"):
    return none if v is None else format(v, spec)


def lat_label(lat):
    return "no delay" if not lat else f"{lat:g} ms"


def mean_kib(s, op):
    ops = s.get(op + "_ops")
    if not ops:
        return "–"
    return f"{s[op + '_bytes'] / ops / 1024:.0f}"


# ---- markdown -----------------------------------------------------------

def markdown(results, meta):
    g = group(results)
    preset = meta.get("preset", "first")
    out = [begin(preset), "",
           f"## Results: preset {preset}, {meta['date']}", ""]
    out += ["Command (from the repository root):", "",
            f"    {meta['command']}", ""]
    out += ["| machine | |", "| --- | --- |"]
    out += [f"| {k} | {v} |" for k, v in meta["machine"]]
    out += [f"| load average before / after | {meta['load_before']} / "
            f"{meta['load_after']} |",
            f"| wall time of the whole run | {meta['wall']:.0f} s |", ""]
    out += method(meta)
    out += server_cost_table(meta.get("server_cost") or [])
    srcs = [(n, v) for n, v in (meta.get("sources") or {}).items() if v]
    if srcs:
        out += ["Sources:", ""]
        out += [f"- {n}: {v}" for n, v in srcs]
        out += [""]
    if meta.get("skipped"):
        out += ["Skipped arms:", ""]
        out += [f"- {a}: {why}" for a, why in meta["skipped"]]
        out += [""]
    for exp in meta["experiments"]:
        out += experiment_tables(exp, g, meta)
    bad = [r for r in results if not r["ok"]]
    if bad:
        out += ["### Failed runs", ""]
        out += [f"- {r['label']}, {r['source']}, {r['server']}, "
                f"{lat_label(r['latency'])}, run {r['run']}: {r['error']} "
                f"(logs: {r['dir']})" for r in bad]
        out += [""]
    out += raw_runs(results)
    out += [end(preset)]
    return "\n".join(out) + "\n"


def method(meta):
    return [
        "Each run gets a fresh nbdkit (`--exit-with-parent`, stats filter "
        "outermost, then the delay filter) and, for the mounted arms, a "
        "fresh mount.  Runs are interleaved: run 1 of every cell and every "
        "arm, then run 2, ...; the arm order rotates from run to run.  "
        "MiB/s = image size / time from spawning the client (cp, dd, "
        "nbdcopy, qemu-img) to its exit; cp and dd exit after close(), which "
        "on nbdferry returns only when the server has acknowledged every "
        "write.  Every run is verified: the sha256 of the whole export, "
        "read back from the server (`nbdcopy URI -`, or the backing file "
        "of the file plugin), must equal the source's.  CPU seconds: client "
        "and daemon from wait4() rusage, server from /proc/PID/stat before "
        "the read-back; 'rest of machine' is every CPU second the machine "
        "spent busy during the copy minus those of client, daemon and server "
        "(other users, kernel threads): the noise gauge.  NBD requests are "
        "counted by nbdkit's stats filter.  cp is `cp --sparse=always`.",
        "",
        "Like for like: nbdcopy, qemu-img and nbdfuse hash nothing, so every "
        "nbdferry arm compared with them runs with `--no-digest`; the arm "
        "'nbdferry + cp (inline sha256)' runs the daemon's defaults, which "
        "compute a sha256 of the copy as it passes, and shows what that "
        "costs.",
        "",
        f"Delay: {meta['delay_note']}",
        "",
    ]


def server_cost_table(rows):
    """The server's own cost per cell: nbdkit's CPU seconds per GiB while
    the system's nbdcopy copied the cell's image into it (copy-out cells:
    out of it) twice, on one fresh server."""
    if not rows:
        return []
    out = ["### The server's own cost", "",
           "Before the rounds, each cell's server (fresh, the same command "
           "as the runs) receives the same copy by nbdcopy twice (copy-out "
           "cells: is read by `nbdcopy URI null:` twice once it holds the "
           "image).  CPU seconds of nbdkit (all threads, /proc/PID/stat) "
           "per GiB of the image, first copy / second copy: the first "
           "also allocates the backing file's pages on tmpfs, the second "
           "overwrites them.  This is what the server costs any client; "
           "compare it with the CPU tables' server column.", "",
           "| source | server | delay | direction | server CPU s/GiB, 1st "
           "/ 2nd copy | nbdcopy s, 1st / 2nd |",
           "| --- | --- | --- | --- | ---: | ---: |"]
    for r in rows:
        if r.get("error"):
            cpu, secs = f"failed: {r['error']}", "–"
        else:
            cpu = " / ".join(f"{v:.2f}" for v in r["cpu_per_gib"])
            secs = " / ".join(f"{v:.2f}" for v in r["seconds"])
        out.append(f"| {r['source']} | {r['server']} | "
                   f"{lat_label(r['latency'])} | {r['direction']} | {cpu} | "
                   f"{secs} |")
    return out + [""]


def experiment_tables(exp, g, meta):
    out = [f"### {exp['name']}", ""]
    if exp.get("note"):
        out += [exp["note"], ""]
    keys = [k for k in g if k[0] == exp["name"]]
    blocks = []
    for k in keys:
        b = (k[1], k[2])
        if b not in blocks:
            blocks.append(b)
    for source, server in blocks:
        lats = sorted({k[3] for k in keys if k[1:3] == (source, server)})
        arms = []
        for k in keys:
            if k[1:3] == (source, server) and k[4] not in arms:
                arms.append(k[4])
        unit = "seconds" if exp.get("time_ratios") else "MiB/s"
        out += [f"#### {source} onto {server}: {unit}, median (min–max) "
                f"of {exp['runs']} run(s)", ""]
        out += ["| arm | " + " | ".join(lat_label(l) for l in lats) + " |",
                "| --- |" + " ---: |" * len(lats)]
        for a in arms:
            row = []
            label = a
            for l in lats:
                runs = g.get((exp["name"], source, server, l, a))
                if not runs:
                    row.append("")
                    continue
                s = cell_summary(runs)
                label = s["label"]
                row.append(fmt_cell(s, exp.get("time_ratios")))
            out += [f"| {label} | " + " | ".join(row) + " |"]
        out += [""]
        out += ratio_table(exp, g, source, server, lats)
        out += cpu_table(exp, g, source, server, lats, arms)
        out += detail_table(exp, g, source, server, lats, arms)
    return out


def fmt_cell(s, seconds=False):
    if "med" not in s:
        return f"failed ({s['ok']}/{s['n']})"
    if seconds:
        txt = (f"**{s['seconds']:.2f}** ({s['s_min']:.2f}–"
               f"{s['s_max']:.2f})")
    else:
        txt = f"**{s['med']:.0f}** ({s['min']:.0f}–{s['max']:.0f})"
    if s["ok"] < s["n"]:
        txt += f" {s['ok']}/{s['n']} ok"
    return txt


# Throughput ratios: (label, arm a, arm b) -> MiB/s of a over MiB/s of b.
# nbdferry arms run with --no-digest unless the label says sha256.
RATIOS = [
    ("nbdferry+cp --no-digest / nbdcopy (the manifest still hashes each "
     "block)", "ferry-cp", "nbdcopy"),
    ("nbdferry+cp inline sha256 / nbdcopy", "ferry-cp-digest", "nbdcopy"),
    ("nbdferry+cp inline sha256 / --no-digest (the digest's cost)",
     "ferry-cp-digest", "ferry-cp"),
    ("nbdferry+cp inline blkhash / --no-digest (the blkhash's cost)",
     "ferry-cp-blkhash", "ferry-cp"),
    ("nbdferry+cp inline blkhash / inline sha256", "ferry-cp-blkhash",
     "ferry-cp-digest"),
    ("until ready: nbdferry+cp inline sha256 / --no-digest",
     "verified-ferry", "ferry-cp"),
    ("until ready: nbdferry+cp inline blkhash / --no-digest",
     "verified-ferry-blkhash", "ferry-cp"),
    ("until ready: inline blkhash / inline sha256", "verified-ferry-blkhash",
     "verified-ferry"),
    ("until ready: inline blkhash / nbdcopy 1.24+ --blkhash (the same "
     "digest)", "verified-ferry-blkhash", "nbdcopy-new-blkhash"),
    ("verified copy: nbdferry+cp inline sha256 / nbdcopy 1.24+ --blkhash",
     "verified-ferry", "nbdcopy-new-blkhash"),
    ("end to end: nbdferry-verify --blkhash SRC while cp, inline blkhash / "
     "--no-digest", "e2e-blkhash", "ferry-cp"),
    ("end to end: blkhash / sha256 (source side and inline)", "e2e-blkhash",
     "e2e-sha256"),
    ("no options, until the inline blkhash is ready / nbdcopy (targets: "
     "dense ≥ 0.75x at no delay, ≥ 0.85x at 2 ms)", "ferry-defaults",
     "nbdcopy"),
    ("no options, until the inline blkhash is ready / nbdcopy 1.24+ "
     "--blkhash (both hash the copy: blkhash sha256/64k)", "ferry-defaults",
     "nbdcopy-new-blkhash"),
    ("no options, until the inline blkhash is ready / nbdcopy 1.24+",
     "ferry-defaults", "nbdcopy-new"),
    ("nbdferry+cp --no-digest / nbdcopy 1.24+ (the manifest still hashes "
     "each block)", "ferry-cp", "nbdcopy-new"),
    ("nbdferry+cp --no-digest --no-manifest / nbdcopy 1.24+ (neither "
     "hashes: the FUSE path's own cost)", "ferry-cp-nohash", "nbdcopy-new"),
    ("nbdferry+cp --no-digest / --no-digest --no-manifest (the manifest's "
     "cost)", "ferry-cp", "ferry-cp-nohash"),
    ("nbdcopy 1.24+ / Debian's nbdcopy", "nbdcopy-new", "nbdcopy"),
    ("nbdcopy 1.24+ --blkhash / without (its hash's cost)",
     "nbdcopy-new-blkhash", "nbdcopy-new"),
    ("no options, until the inline blkhash is ready / qemu-img -W",
     "ferry-defaults", "qemu-img-W"),
    ("no options, until the inline blkhash is ready / --no-digest (targets: "
     "≥ 0.80x on the thin disk, ≥ 0.91x on 25% data: within 1.25x and "
     "1.1x in time)", "ferry-defaults", "ferry-cp"),
    ("copy out, no options / nbdcopy (target: ≥ 0.9x at 2 and 10 ms)",
     "out-ferry-defaults", "out-nbdcopy"),
    ("copy out, no options / qemu-img convert", "out-ferry-defaults",
     "out-qemu-img"),
    ("copy out, no options / nbdcopy 1.24+", "out-ferry-defaults",
     "out-nbdcopy-new"),
    ("copy out, cp --sparse=always, no options / nbdcopy",
     "out-ferry-defaults-sparse", "out-nbdcopy"),
    ("copy out, cp --sparse=always, no options / nbdcopy 1.24+",
     "out-ferry-defaults-sparse", "out-nbdcopy-new"),
    ("copy out, cp --sparse=always, no options / nbdcopy 1.24+ --blkhash",
     "out-ferry-defaults-sparse", "out-nbdcopy-new-blkhash"),
    ("copy out, nbdcopy 1.24+ / Debian's nbdcopy", "out-nbdcopy-new",
     "out-nbdcopy"),
    ("copy out, nbdferry + cp --no-digest / nbdcopy", "out-ferry-cp",
     "out-nbdcopy"),
    ("copy out, nbdferry + cp nbd.vhd / nbdcopy", "out-ferry-vhd",
     "out-nbdcopy"),
    ("nbdferry+cp --no-digest / nbdfuse+cp", "ferry-cp", "fuse-cp"),
    ("verified copy: nbdferry+cp inline sha256 / nbdcopy then read-back "
     "sha256sum", "verified-ferry", "verified-nbdcopy-sum"),
    ("verified copy: nbdferry+cp inline sha256 / nbdcopy then "
     "nbdferry-verify", "verified-ferry", "verified-nbdcopy-verify"),
    ("nbdferry+cp --no-digest / qemu-img -W", "ferry-cp", "qemu-img-W"),
    ("nbdferry pipelined+nodelay / stock, both --no-digest (published: "
     "7.39x)", "ferry-cp", "ferry-stock"),
    ("nbdferry pipelined, Nagle on / stock, both --no-digest (published: "
     "7.41x)", "ferry-pipe", "ferry-stock"),
    ("nbdferry TCP_NODELAY only / stock, both --no-digest (published: "
     "4.26x)", "ferry-nodelay", "ferry-stock"),
]

# Time ratios, for experiments whose tables are in seconds (sparse):
# (label, arm a, arm b) -> seconds of a over seconds of b.
TIME_RATIOS = [
    ("time of nbdferry+cp --sparse=always --no-digest / nbdcopy "
     "(target: ≤ 1.25x)", "ferry-cp", "nbdcopy"),
    ("time of nbdferry+cp --sparse=always, inline sha256 / nbdcopy",
     "ferry-cp-digest", "nbdcopy"),
    ("time of nbdferry+cp --no-digest / qemu-img convert -n -W",
     "ferry-cp", "qemu-img-W"),
    ("time of nbdferry+cp --no-digest / qemu-img convert -n",
     "ferry-cp", "qemu-img"),
    ("time of nbdcopy / qemu-img convert -n -W", "nbdcopy", "qemu-img-W"),
    ("time of nbdferry cp x.vmdk MNT/nbd.vmdk / qemu-img convert -n -f vmdk "
     "(target: ≤ 1.0x)", "ferry-vmdk", "qemu-img-vmdk"),
    ("time of nbdferry cp x.vhdx MNT/nbd.vhdx / qemu-img convert -n -f vhdx "
     "(target: ≤ 1.0x)", "ferry-vhdx", "qemu-img-vhdx"),
    ("time of nbdferry cp MNT/nbd.vhdx out.vhdx / qemu-img convert -O vhdx "
     "URI (target: ≤ 1.0x)", "out-ferry-vhdx", "out-qemu-img-vhdx"),
]
# The qcow2 preset: landing a qcow2 (plain and zlib) and copying out.
TIME_RATIOS += [
    ("time of nbdferry cp x.qcow2 MNT/nbd.qcow2 / qemu-img convert -n -f "
     "qcow2 -O raw (target: ≤ 1.0x)", "ferry-qcow2", "qemu-img-qcow2"),
    ("time of nbdferry cp MNT/nbd.qcow2 out.qcow2 / qemu-img convert -O "
     "qcow2 URI (target: ≤ 1.0x)", "out-ferry-qcow2", "out-qemu-img-qcow2"),
]


def ratio_set(exp):
    """[(label, a, b, inverse)]: inverse means a ratio of times, computed as
    MiB/s of b over MiB/s of a (every arm copies the same image)."""
    if exp.get("time_ratios"):
        return [(n, a, b, True) for n, a, b in TIME_RATIOS]
    return [(n, a, b, False) for n, a, b in RATIOS]


def ratio(g, exp, source, server, lat, a, b):
    ra = g.get((exp, source, server, lat, a))
    rb = g.get((exp, source, server, lat, b))
    if not ra or not rb:
        return None
    sa, sb = cell_summary(ra), cell_summary(rb)
    if "med" not in sa or "med" not in sb:
        return None
    return sa["med"] / sb["med"]


def paired_ratio(g, exp, source, server, lat, a, b):
    """Median over k of (a's run k) / (b's run k): runs k of two arms ran
    minutes apart at most, so this cancels slow drift in the machine's load."""
    ra = {r["run"]: r for r in g.get((exp, source, server, lat, a), [])
          if r["ok"]}
    rb = {r["run"]: r for r in g.get((exp, source, server, lat, b), [])
          if r["ok"]}
    v = [ra[k]["mibs"] / rb[k]["mibs"] for k in ra if k in rb]
    return statistics.median(v) if v else None


def ratio_table(exp, g, source, server, lats):
    rows = []
    for name, a, b, inverse in ratio_set(exp):
        if inverse:
            a, b = b, a
        vals = [ratio(g, exp["name"], source, server, l, a, b) for l in lats]
        pair = [paired_ratio(g, exp["name"], source, server, l, a, b)
                for l in lats]
        if any(v is not None for v in vals):
            rows.append(f"| {name} | " + " | ".join(
                "–" if v is None else f"**{v:.2f}x** ({p:.2f}x)"
                for v, p in zip(vals, pair)) + " |")
    if not rows:
        return []
    return (["Ratios: of the medians, **bold**; in brackets the median of "
             "per-run ratios (run k of one arm over run k of the other, "
             "which ran close in time).", "",
             "| ratio | " + " | ".join(lat_label(l) for l in lats) + " |",
             "| --- |" + " ---: |" * len(lats)] + rows + [""])


def cpu_per_gib(runs):
    """'client / daemon / server (total)' in CPU seconds per GiB copied,
    medians over the runs that succeeded; total is their sum."""
    ok = [r for r in runs if r["ok"]]
    if not ok:
        return "–"
    gib = ok[0]["size"] / (1 << 30)
    s = cell_summary(runs)
    parts = [s.get(k) for k in ("cpu_client", "cpu_daemon", "cpu_server")]
    total = sum(p for p in parts if p is not None)
    return (" / ".join(fmt(None if p is None else p / gib, ".2f")
                       for p in parts) + f" (**{total / gib:.2f}**)")


def cpu_table(exp, g, source, server, lats, arms):
    rows = []
    for a in arms:
        cells, label = [], a
        for l in lats:
            runs = g.get((exp["name"], source, server, l, a))
            if runs:
                label = runs[0]["label"]
            cells.append(cpu_per_gib(runs) if runs else "")
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    return (["CPU seconds per GiB copied, median of the runs: client / "
             "daemon / server (**sum**).  The client is cp, dd, nbdcopy or "
             "qemu-img (with their children: a verified copy's read-back "
             "and hash); the daemon's covers its whole life (mount, copy, "
             "inline hash, unmount); the server is nbdkit.", "",
             "| arm | " + " | ".join(lat_label(l) for l in lats) + " |",
             "| --- |" + " ---: |" * len(lats)] + rows + [""])


def detail_table(exp, g, source, server, lats, arms):
    out = ["<details><summary>Details: seconds, CPU, NBD requests "
           "(medians)</summary>", "",
           "| delay | arm | runs ok | s | CPU s client / daemon / server "
           "/ rest of machine "
           "| unmount s | NBD writes | mean write KiB | written MiB "
           "| zeroes | zeroed MiB | trims | flushes "
           "| daemon: " + " / ".join(h for _, h, _ in DAEMON_KEYS) +
           " | inline digest |",
           "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
           "| ---: | ---: | ---: | ---: | ---: | --- |"]
    for l in lats:
        for a in arms:
            runs = g.get((exp["name"], source, server, l, a))
            if not runs:
                continue
            s = cell_summary(runs)
            cpu = " / ".join(fmt(s.get(k), ".2f") for k in
                             ("cpu_client", "cpu_daemon", "cpu_server",
                              "foreign_cpu"))
            out.append(
                f"| {lat_label(l)} | {s['label']} | {s['ok']}/{s['n']} | "
                f"{fmt(s.get('seconds'), '.2f')} | {cpu} | "
                f"{fmt(s.get('umount_seconds'), '.2f')} | "
                f"{fmt(s.get('write_ops'), '.0f')} | {mean_kib(s, 'write')} | "
                f"{mib(s, 'write')} | {fmt(s.get('zero_ops'), '.0f')} | "
                f"{mib(s, 'zero')} | {fmt(s.get('trim_ops'), '.0f')} | "
                f"{fmt(s.get('flush_ops'), '.0f')} | {daemon_cols(s)} | "
                f"{s.get('digest') or '–'} |")
    return out + ["", "</details>", ""]


def mib(s, op):
    b = s.get(op + "_bytes")
    return "–" if b is None else f"{b / (1 << 20):.0f}"


def daemon_cols(s):
    if not any(k in s for k, _, _ in DAEMON_KEYS):
        return "–"
    return " / ".join(fmt(s.get(k), f) for k, _, f in DAEMON_KEYS)


def raw_runs(results):
    out = ["<details><summary>Every run, in the order run</summary>", "",
           "| # | experiment | source | server | delay | arm | run | MiB/s "
           "| s | CPU s burnt meanwhile by the rest of the machine | verified |",
           "| ---: | --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: "
           "| --- |"]
    for i, r in enumerate(results, 1):
        out.append(f"| {i} | {r['exp']} | {r['source']} | {r['server']} | "
                   f"{lat_label(r['latency'])} | {r['label']} | {r['run']} | "
                   f"{fmt(r['mibs'], '.1f')} | {fmt(r['seconds'], '.2f')} | "
                   f"{fmt(r.get('foreign_cpu'), '.2f')} | "
                   f"{'yes' if r['verified'] else 'NO: ' + r['error']} |")
    return out + ["", "</details>", ""]


def summary_text(results, meta):
    """Plain-text medians and headline ratios for the terminal."""
    g = group(results)
    out = []
    for (exp, src, srv, lat, arm), runs in g.items():
        s = cell_summary(runs)
        out.append(f"{exp:14} {src:16} {srv:20} {lat_label(lat):9} "
                   f"{s['label']:48} " +
                   (f"{s['med']:8.1f} MiB/s ({s['min']:.1f}-{s['max']:.1f})"
                    if "med" in s else f"failed {s['n'] - s['ok']}/{s['n']}"))
    exps = {e["name"]: e for e in meta.get("experiments", [])}
    for exp, src, srv, lat in dict.fromkeys(k[:4] for k in g):
        for name, a, b, inverse in ratio_set(exps.get(exp, {})):
            if inverse:
                a, b = b, a
            v = ratio(g, exp, src, srv, lat, a, b)
            if v is not None:
                out.append(f"{exp:14} {src:16} {srv:20} {lat_label(lat):9} "
                           f"{name}: {v:.2f}x")
    return "\n".join(out) + "\n"


def write(path, text, preset, title="# Benchmarks\n\n"):
    """Replace this preset's generated block of 'path' (or the old unnamed
    one), keeping all other text; append if there is none."""
    old = ""
    if os.path.exists(path):
        with open(path) as f:
            old = f.read()
    for b, e in ((begin(preset), end(preset)), (OLD_BEGIN, OLD_END)):
        if b in old and e in old:
            break
    else:
        b = e = None
    if b:
        head = old[:old.index(b)]
        tail = old[old.index(e) + len(e):].lstrip("\n")
        new = head + text + ("\n" + tail if tail else "")
    elif old.strip():
        new = old.rstrip("\n") + "\n\n" + text       # keep others' text
    else:
        new = title + text
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(new)
    os.rename(tmp, path)


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def now():
    return time.strftime("%Y-%m-%d %H:%M %Z")
