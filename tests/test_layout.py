"""The tree's layout rules, checked so they stay true:

- tests import helpers from tests/lib/, never from conftest.py (pytest's
  plugin, not a module), and conftest.py defines only fixtures and hooks;
- "sha256 of a file" has one definition (tests/lib/digest.py), shared by
  the tests and the tools/, scripts/ and bench/ scripts;
- tools/ holds the installed programs only, and their build rules are
  included by name (no file(GLOB)), one folder per installed program;
- only bench/benchlib puts the test harness on sys.path;
- tests take TCP ports from free_tcp_port (one block per pytest worker);
- the daemon is built with its assertions on;
- tests/README.md lists every test file, and its map from docs/design/
  sections names only files that exist;
- every fuzz target (tests/fuzz/fuzz-*.c) is registered with
  tests/fuzz/fuzz.cmake, so that the build lists it for the fuzz stage
  and replays its corpus and kept crash inputs in every build; every
  corpus and crash input belongs to a target;
- every format of the contract table (tests/lib/formats.py) runs every
  case of test_view_contract.py and test_inspector_contract.py, has its
  format, stream and synth unit tests (tests/unit/*.cmake; the known gaps
  listed) and a fuzz target for its stream decoder;
- no C file of the product (outside tests/) is over 800 lines;
- each room of the product includes only the rooms below it;
- every relative link of the docs and READMEs names a file that exists;
- docs/ holds no benchmark log (bench/results/ does).
Only nm is run; the rest reads the source tree."""

import ast
import re

from lib.env import TESTS, TOP


SCRIPT_DIRS = ("tools", "scripts", "bench")


def py_sources():
    """Every Python file of tests/, tools/, scripts/ and bench/ (scripts
    without .py too)."""
    out = list(TESTS.rglob("*.py"))
    for d in SCRIPT_DIRS:
        for p in (TOP / d).rglob("*"):
            if p.is_file() and p.suffix == "" and \
                    p.read_bytes()[:40].startswith(b"#!/usr/bin/python3"):
                out.append(p)
        out += (TOP / d).rglob("*.py")
    return [p for p in out if "__pycache__" not in p.parts]


def test_nothing_imports_conftest():
    bad = []
    for p in py_sources():
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if isinstance(node, ast.ImportFrom) and node.module == "conftest":
                bad.append(f"{p.relative_to(TOP)}:{node.lineno}")
            elif isinstance(node, ast.Import) and \
                    any(a.name == "conftest" for a in node.names):
                bad.append(f"{p.relative_to(TOP)}:{node.lineno}")
    assert not bad, "import helpers from tests/lib/ instead: " + ", ".join(bad)


def test_conftest_holds_fixtures_only():
    tree = ast.parse((TESTS / "conftest.py").read_text())
    helpers = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            fixture = any("fixture" in ast.unparse(d)
                          for d in getattr(node, "decorator_list", ()))
            if not (fixture or node.name.startswith("pytest_")):
                helpers.append(f"{node.name} (line {node.lineno})")
    assert not helpers, "move to tests/lib/: " + ", ".join(helpers)


def test_one_sha256_of_a_file():
    """No second helper that opens a file for reading, feeds its chunks to
    hashlib.sha256 and returns the hex digest: lib.digest.sha256_file does
    that."""
    pattern = [r"hashlib\.sha256\(\)", r"open\([^)]*'rb'", r"\.read\(",
               r"\.hexdigest\(\)"]
    defs = []
    for p in py_sources():
        if p.name == "test_layout.py":
            continue
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if not isinstance(node, ast.FunctionDef):
                continue
            src = ast.unparse(node)
            if all(re.search(r, src) for r in pattern):
                defs.append(f"{p.relative_to(TOP)}:{node.name}")
    assert defs == [], "use lib.digest.sha256_file: " + ", ".join(defs)


