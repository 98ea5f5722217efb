"""Where things are and how long to wait: the build tree, the daemon, the
wrapper and timeout scale from the environment, and the tools found here.

Environment:
  NBDFERRY_BUILD          build tree (default: build/ at the top of the source
                          tree); the daemon is $NBDFERRY_BUILD/daemon/nbdferry
  NBDFERRY_BIN            explicit path to the daemon (overrides the above)
  NBDFERRY_WRAPPER        command prepended to every daemon invocation, e.g.
                          "valgrind --error-exitcode=99 --leak-check=full"
  NBDFERRY_TIMEOUT_SCALE  multiply every timeout (default 1, 10 with a wrapper)
"""

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

try:                                   # python3-libnbd (Debian package)
    import nbd as libnbd
except ImportError:                    # fall back to nbdcopy through a pipe
    libnbd = None

TESTS = Path(__file__).resolve().parent.parent      # tests/
TOP = TESTS.parent                                    # the source tree
BUILD = Path(os.environ.get("NBDFERRY_BUILD") or TOP / "build")
NBDFERRY = Path(os.environ.get("NBDFERRY_BIN") or BUILD / "daemon" / "nbdferry")
WRAPPER = shlex.split(os.environ.get("NBDFERRY_WRAPPER", ""))
def _sanitizer(build):
    """The build's sanitizer ("address", "thread") from its CMake cache,
    or "" (a plain build)."""
    try:
        for line in (build / "CMakeCache.txt").read_text().splitlines():
            if line.startswith("SANITIZE:"):
                return line.split("=", 1)[1].strip()
    except OSError:
        pass
    return ""


SANITIZER = _sanitizer(BUILD)
SCALE = float(os.environ.get("NBDFERRY_TIMEOUT_SCALE") or (10 if WRAPPER else 1))

MiB = 1 << 20
GiB = 1 << 30

HAVE_FUSE = os.path.exists("/dev/fuse") and shutil.which("fusermount3")
HAVE_NBDKIT = shutil.which("nbdkit") is not None
HAVE_NBDCOPY = shutil.which("nbdcopy") is not None

CHUNK = 4 * MiB


def timeout(seconds):
    """A timeout scaled for slow runs (valgrind, sanitizers)."""
    return seconds * SCALE


def daemon_cmd(*args):
    """The daemon's command line with the optional wrapper in front."""
    if not NBDFERRY.exists():
        pytest.fail(f"nbdferry binary not found at {NBDFERRY} "
                    "(build it, or set NBDFERRY_BUILD / NBDFERRY_BIN)")
    return WRAPPER + [str(NBDFERRY)] + [str(a) for a in args]


_HELP = None


def daemon_has_option(opt):
    """True if the daemon's --help mentions opt (for options beyond the
    contract, e.g. --retry-timeout, used only where present)."""
    global _HELP
    if _HELP is None:
        try:
            r = subprocess.run([str(NBDFERRY), "--help"], capture_output=True,
                               text=True, timeout=30)
            _HELP = r.stdout + r.stderr
        except (OSError, subprocess.TimeoutExpired):
            _HELP = ""
    return re.search(re.escape(opt) + r"\b", _HELP) is not None

