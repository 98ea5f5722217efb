"""TLS keys for the tests: a PSK file made by gnutls-bin's psktool."""

import subprocess
from pathlib import Path


def make_psk(d, user="alice"):
    """D/keys.psk holding a fresh key for user, mode 0600; returns its
    path."""
    keys = Path(d) / "keys.psk"
    subprocess.run(["psktool", "-u", user, "-p", str(keys)], check=True,
                   capture_output=True)
    keys.chmod(0o600)
    return keys


def psk_key(keys):
    """The hex key of a one-line PSK file (USER:KEY)."""
    return keys.read_text().strip().split(":", 1)[1]