def test_only_benchlib_touches_sys_path():
    """The benchmark imports the test harness as the package lib through
    bench/benchlib alone; no other script reaches into tests/ by path."""
    bad = []
    for p in py_sources():
        if p == TOP / "bench" / "benchlib" / "__init__.py" or \
                p.name == "test_layout.py":
            continue
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if isinstance(node, ast.Attribute) and node.attr == "path" and \
                    ast.unparse(node.value) == "sys":
                bad.append(f"{p.relative_to(TOP)}:{node.lineno}")
    assert not bad, "import benchlib instead: " + ", ".join(bad)


def test_tests_take_tcp_ports_from_free_tcp_port():
    """The suite runs in parallel workers: a test that binds a TCP port of
    its own choosing (bind(0) included: another worker may take the same
    port between the probe and the server's bind) must take it from
    free_tcp_port (lib/procs.py), which gives each worker its own block."""
    bad = []
    for p in TESTS.rglob("*.py"):
        if p == TESTS / "lib" / "procs.py" or "__pycache__" in p.parts:
            continue
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if isinstance(node, ast.Call) and \
                    isinstance(node.func, ast.Attribute) and \
                    node.func.attr == "bind" and node.args and \
                    isinstance(node.args[0], ast.Tuple):
                bad.append(f"{p.relative_to(TOP)}:{node.lineno}")
    assert not bad, "use lib.procs.free_tcp_port: " + ", ".join(bad)


def test_tools_holds_installed_programs_only():
    """tools/ is CMakeLists.txt and one folder per installed program (its
    .cmake included by name) or code those programs share; entry scripts
    live in scripts/, the benchmark in bench/."""
    text = (TOP / "tools" / "CMakeLists.txt").read_text()
    loose = [p.name for p in (TOP / "tools").iterdir()
             if p.is_file() and p.name != "CMakeLists.txt"]
    assert not loose, f"not an installed program: {loose}"
    for d in sorted(p for p in (TOP / "tools").iterdir() if p.is_dir()):
        if d.name == "__pycache__":
            continue
        rules = list(d.glob("*.cmake"))
        used = any(f"../{d.name}/" in c.read_text()
                   for c in (TOP / "tools").rglob("*.cmake"))
        assert rules or used, f"tools/{d.name}: neither a program nor shared"
        for r in rules:
            assert f"/{d.name}/{r.name})" in text


def test_tools_cmake_included_by_name():
    text = (TOP / "tools" / "CMakeLists.txt").read_text()
    assert "GLOB" not in text
    included = re.findall(r"include\(\$\{CMAKE_CURRENT_SOURCE_DIR\}/(\S+)\)",
                          text)
    on_disk = sorted(str(p.relative_to(TOP / "tools"))
                     for p in (TOP / "tools").rglob("*.cmake"))
    assert sorted(included) == on_disk
    for inc in included:
        assert "/" in inc, f"{inc}: a program's rules live in its folder"


def test_assertions_on_in_the_build_the_tests_use():
    """The daemon the integration tests run keeps its assert()s: the pool's
    invariants are checked there too, not only in the unit tests."""
    import subprocess
    from lib.env import NBDFERRY
    r = subprocess.run(["nm", "-D", "--undefined-only", str(NBDFERRY)],
                       capture_output=True, text=True, check=True)
    assert "__assert_fail" in r.stdout, \
        f"{NBDFERRY} was built with NDEBUG: its assertions are off"


def test_tests_readme_lists_every_test_file():
    """tests/README.md's table names every tests/test_*.py, and no file
    that is gone."""
    text = (TESTS / "README.md").read_text()
    files = {p.name for p in TESTS.glob("test_*.py")}
    listed = set(re.findall(r"^\| `(test_[a-z0-9_]+\.py)` \|", text, re.M))
    assert files <= listed, f"not in tests/README.md: {sorted(files - listed)}"
    assert listed <= files, f"listed but gone: {sorted(listed - files)}"


