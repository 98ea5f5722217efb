"""Every view and every installed program is named where a user looks:
nbdferry --help (daemon/usage.c), README.md, the package description
(debian/control), the user guide and the bash completion; every
top-level folder in README's layout table and in the design notes'
source tree (docs/design/README.md).

The lists come from the build, not from this file: the views from the
daemon's view table (daemon/viewtable.c's nbdferry_views[] and each view's suffix, as
IMAGEVIEW_DEFINE or .suffix gives it), the programs from the install()
rules (daemon/CMakeLists.txt and tools/*/*.cmake).  A new view or program
that the texts do not name fails here."""

import re
import subprocess

from lib.env import NBDFERRY, TOP

DEFAULT = "nbd"                # the raw file's default name: MNT/nbd


def views():
    """The view files of a one-disk mount: nbd.vhd, nbd.vmdk, ..."""
    table = (TOP / "daemon" / "viewtable.c").read_text()
    listed = set(re.findall(r"\[FS_INO_\w+\]\s*=\s*&(fs_\w+_view)", table))
    suffix = {}
    for src in [*(TOP / "fs").glob("*.c"), *(TOP / "views").glob("*.c")]:
        text = src.read_text()
        for var, sfx in re.findall(
                r'IMAGEVIEW_DEFINE\((fs_\w+_view),\s*\w+,\s*"([^"]*)"\)',
                text):
            suffix[var] = sfx
        for var, body in re.findall(
                r"const struct fs_view (fs_\w+_view) = \{(.*?)\n\};", text,
                re.S):
            m = re.search(r'\.suffix\s*=\s*"([^"]*)"', body)
            if m:
                suffix[var] = m.group(1)
    assert listed and listed <= set(suffix) | {"fs_status_view"}, \
        (listed, suffix)
    found = {DEFAULT + suffix[v] for v in listed if suffix.get(v)}
    assert len(found) >= 4, found
    return sorted(found)


def programs():
    """The installed programs, from the install() rules."""
    names = set()
    rules = [TOP / "daemon" / "CMakeLists.txt",
             *(TOP / "tools").glob("*/*.cmake")]
    for f in rules:
        text = f.read_text()
        names |= set(re.findall(r"install\(TARGETS\s+([\w-]+)", text))
        names |= {p.rsplit("/", 1)[-1] for p in
                  re.findall(r"install\(PROGRAMS\s+(\S+)", text)}
    assert "nbdferry" in names and len(names) >= 6, names
    return sorted(names)


def texts():
    help_text = subprocess.run([str(NBDFERRY), "--help"], capture_output=True,
                               text=True, timeout=30)
    assert help_text.returncode == 0, help_text.stderr
    return {
        "nbdferry --help": help_text.stdout + help_text.stderr,
        "README.md": (TOP / "README.md").read_text(),
        "debian/control": (TOP / "debian" / "control").read_text(),
        "docs/user-guide.md": (TOP / "docs" / "user-guide.md").read_text(),
    }


def named(text, word):
    return re.search(r"(?<![\w.-])" + re.escape(word) + r"(?![\w-])", text)


def test_docs_name_every_view():
    missing = []
    for where, text in texts().items():
        for v in views():
            # --help names the raw file FILENAME (default nbd).
            alias = "FILENAME" + v[len(DEFAULT):]
            if not (named(text, v) or named(text, alias)):
                missing.append(f"{where}: {v}")
    assert not missing, "views not named:\n" + "\n".join(missing)


def test_design_notes_name_every_view():
    """The design notes (docs/design/README.md) name every view, as the
    daemon's files: FILENAME.vhd, ... (or nbd.vhd, ...)."""
    text = (TOP / "docs" / "design" / "README.md").read_text()
    missing = [v for v in views()
               if not (named(text, v) or
                       named(text, "FILENAME" + v[len(DEFAULT):]))]
    assert not missing, f"views not in the design notes: {missing}"


