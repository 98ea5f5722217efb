"""Throughput vs per-write latency, one line per arm, log-log (matplotlib).

'no delay' cannot sit on a log axis; it is drawn a factor of 4 left of the
smallest real delay, on a tick labelled 0.
"""

import os
import re

from .report import cell_summary, group

STYLES = {"nbdferry": "-", "digest": "-", "stock": "--", "nbdfuse": ":",
          "nbdcopy": "-.", "qemu": (0, (3, 1, 1, 1, 1, 1))}


MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]


def slug(*parts):
    return re.sub(r"[^a-z0-9]+", "-", "-".join(parts).lower()).strip("-")


def plots(results, arms_by_name, directory, preset=""):
    """Write one PNG per experiment block with 2+ latencies; return paths.
    Files are named bench-PRESET-EXPERIMENT-SOURCE-SERVER.png, so presets
    that share an experiment (first and full: headline) keep their own."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import (FuncFormatter, LogLocator, NullFormatter,
                                   NullLocator)

    g = group(results)
    blocks = []
    for (exp, src, srv, lat, arm) in g:
        if (exp, src, srv) not in blocks:
            blocks.append((exp, src, srv))
    paths = []
    for exp, src, srv in blocks:
        keys = [k for k in g if k[:3] == (exp, src, srv)]
        lats = sorted({k[3] for k in keys})
        if len(lats) < 2:
            continue
        pos = [l for l in lats if l > 0]
        zero_x = (min(pos) / 4) if pos else 1
        fig, ax = plt.subplots(figsize=(11, 5.5), dpi=110)
        arms = []
        for k in keys:
            if k[4] not in arms:
                arms.append(k[4])
        cmap = plt.cm.tab10 if len(arms) <= 10 else plt.cm.tab20
        for i, a in enumerate(arms):
            xs, ys, lo, hi = [], [], [], []
            label = a
            for l in lats:
                runs = g.get((exp, src, srv, l, a))
                if not runs:
                    continue
                s = cell_summary(runs)
                label = s["label"]
                if "med" not in s:
                    continue
                xs.append(l if l > 0 else zero_x)
                ys.append(s["med"])
                lo.append(s["med"] - s["min"])
                hi.append(s["max"] - s["med"])
            if not xs:
                continue
            fam = arms_by_name[a].family if a in arms_by_name else ""
            ax.errorbar(xs, ys, yerr=[lo, hi], marker=MARKERS[i % len(MARKERS)],
                        color=cmap(i % cmap.N), capsize=3,
                        linestyle=STYLES.get(fam, "-"), label=label)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ticks = [zero_x] + pos
        ax.set_xticks(ticks)
        ax.set_xticklabels(["0"] + [f"{l:g}" for l in pos])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("server delay per write (ms)")
        ax.set_ylabel("MiB/s (median, bars: min–max)")
        ax.set_title(f"{exp}: {src} onto nbdkit {srv}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
        fig.tight_layout()
        name = slug(exp, src, srv)
        if preset and not name.startswith(slug(preset) + "-"):
            name = f"{slug(preset)}-{name}"
        path = os.path.join(directory, f"bench-{name}.png")
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)
    return paths