def test_tests_readme_design_map_names_real_files():
    """The table from design sections to code and tests names only files
    that exist (a renamed source or test file must take its row along)."""
    text = (TESTS / "README.md").read_text()
    rows = re.findall(r"^\| [A-Z][^|]* \| (.*) \| (.*) \|$",
                      text.split("## From a design section", 1)[1]
                      .split("\n## ", 1)[0], re.M)
    assert len(rows) > 10
    gone = []
    for sources, tests in rows:
        gone += [s for s in re.findall(r"`([^`]+)`", sources)
                 if not (TOP / s).exists()]
        gone += [s for s in re.findall(r"`([^`]+)`", tests)
                 if not (TESTS / s).exists()]
    assert not gone, f"named in tests/README.md but missing: {gone}"


def test_every_fuzz_target_is_registered_and_replayed():
    """A fuzz target built only in the fuzz stage broke unseen there
    (fuzz-blkhash listed its library's sources by hand and lost a new
    one): each target is declared once (nbdferry_fuzz), the build writes
    the list the fuzz stage runs, and its replay runs in this build."""
    from lib.env import BUILD
    fuzz = TESTS / "fuzz"
    targets = sorted(p.stem for p in fuzz.glob("fuzz-*.c"))
    listed = (BUILD / "fuzz-targets.txt").read_text().split("\n")
    listed = sorted(line.split()[0] for line in listed
                    if line and not line.startswith("#"))
    assert listed == targets, "tests/fuzz/*-fuzz.cmake must nbdferry_fuzz() each"
    for t in targets:
        exe = BUILD / "tests" / f"replay-{t}"
        assert exe.is_file(), f"{exe} not built"
        assert any((fuzz / "corpus" / t).iterdir()), f"{t}: empty corpus"
    for d in (fuzz / "corpus").iterdir():
        assert d.name in targets, f"corpus/{d.name}: no such target"
    for c in (fuzz / "crashes").iterdir():
        assert f"fuzz-{c.name.split('-')[0]}" in targets, \
            f"crashes/{c.name}: name it TARGET-what (TARGET without fuzz-)"
    for p in fuzz.glob("*.cmake"):
        assert p.name == "fuzz.cmake" or "add_executable" not in \
            p.read_text(), f"{p.name}: fuzz targets are built by nbdferry_fuzz()"


def test_no_c_file_over_800_lines():
    """A file that grows past 800 lines holds more than one job: cut it by
    job (as manifest.c and manifest-file.c, rawfile.c and
    rawfile-views.c)."""
    import subprocess
    files = subprocess.run(["git", "-C", str(TOP), "ls-files", "*.c"],
                           capture_output=True, text=True,
                           check=True).stdout.split()
    big = {}
    for f in files:
        if f.startswith("tests/"):
            continue
        n = (TOP / f).read_text(errors="replace").count("\n")
        if n > 800:
            big[f] = n
    assert not big, f"C files over 800 lines: {big}"


def unit_test_names():
    """The ctest names tests/unit/*.cmake declares (add_test(NAME ...),
    foreach() loops expanded)."""
    names = set()
    loop = re.compile(r"foreach\((\w+)\s+([^)]*)\)(.*?)endforeach\(\)", re.S)
    add = re.compile(r"add_test\(\s*NAME\s+(\S+)")
    for p in (TESTS / "unit").glob("*.cmake"):
        text = p.read_text()
        for var, items, body in loop.findall(text):
            for item in items.split():
                names |= set(add.findall(body.replace(f"${{{var}}}", item)))
        names |= set(add.findall(loop.sub("", text)))
    return {n for n in names if "$" not in n}


# Programs under tests/unit that are not tests, and what runs them.
UNIT_PROGRAMS_NOT_TESTS = {
    "vhdx-mkfile.c": "builds VHDX files for test_vhdx_view.py and "
                     "test_verify_views.py (tests/unit/vhdx-build.h)",
}


