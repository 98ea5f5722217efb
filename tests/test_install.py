"""cmake --install: the binaries run from the prefix, the man pages render.

Installs $NBDFERRY_BUILD into a temporary prefix (never a system
directory), then runs every installed program's --help (and --version
where it has one) from PREFIX/bin, and renders every installed man page
with man(1) and groff, which must print no warning.
"""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from lib.env import BUILD
from lib.procs import run

SRC = Path(__file__).resolve().parent.parent
PROGRAMS = ["nbdferry", "nbdferry-verify", "nbdferry-vhd", "nbdferry-vmdk",
            "nbdferry-vhdx", "nbdferry-qcow2", "nbdferry-status",
            "nbdferry-sync"]
# Every program has the bash completion script and answers --version.
VERSIONED = PROGRAMS
# The tools' own pages; every docs/*.1 is checked as well.
PAGES = ["nbdferry", "nbdferry-verify", "nbdferry-vhd", "nbdferry-vmdk",
         "nbdferry-vhdx", "nbdferry-qcow2", "nbdferry-status",
         "nbdferry-sync"]
# The docs installed into share/doc/nbdferry (docs/CMakeLists.txt), the
# design notes in its design/ folder.
DOCS = ["README.md", "user-guide.md", "security.md", "servers.md",
        "copy-tools.md", "vhd-view.md", "reliability.md",
        "design/README.md", "design/verify.md", "design/format-vhd.md",
        "design/format-vmdk.md", "design/format-vhdx.md",
        "design/format-qcow2.md"]

pytestmark = pytest.mark.skipif(
    not (BUILD / "CMakeCache.txt").exists() or shutil.which("cmake") is None,
    reason=f"needs cmake and a configured build tree at {BUILD}")


def project_version():
    text = (SRC / "CMakeLists.txt").read_text()
    return re.search(r"project\(nbdferry VERSION ([0-9.]+)", text).group(1)


@pytest.fixture(scope="module")
def prefix(tmp_path_factory):
    """PREFIX after `cmake --install BUILD --prefix PREFIX`."""
    p = tmp_path_factory.mktemp("prefix")
    r = run(["cmake", "--install", BUILD, "--prefix", p], timeout=120)
    assert r.returncode == 0, f"cmake --install failed:\n{r.stdout}{r.stderr}"
    return p


def installed_pages(prefix):
    return sorted((prefix / "share/man/man1").glob("*.1"))


def test_install_puts_programs_in_bin(prefix):
    for name in PROGRAMS:
        exe = prefix / "bin" / name
        assert exe.is_file(), f"{exe} not installed"
        assert os.access(exe, os.X_OK), f"{exe} not executable"


def test_install_nothing_but_programs_and_pages(prefix):
    """No test helpers, static libraries or headers in the prefix."""
    files = {str(p.relative_to(prefix)) for p in prefix.rglob("*")
             if p.is_file()}
    expected = {f"bin/{n}" for n in PROGRAMS} | {
        f"share/man/man1/{p.name}" for p in (SRC / "docs").glob("*.1")} | {
        f"share/bash-completion/completions/{n}" for n in VERSIONED} | {
        f"share/doc/nbdferry/{d}" for d in DOCS} | {
        "lib/systemd/system/nbdferry@.service"}
    assert files == expected


def test_install_docs_link_only_to_installed_pages(prefix):
    """A relative link in an installed page leads to a page installed
    beside it (the guide linked to pages the package does not ship)."""
    doc = prefix / "share/doc/nbdferry"
    broken = []
    for page in doc.rglob("*.md"):
        for target in re.findall(r"\]\(([^)#\s]+)[^)]*\)", page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue                      # https:, mailto:
            if page.name == "README.md" and page.parent == doc:
                target = target.removeprefix("docs/")  # the tree's README
            if not (page.parent / target).is_file():
                broken.append(f"{page.relative_to(doc)}: {target}")
    assert not broken, "links to pages not installed:\n" + "\n".join(broken)


def test_install_unit_runs_the_installed_daemon(prefix):
    """The installed unit names PREFIX/bin/nbdferry, not /usr/local/bin."""
    unit = (prefix / "lib/systemd/system/nbdferry@.service").read_text()
    execs = re.findall(r"^ExecStart=(\S+)", unit, re.M)
    assert execs == [f"{prefix}/bin/nbdferry"], execs


@pytest.mark.parametrize("name", PROGRAMS)
def test_install_program_help(prefix, name):
    exe = prefix / "bin" / name
    r = run([exe, "--help"], timeout=30)
    assert r.returncode == 0, f"{name} --help exited {r.returncode}: {r.stderr}"
    out = r.stdout + r.stderr
    assert name in out and re.search(r"usage", out, re.I), out


@pytest.mark.parametrize("name", PROGRAMS)
def test_install_program_version(prefix, name):
    r = run([prefix / "bin" / name, "--version"], timeout=30)
    assert r.returncode == 0, f"{name} --version exited {r.returncode}"
    assert r.stdout.startswith(f"{name} {project_version()}"), r.stdout


def test_install_every_docs_page(prefix):
    names = [p.name for p in installed_pages(prefix)]
    want = sorted(p.name for p in (SRC / "docs").glob("*.1"))
    assert names == want
    for page in PAGES:
        assert f"{page}.1" in names, f"man page {page}.1 not installed"


@pytest.mark.skipif(shutil.which("man") is None, reason="needs man-db")
@pytest.mark.parametrize("page", PAGES)
def test_install_man_page_renders_without_warnings(prefix, page):
    path = prefix / "share/man/man1" / f"{page}.1"
    env = dict(os.environ, MANWIDTH="80", LC_ALL="C.UTF-8")
    r = subprocess.run(["man", "--warnings", "-l", str(path)],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stderr == "", f"man --warnings -l {path}:\n{r.stderr}"
    text = re.sub(r".\x08", "", r.stdout)          # overstrike bold
    assert "NAME" in text and page in text and "SYNOPSIS" in text


@pytest.mark.skipif(shutil.which("groff") is None, reason="needs groff")
def test_install_man_pages_groff_clean(prefix):
    for path in installed_pages(prefix):
        r = subprocess.run(["groff", "-man", "-ww", "-z", str(path)],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and r.stderr == "", \
            f"groff -man -ww -z {path}:\n{r.stderr}"


def test_install_help_options_in_installed_page(prefix):
    """The installed nbdferry(1) documents every option --help lists."""
    r = run([prefix / "bin/nbdferry", "--help"], timeout=30)
    page = (prefix / "share/man/man1/nbdferry.1").read_text()
    page = page.replace("\\-", "-")
    opts = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]+)", r.stdout))
    missing = sorted(o for o in opts if o not in page)
    assert not missing, f"nbdferry.1 lacks {missing}"
