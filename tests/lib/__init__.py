"""The integration tests' library; tests import ``from lib.MODULE import
NAME`` (pytest puts tests/ on sys.path), conftest.py holds the fixtures.

env       build tree, daemon command, timeout scale, tools present, sizes
procs     waiting, running commands with a hang guard, threads, /proc
servers   nbdkit servers, the test plugins (tests/nbdkit-plugins/), pause
mounts    nbdferry mounts and their teardown checks, /proc/mounts, RSS
digest    sha256 of files, bytes and streams (shared with the bench/ scripts)
nbd       reading and writing an export directly
images    random and sparse source images
content   assert_content: mount and server against the expected bytes
copy      copy-tool tests: request log parsing, mixed images, status
faults    reliability tests: the copy judge and tally, restartable nbdkit,
          connection-dropping proxy
vhd       VHD fixtures, an independent VHD reader, qemu-img helpers
privatens running a script in a private mount and pid namespace
tls       PSK files (psktool) for the TLS and security tests
"""