def test_docs_name_every_program():
    missing = [f"{where}: {p}" for where, text in texts().items()
               for p in programs() if not named(text, p)]
    assert not missing, "programs not named:\n" + "\n".join(missing)


def test_completion_covers_every_program():
    """The completion script registers every program, and the install
    rule installs it under every program's name."""
    script = (TOP / "tools" / "bash-completion" / "nbdferry").read_text()
    script = script.replace("\\\n", " ")            # continued lines
    m = re.search(r"^complete .*?-F _nbdferry (.*)$", script, re.M)
    assert m, script
    registered = set(m.group(1).split())
    rule = (TOP / "tools" / "bash-completion" / "completion.cmake").read_text()
    fm = re.search(r"foreach\(prog((?:\s+[\w-]+)+)\)", rule)
    assert fm, rule
    installed = set(fm.group(1).split())
    for p in programs():
        assert p in registered, f"the completion does not register {p}"
        assert p in installed, f"completion.cmake does not install it as {p}"


def test_readme_layout_names_every_folder():
    """README's layout table names every top-level folder of the tree
    (a folder added without a line there is a map gone stale)."""
    import subprocess as sp
    tracked = sp.run(["git", "-C", str(TOP), "ls-files"], capture_output=True,
                     text=True, check=True).stdout.split()
    folders = {p.split("/", 1)[0] for p in tracked if "/" in p}
    folders -= {".ci"}
    text = (TOP / "README.md").read_text()
    layout = text.split("## Layout", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"^\| `([\w.-]+)/` \|", layout, re.M))
    assert folders <= named, f"not in README's layout: {sorted(folders - named)}"


def test_design_source_tree_names_every_folder():
    """The design notes' "Source tree" block (docs/design/README.md)
    names every top-level folder, as README's layout does: a folder
    added without a line there leaves the map of the code stale."""
    import subprocess as sp
    tracked = sp.run(["git", "-C", str(TOP), "ls-files"], capture_output=True,
                     text=True, check=True).stdout.split()
    folders = {p.split("/", 1)[0] for p in tracked if "/" in p}
    folders -= {".ci"}
    text = (TOP / "docs" / "design" / "README.md").read_text()
    sec = text.split("\n## Source tree\n", 1)[1].split("\n## ", 1)[0]
    block = sec.split("```\n", 1)[1].split("```", 1)[0]
    named = set()
    for line in block.splitlines():
        m = re.match(r" ((?:[\w.-]+/ +)+)", line)    # " vhd/ vmdk/   the ..."
        if m:
            named |= {w.rstrip("/") for w in m.group(1).split()}
    assert folders <= named, \
        f"not in the design notes' source tree: {sorted(folders - named)}"


def test_man_page_is_a_reference_that_points_into_the_guide():
    """docs/nbdferry.1 is the reference (at most 800 lines); each
    explanation it leaves out is in the user guide, and every section it
    sends the reader to ("guide: TITLE") is a heading there."""
    page = (TOP / "docs" / "nbdferry.1").read_text()
    assert len(page.splitlines()) <= 800, len(page.splitlines())
    assert '"The mount in detail"' in page
    text = re.sub(r"\\f[BIRP]|\\&", "", page).replace("\\-", "-")
    text = re.sub(r"\s+", " ", re.sub(r"^\.\S+ ?", "", text, flags=re.M))
    titles = set()
    for group in re.findall(r"\(guide: ([^()]*)\)", text):
        titles |= {t.strip() for t in re.split(r"[,;]", group)}
    guide = (TOP / "docs" / "user-guide.md").read_text()
    headings = {h.split(":")[0].strip() for h in
                re.findall(r"^#{2,4} (.*)$", guide, re.M)}
    assert len(titles) >= 8, titles
    missing = sorted(t for t in titles if t not in headings)
    assert not missing, f"nbdferry.1 names guide sections not there: {missing}"
    assert "The mount in detail" in headings
