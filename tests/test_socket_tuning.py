"""The daemon's Unix sockets to the server get a send buffer of a whole
2 MiB write request (transport/nbdx-connect.c): with the default 208 KiB each
request left in about eight send()s, each ending in EAGAIN, a poll() and
a wakeup.  Read from the kernel with ss(8), for every connection.  Where
net.core.wmem_max is lower and the daemon lacks CAP_NET_ADMIN (no
SO_SNDBUFFORCE), the kernel's cap is what it can get."""

import re

from lib.env import MiB
from lib.procs import run

WANT = 2 * MiB                    # what the kernel reports for 1 MiB asked


def expected_sndbuf():
    with open("/proc/sys/net/core/wmem_max") as f:
        wmem_max = int(f.read())
    with open("/proc/self/status") as f:
        caps = int(re.search(r"^CapEff:\s*([0-9a-f]+)", f.read(), re.M)
                   .group(1), 16)
    net_admin = bool(caps & (1 << 12))
    return WANT if net_admin else min(WANT, 2 * wmem_max)


def test_unix_send_buffer_holds_a_request(server, mount):
    srv = server("memory", f"size={16 * MiB}")
    m = mount(srv, "--no-digest")
    r = run(["ss", "-x", "-m", "-p"])
    assert r.returncode == 0, r.stderr
    # ss prints each socket's skmem on the same line or the next.
    text = re.sub(r"\n\s+skmem", " skmem", r.stdout)
    bufs = [int(t) for line in text.splitlines()
            if f"pid={m.pid}," in line and line.startswith("u_str")
            for t in re.findall(r"\btb(\d+)", line)]
    assert bufs, f"no Unix socket of the daemon in ss's output:\n{r.stdout}"
    want = expected_sndbuf()
    assert all(b >= want for b in bufs), \
        f"send buffers {bufs}, want at least {want} each"