def test_unit_tests_named_test_module():
    """Every C unit test is tests/unit/test-MODULE[-ASPECT].c and built
    by a tests/unit/*.cmake; a file with a main() of another name is a
    test misnamed (the helpers define none)."""
    cmake = "\n".join(p.read_text() for p in (TESTS / "unit").glob("*.cmake"))
    bad = []
    for c in sorted((TESTS / "unit").glob("*.c")):
        has_main = re.search(r"^int\s+main\s*\(", c.read_text(), re.M)
        if c.name.startswith("test-"):
            stem = c.stem[len("test-"):]
            built = re.search(rf"(?<![\w-]){re.escape(c.stem)}(?![\w-])",
                              cmake) or any(
                re.search(rf"test-{re.escape(head)}-\$\{{\w+\}}\.c", cmake)
                for head in [stem.rsplit("-", 1)[0]] if "-" in stem)
            if not has_main:
                bad.append(f"{c.name}: named as a test, has no main()")
            elif not built:
                bad.append(f"{c.name}: no tests/unit/*.cmake builds it")
        elif has_main and c.name not in UNIT_PROGRAMS_NOT_TESTS:
            bad.append(f"{c.name}: a test not named test-MODULE[-ASPECT].c")
    assert not bad, "\n".join(bad)


# Parts of a format's code without a unit test of that name, and where
# they are tested instead.  A part that gets its test leaves this list
# (the layout test fails until it does); a new format gets no entry.
FORMAT_UNIT_GAPS: dict = {}


def test_every_format_has_its_contract_unit_and_fuzz_tests():
    """Each format of the contract table (tests/lib/formats.py) runs every
    case of the view and inspector contract suites, has a C unit test
    (tests/unit/*.cmake) for its format, stream and synth code, and a fuzz
    target for its stream decoder (tests/fuzz/fuzz-FMT-stream.c)."""
    import subprocess
    import sys
    from lib.formats import FORMATS
    suites = ["tests/test_view_contract.py", "tests/test_inspector_contract.py"]
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only",
                        "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                        *suites], cwd=TOP, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, "collecting the contract suites failed:\n" + \
        r.stdout[-3000:] + r.stderr[-3000:]
    cases = {}
    for line in r.stdout.splitlines():
        m = re.match(r"(tests/\S+::\w+)(?:\[(.*)\])?$", line)
        if m:
            cases.setdefault(m[1], set()).update((m[2] or "").split("-"))
    assert len(cases) >= 10, r.stdout
    units = unit_test_names()
    missing = []
    for fmt in FORMATS:
        missing += [f"{fmt}: {case} does not run it" for case, params
                    in sorted(cases.items()) if fmt not in params]
        for part in ("format", "stream", "synth"):
            has = any(n == f"{fmt}-{part}" or n.startswith(f"{fmt}-{part}-")
                      for n in units)
            if has == ((fmt, part) in FORMAT_UNIT_GAPS):
                missing.append(f"{fmt}: unit test {fmt}-{part} " +
                               ("now exists: drop it from FORMAT_UNIT_GAPS"
                                if has else "missing (tests/unit/*.cmake)"))
        if not (TESTS / "fuzz" / f"fuzz-{fmt}-stream.c").is_file():
            missing.append(f"{fmt}: no fuzz target tests/fuzz/"
                           f"fuzz-{fmt}-stream.c")
    assert not missing, "\n".join(missing)


# The random-access members every format's table fills (common/format.h):
# imagefile/ reads any image through them and nothing else.
RANDOM_ACCESS_MEMBERS = ("image_new", "image_next", "image_supply",
                         "image_lookup", "image_free", "image_size",
                         "image_unit")


def format_table_members(fmt):
    """The members X/table.c's 'const struct nbdf_format X_format = {...}'
    initializer sets."""
    text = (TOP / fmt / "table.c").read_text()
    m = re.search(r"const struct nbdf_format \w+_format = \{(.*?)\n\};",
                  text, re.S)
    assert m, f"{fmt}/table.c: no 'const struct nbdf_format' table"
    return set(re.findall(r"\.(\w+)\s*=", m[1]))


