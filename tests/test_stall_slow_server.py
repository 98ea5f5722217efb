"""A slow server that answers is not late.

nbdkit's rate filter shares one bandwidth among the mount's four
connections: the bucket serves whichever request comes first, so one
connection can wait seconds for its next reply while the others get
theirs.  The server answers; the copy advances.  The status must not say
"late" nor "no reply for N s ... the copy fails in M s" then: "late" is
for a server from which no connection has heard for over a second.

Judged by samples: the status is read every 0.1 s; a sample taken less
than 0.6 s after the one before, whose acknowledged bytes grew since it,
saw a reply within the last 0.6 s (plus the time to read the status), so
it must not be "late".  A loaded machine only spaces the samples out,
which leaves them unjudged, never wrongly judged.  The copy lands
byte-exact (sha256 on the server)."""

import time

from lib.digest import sha256_file
from lib.env import MiB
from lib.faults import status_json
from lib.images import random_file
from lib.nbd import sha256_nbd

SRC = 24 * MiB


def test_stall_slow_but_answering_server_is_not_late(kit, mount, shm, bg):
    # 24 Mbit/s shared: 3 MB/s, about 8 s for the copy; 64 requests of
    # 512 KiB outstanding wait their turn at the bucket.
    k = kit("srv", ["--filter=rate", "memory", f"size={64 * MiB}",
                    "rate=24M", "burstiness=0.5"])
    m = mount(k.target, "-C", "4", "--request-size", "512K",
              "--pool-size", "32M")
    src = random_file(shm / "src.img", SRC)
    cp = bg(["dd", f"if={src}", f"of={m.file}", "bs=1M",
             "conv=notrunc,fsync"], shm / "cp.err")
    prev, judged, wrong = None, 0, []
    while cp.poll() is None:
        st = status_json(m)
        now = time.monotonic()
        if st:
            acked, sa = st["bytes_acknowledged"], st["server_answers"]
            if prev and now - prev[0] < 0.6 and acked > prev[1]:
                judged += 1
                if sa["state"] == "late" or "no reply" in sa["message"]:
                    wrong.append((round(now - prev[0], 2), sa))
            prev = (now, acked)
        time.sleep(0.1)
    assert cp.returncode == 0, cp.stderr
    assert sha256_nbd(k.uri, SRC) == sha256_file(src)
    print(f"{judged} samples judged, {len(wrong)} said late")
    assert judged >= 10, "too few samples while the copy advanced"
    assert not wrong, f"late while replies arrived: {wrong[:3]}"