def test_every_format_table_has_the_random_access_members():
    """Each format of the contract table (tests/lib/formats.py) fills the
    random-access members in its table file (X/table.c), so imagefile/ and
    nbdferry-verify read it without knowing which format it is; one with
    compressed units (.unpack) says how to decode them
    (.image_unpack_desc), one with a backing rule names its backing file
    (.image_has_backing, .image_backing)."""
    from lib.formats import FORMATS
    missing = []
    for fmt in FORMATS:
        have = format_table_members(fmt)
        want = set(RANDOM_ACCESS_MEMBERS)
        if "unpack" in have:
            want.add("image_unpack_desc")
        if "image_backing_rule" in have:
            want |= {"image_has_backing", "image_backing"}
        missing += [f"{fmt}/table.c: no .{m}" for m in sorted(want - have)]
    assert not missing, "\n".join(missing)


def test_docs_hold_no_benchmark_log():
    """docs/ is for users: the benchmark's generated tables, its history
    and plots live in bench/results/ (docs/benchmarks.md is the summary
    that links there)."""
    logs = sorted(p.name for p in (TOP / "docs").iterdir()
                  if p.name.startswith("benchmarks-") or
                  p.name.startswith("bench-") or p.suffix == ".png")
    assert not logs, f"benchmark logs in docs/: {logs}"
    assert (TOP / "bench" / "results" / "benchmarks-results.md").exists()


# Which rooms each room of the product may include (docs/design/README.md,
# "who calls whom"): calls go down only.  A room not listed may include
# common/ only.
MAY_INCLUDE = {
    "transport": {"common"},
    "imagefile": {"common"},
    "digest": {"common", "transport"},
    "manifest": {"common", "digest"},
    "views": {"common", "fs", "transport", "vhd", "vmdk", "qcow2", "vhdx"},
    "fs": {"common", "digest", "manifest", "transport"},
    "daemon": {"common", "digest", "fs", "views", "transport", "qcow2"},
    "tools": {"common", "transport", "digest", "vhd", "imagefile", "vmdk",
              "qcow2", "vhdx"},
}


def test_rooms_include_only_rooms_below():
    """No room reaches up: the mount (fs/) includes nothing of the
    daemon's or the views', the libraries nothing of the mount's; the
    daemon hands the mount what it needs (its view table, the export's
    record key for the manifest)."""
    inc = re.compile(r'^#include "([a-z0-9_]+)/', re.M)
    bad = []
    for src in list(TOP.glob("*/**/*.c")) + list(TOP.glob("*/**/*.h")):
        room = src.relative_to(TOP).parts[0]
        if room in ("tests", "bench", "build") or room.startswith("."):
            continue
        allowed = MAY_INCLUDE.get(room, {"common"}) | {room}
        for other in inc.findall(src.read_text(errors="replace")):
            if other not in allowed:
                bad.append(f"{src.relative_to(TOP)} includes {other}/")
    assert not bad, "\n".join(bad)


def test_docs_relative_links_resolve():
    """Every relative link of the user docs, the design notes, the READMEs
    and the benchmark pages names a file that exists (docs/benchmarks.md
    once linked ../bench/results/bench/results/...)."""
    link = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
    pages = [TOP / "README.md", TESTS / "README.md"]
    pages += list((TOP / "docs").rglob("*.md"))
    pages += list((TOP / "bench").rglob("*.md"))
    bad = []
    for page in pages:
        for target in link.findall(page.read_text(errors="replace")):
            if re.match(r"[a-z]+:", target):      # http:, mailto:
                continue
            if not (page.parent / target).exists():
                bad.append(f"{page.relative_to(TOP)}: {target}")
    assert not bad, "\n".join(bad)
