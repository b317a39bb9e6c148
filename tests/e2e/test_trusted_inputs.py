"""The trusted side against a hostile repo: every byte of it is data. One hostile repo per hole;
each test asserts the outcome and its reason, that nothing outside the repo leaked (a secret
file beside it appears in no result, report or output), that nothing crashed (exit code,
results.json written) and that nothing hung (timeouts).

The holes: links and `..` followed out of the repo (grader.toml's module path, the static
scan's imports, the private copy, the output folder `.grader/`); grader.toml of any shape;
source the scan cannot parse; trees deep, wide or full of FIFOs, sockets and device links;
a forged result left in `.grader/`. Links and FIFOs are made here, at test time."""

from __future__ import annotations

import csv
import io
import json
import os
import socket
import shutil
import subprocess
import tempfile
import sys
from pathlib import Path

import pytest

from tests.classbuild import make_class, unmarked
from tests.conftest import COURSE, FIXTURES, REPO_ROOT, as_nobody, build_submission, run_cli
from grader import repofiles, spec as specs
from grader.judge.integrity import scan_submission
from grader.submission import IGNORED, SubmissionError, open_submission

SECRET = "TA-ONLY-5f1c9e-do-not-show"
QUICK = ["--seed", "3", "--device", "cpu", "--dtype", "float32"]
VA = ["-a", "vector_add", "--case", "n=1"]
SM = ["-a", "softmax", "--case", "1x1"]


@pytest.fixture
def secret(tmp_path) -> Path:
    """A TA's root-only file outside every repo: Python that the scan would quote line by line."""
    folder = tmp_path / "ta-private"
    folder.mkdir(mode=0o700)
    path = folder / "answers.py"
    path.write_text(f"import subprocess  # {SECRET}\nos.system('{SECRET}')\nTOKEN = '{SECRET}'\n"
                    f"[assignments.vector_add]\nmodule = \"{SECRET}.py\"\n")
    path.chmod(0o600)
    return path


def repo(tmp_path: Path, name: str = "student") -> Path:
    return build_submission(tmp_path / name, "good")


def assert_no_leak(*texts: str | None) -> None:
    for text in texts:
        assert SECRET not in (text or ""), "the secret reached the student"


def leaked_anywhere(folder: Path) -> list[str]:
    """Files under `folder` (not following links; a walk without recursion, as trees here are
    deep) whose bytes hold the secret."""
    hits, stack = [], [str(folder)]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif entry.is_file(follow_symlinks=False) and SECRET.encode() in Path(entry.path).read_bytes():
                    hits.append(entry.path)
    return hits


_DEEP: list[Path] = []  # tests that made a deep tree: their folder is removed after them


@pytest.fixture(autouse=True)
def _remove_deep_trees(tmp_path):
    """pytest's own clean-up of old test folders recurses, and a tree 1,200 deep is past it: a
    test that made one has its folder removed at once, by `rm -r` (which does not recurse)."""
    yield
    if tmp_path in _DEEP:
        _DEEP.remove(tmp_path)
        subprocess.run(["rm", "-rf", "--one-file-system", str(tmp_path)], check=False)


def deep_folder(root: Path, name: str, depth: int) -> Path:
    """`root/name/name/...` `depth` levels deep, made one level at a time (a path this long is
    past what recursive helpers such as Path.mkdir(parents=True) can make). The test's folder
    is removed after it (see _remove_deep_trees)."""
    _DEEP.extend(p for p in root.parents if p.name.startswith("test_") and p.parent.name.startswith("pytest-"))
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir(name, dir_fd=fd)
            nxt = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        with os.fdopen(os.open("bottom.py", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "w") as f:
            f.write("x = 1\n")
    finally:
        os.close(fd)
    return root / name


def fifo(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    return path


def unix_socket(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.close()
    return path


# -- grader.toml as a whole ---------------------------------------------------------------------

TOML_FILES = {
    "syntax": (b"[assignments.vector_add\nmodule=", "grader.toml is not valid TOML"),
    "assignments-is-an-integer": (b"assignments = 5\n", "grader.toml: assignments must be a table"),
    "assignments-is-an-array": (b"assignments = [1, 2]\n", "grader.toml: assignments must be a table"),
    "5000-nested-arrays": (b"x = " + b"[" * 5000 + b"]" * 5000 + b"\n", "grader.toml is not valid TOML"),
    "huge": (b'x = "' + b"a" * 200_000 + b'"\n', "grader.toml is too large"),
    "not-utf8": (b"[assignments.vector_add]\nmodule = \"\xff\xfe.py\"\n", "grader.toml is not UTF-8 text"),
    "null-bytes": (b"[assignments.vector_add]\x00\nmodule = \"k.py\"\n", "grader.toml is not valid TOML"),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", list(TOML_FILES))
def test_a_grader_toml_that_cannot_be_read_is_one_line(tmp_path, name):
    content, message = TOML_FILES[name]
    root = repo(tmp_path)
    (root / "grader.toml").write_bytes(content)
    with pytest.raises(SubmissionError) as caught:
        open_submission(root)
    text = str(caught.value)
    assert text.startswith(message), text
    assert "\n" not in text and len(text) < 400


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind,message", [
    ("folder", "grader.toml is not a regular file (a folder)"),
    ("fifo", "grader.toml is not a regular file (a FIFO)"),
    ("socket", "grader.toml is not a regular file (a socket)"),
    ("link-out", "grader.toml leads outside the repository"),
    ("link-to-dev-zero", "grader.toml leads outside the repository"),
    ("link-to-a-fifo-outside", "grader.toml leads outside the repository"),
])
def test_grader_toml_that_is_not_a_file_of_the_repo_is_never_opened(tmp_path, secret, kind, message):
    root = repo(tmp_path)
    config = root / "grader.toml"
    if kind == "folder":
        config.mkdir()
    elif kind == "fifo":
        fifo(config)  # opened for reading, it would wait forever for a writer
    elif kind == "socket":
        unix_socket(config)
    elif kind == "link-out":
        config.symlink_to(secret)
    elif kind == "link-to-dev-zero":
        config.symlink_to("/dev/zero")  # endless bytes
    else:
        config.symlink_to(fifo(tmp_path / "elsewhere" / "pipe"))
    with pytest.raises(SubmissionError) as caught:
        open_submission(root)
    assert str(caught.value).startswith(message), caught.value
    assert_no_leak(str(caught.value))


def test_grader_toml_linked_to_a_file_inside_the_repo_still_works(tmp_path):
    root = repo(tmp_path)
    (root / "config").mkdir()
    (root / "config" / "grader.toml").write_text('[assignments.vector_add]\nfunction = "vector_add"\n')
    (root / "grader.toml").symlink_to("config/grader.toml")
    sub = open_submission(root)
    assert sub.overrides == {"vector_add": {"function": "vector_add"}} and not sub.problems


# -- grader.toml, one entry: that assignment's problem, the others untouched ----------------------

ENTRIES = {
    "entry-is-an-integer": ("[assignments]\nvector_add = 5\n", "must be a table with module and function, not a integer"),
    "module-is-an-integer": ("[assignments.vector_add]\nmodule = 5\n", "module must be a string, not a integer"),
    "module-is-a-table": ("[assignments.vector_add.module]\nx = 1\n", "module must be a string, not a table"),
    "module-is-a-date": ("[assignments.vector_add]\nmodule = 2025-01-01\n", "module must be a string"),
    "module-absolute": ('[assignments.vector_add]\nmodule = "/etc/passwd"\n', "is an absolute path"),
    "module-dotdot": ('[assignments.vector_add]\nmodule = "../../../../../../etc/passwd"\n', "leads outside the repository (..)"),
    "module-dotdot-inside": ('[assignments.vector_add]\nmodule = "kernels/../kernels/vector_add.py"\n', "leads outside the repository (..)"),
    "module-empty": ('[assignments.vector_add]\nmodule = ""\n', "module must be a path of 1 to"),
    "module-null": ('[assignments.vector_add]\nmodule = "k\\u0000.py"\n', "module must be a path of 1 to"),
    "module-huge": ('[assignments.vector_add]\nmodule = "' + "a/" * 4000 + 'x.py"\n', "module must be a path of 1 to"),
    "function-code": ("[assignments.vector_add]\nfunction = \"os.system('id')\"\n", "is not a Python function name"),
    "function-array": ("[assignments.vector_add]\nfunction = [\"a\"]\n", "function must be a string, not a array"),
    "unknown-key": ('[assignments.vector_add]\nmodule = "kernels/vector_add.py"\ncommand = "rm -rf /"\n', "may only set module and function"),
}


@pytest.mark.parametrize("name", list(ENTRIES))
def test_a_wrong_grader_toml_entry_is_that_assignments_problem(tmp_path, name):
    text, message = ENTRIES[name]
    root = repo(tmp_path)
    (root / "grader.toml").write_text(text)
    sub = open_submission(root)
    va, sm = COURSE.get("vector_add"), COURSE.get("softmax")
    assert message in sub.problem(va), sub.problem(va)
    assert sub.problem(va).startswith("grader.toml: [assignments.vector_add]") and "\n" not in sub.problem(va)
    assert not sub.has(va)
    assert sub.has(sm) and not sub.problem(sm)  # the other assignment is graded as usual


# -- the module: a link, a FIFO, a folder -----------------------------------------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind,message", [
    ("link-out", "leads outside the repository"),
    ("link-to-dev-zero", "leads outside the repository"),
    ("link-chain-out", "leads outside the repository"),
    ("fifo", "is not a regular file (a FIFO)"),
    ("folder", "is not a regular file (a folder)"),
    ("socket", "is not a regular file (a socket)"),
])
def test_a_module_that_is_not_a_file_of_the_repo_is_a_clear_problem(tmp_path, secret, kind, message):
    root = repo(tmp_path)
    module = root / "kernels" / "vector_add.py"
    module.unlink()
    if kind == "link-out":
        module.symlink_to(secret)
    elif kind == "link-to-dev-zero":
        module.symlink_to("/dev/zero")
    elif kind == "link-chain-out":  # a link to a link of the repo that leads out
        (root / "hop.py").symlink_to(secret)
        module.symlink_to("../hop.py")
    elif kind == "fifo":
        fifo(module)
    elif kind == "folder":
        module.mkdir()
    else:
        unix_socket(module)
    sub = open_submission(root)
    va = COURSE.get("vector_add")
    assert sub.problem(va) == f"the module kernels/vector_add.py {sub.problem(va).split('kernels/vector_add.py ', 1)[1]}"
    assert message in sub.problem(va) and not sub.has(va)
    assert_no_leak(sub.problem(va))


def test_a_module_linked_to_a_file_inside_the_repo_is_found(tmp_path):
    root = repo(tmp_path)
    (root / "src").mkdir()
    (root / "kernels" / "vector_add.py").rename(root / "src" / "add_impl.py")
    (root / "kernels" / "vector_add.py").symlink_to("../src/add_impl.py")
    sub = open_submission(root)
    found, problem = sub.locate(COURSE.get("vector_add"))
    assert found == (root / "src" / "add_impl.py").resolve() and problem == ""


# -- the static scan ----------------------------------------------------------------------------

def _scan_repo(tmp_path: Path, module_source: str) -> Path:
    root = tmp_path / "scan"
    (root / "kernels").mkdir(parents=True)
    (root / "kernels" / "k.py").write_text(module_source)
    return root


def test_the_scan_never_reads_through_a_link_out_of_the_repo(tmp_path, secret):
    root = _scan_repo(tmp_path, "from . import helper\nimport leak\nfrom kernels import deep\n")
    (root / "kernels" / "helper.py").symlink_to(secret)
    (root / "leak.py").symlink_to(secret)
    (root / "kernels" / "deep").mkdir()
    (root / "kernels" / "deep" / "__init__.py").symlink_to(secret)
    findings = scan_submission(root, "kernels/k.py")
    assert findings == []  # nothing of the secret file was read, so nothing in it was found
    assert_no_leak(json.dumps([f.to_dict() for f in findings]))


def test_the_scan_follows_a_link_to_a_file_inside_the_repo(tmp_path):
    root = _scan_repo(tmp_path, "from . import helper\n")
    (root / "kernels" / "real_helper.py").write_text("import subprocess\n")
    (root / "kernels" / "helper.py").symlink_to("real_helper.py")
    found = {(f.file, f.line, f.what) for f in scan_submission(root, "kernels/k.py")}
    assert ("kernels/real_helper.py", 1, "starts other programs") in found


@pytest.mark.parametrize("module", [
    "../ta-private/answers.py",  # a module path given with ..
    "kernels/../../ta-private/answers.py",
])
def test_the_scan_never_starts_outside_the_repo(tmp_path, secret, module):
    _scan_repo(tmp_path, "x = 1\n")
    (tmp_path / "scan").rename(tmp_path / "scanned")  # beside ta-private/
    assert scan_submission(tmp_path / "scanned", module) == []


def test_the_scan_takes_no_module_name_for_a_path(tmp_path, secret):
    """importlib.import_module with a path in it, or a relative import that climbs above the
    repo (32 dots), names nothing of the repo: no crash, nothing read."""
    (tmp_path / "ta-private" / "x.py").write_text(f"import ctypes  # {SECRET}\n")
    source = ("import importlib\n"
              "def never_run():\n"
              f"    from {'.' * 32} import x\n"
              "    from ..ta_private import answers\n"
              f"    importlib.import_module('{tmp_path}/ta-private/x')\n"
              "    importlib.import_module('../../ta-private/x')\n"
              "    importlib.import_module('/etc/passwd')\n"
              "    __import__('....x')\n")
    root = _scan_repo(tmp_path, source)
    findings = scan_submission(root, "kernels/k.py")
    assert findings == []  # x.py outside would be a finding (ctypes), quoting the secret line
    assert_no_leak(json.dumps([f.to_dict() for f in findings]))


@pytest.mark.timeout(120)
def test_source_the_parser_cannot_take_is_no_crash(tmp_path):
    big = "x = " + " + ".join(["1"] * 3000) + "\n"  # as deep as it is long
    root = _scan_repo(tmp_path, "import subprocess\nfrom . import deep, nul, huge, broken, pipe, wide\n")
    (root / "kernels" / "deep.py").write_text(big)
    (root / "kernels" / "nul.py").write_bytes(b"import os\x00\n")
    (root / "kernels" / "huge.py").write_text("import ctypes\n" + "# padding\n" * 300_000)
    (root / "kernels" / "broken.py").write_text("def f(:\n")
    (root / "kernels" / "wide.py").write_text("import os\n" + "os.system('x')\n" * 20_000)
    fifo(root / "kernels" / "pipe.py")
    findings = scan_submission(root, "kernels/k.py")
    found = {(f.file, f.what) for f in findings}
    assert ("kernels/k.py", "starts other programs") in found  # the module itself is still scanned
    assert ("kernels/deep.py", "nested too deeply for the scan to read (the scan cannot see it)") in found
    assert not any(f.file in ("kernels/huge.py", "kernels/pipe.py", "kernels/nul.py") for f in findings)
    assert len(findings) <= 201 and findings[-1].what.endswith("more findings, not listed")  # wide.py: bounded


def test_deep_trees_are_scanned_without_recursion():
    """The scan's walk is a loop: a tree far deeper than the interpreter's recursion limit (as a
    parser with a higher limit may produce) is read whole."""
    import ast

    from grader.judge.integrity import _Scanner

    node: ast.expr = ast.Attribute(ast.Name("os"), "environ")
    for _ in range(3 * sys.getrecursionlimit()):
        node = ast.BinOp(node, ast.Add(), ast.Attribute(ast.Name("os"), "environ"))
    target: ast.expr = ast.Attribute(ast.Name("torch"), "allclose")
    for _ in range(3 * sys.getrecursionlimit()):
        target = ast.Tuple([target], ast.Store())
    tree = ast.Module([ast.Import([ast.alias("os")]), ast.Expr(node), ast.Assign([target], ast.Constant(1))], [])
    scanner = _Scanner("k.py", "")
    scanner.scan(tree)
    whats = [f.what for f in scanner.findings]
    assert whats.count("reads environment variables") == 3 * sys.getrecursionlimit() + 1
    assert "replaces torch.allclose (monkeypatching)" in whats


def test_an_honest_submission_still_has_no_findings():
    for module in ("kernels/softmax.py", "kernels/vector_add.py", "kernels/conv2d.py"):
        assert scan_submission(FIXTURES / "good", module) == []


# -- the worker's private copy -------------------------------------------------------------------

@pytest.mark.timeout(120)
def test_the_private_copy_keeps_only_what_stays_inside(tmp_path, secret):
    root = repo(tmp_path)
    (root / "src").mkdir()
    (root / "src" / "impl.py").write_text("VALUE = 1\n")
    (root / "kernels" / "inside.py").symlink_to("../src/impl.py")
    (root / "kernels" / "inside_abs.py").symlink_to(root / "src" / "impl.py")  # absolute, yet inside
    (root / "src_link").symlink_to("src")  # a folder link inside
    (root / "loop").symlink_to(".")  # a cycle: never walked
    (root / "out.py").symlink_to(secret)
    (root / "zero.py").symlink_to("/dev/zero")
    (root / "up").symlink_to("..")
    fifo(root / "kernels" / "pipe.py")
    unix_socket(root / "sock")
    deep_folder(root, "d", 1200)  # deeper than any recursion
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text("[core]\n")
    sub = open_submission(root)
    left = sub.private_copy(tmp_path / "job" / "repo")
    copy = tmp_path / "job" / "repo"
    assert (copy / "kernels" / "inside.py").read_text() == "VALUE = 1\n"  # the link still works in the copy
    assert (copy / "kernels" / "inside_abs.py").read_text() == "VALUE = 1\n"
    assert os.readlink(copy / "kernels" / "inside_abs.py") == "../src/impl.py"  # relative: it points into the copy
    assert (copy / "src_link" / "impl.py").read_text() == "VALUE = 1\n" and os.readlink(copy / "loop") == "."
    for name in ("out.py", "zero.py", "up", "sock", "kernels/pipe.py", ".git"):
        assert not os.path.lexists(copy / name), name
    assert left == {"links that lead outside the repository": 3, "special files (FIFOs, sockets, devices)": 2,
                    "folders deeper than 64 levels": 1}
    assert leaked_anywhere(copy) == []
    for dirpath, dirs, names in os.walk(copy):  # every link of the copy resolves inside it
        for name in dirs + names:
            path = Path(dirpath) / name
            if path.is_symlink():
                assert repofiles.inside(os.path.realpath(copy), os.path.realpath(path)), path


def test_the_private_copy_is_bounded(tmp_path):
    root = tmp_path / "wide"
    root.mkdir()
    for i in range(30):
        (root / f"f{i}.py").write_text("x" * 100)
    left = repofiles.copy_tree(root, tmp_path / "copy", ignore=IGNORED, max_files=10, max_bytes=1 << 20)
    assert len(os.listdir(tmp_path / "copy")) == 10 and sum(left.values()) == 20
    left = repofiles.copy_tree(root, tmp_path / "copy2", ignore=IGNORED, max_bytes=1000)
    assert len(os.listdir(tmp_path / "copy2")) == 10 and sum(left.values()) == 20


def test_a_read_is_bounded_and_never_blocks(tmp_path):
    root = tmp_path / "r"
    root.mkdir()
    (root / "big").write_bytes(b"x" * 5000)
    with pytest.raises(repofiles.RepoFileError, match="is too large"):
        repofiles.read_bytes(root, "big", limit=4096)
    assert repofiles.read_bytes(root, "big", limit=5000) == b"x" * 5000
    fifo(root / "pipe")
    with pytest.raises(repofiles.RepoFileError, match="a FIFO"):
        repofiles.read_bytes(root, "pipe")
    with pytest.raises(FileNotFoundError):
        repofiles.read_bytes(root, "absent")
    with pytest.raises(repofiles.RepoFileError, match="absolute"):
        repofiles.read_bytes(root, "/etc/hostname")


# -- grader check, end to end ---------------------------------------------------------------------

def _check(root: Path, *args: str, cwd: Path | None = None, timeout: float = 600):
    """`grader check ROOT ARGS` with results in cwd/out (or, with cwd=root and no --json, .grader/)."""
    return run_cli(["check", str(root), *args], cwd or root.parent, timeout=timeout)


@pytest.mark.slow
def test_check_a_module_link_out_and_a_scan_link_out_leak_nothing(tmp_path, secret):
    """vector_add's module is a link to the TA's file; softmax imports (where it never runs) a
    helper linked to it and names it by `..` in grader.toml's sibling entry: vector_add fails with
    the reason, softmax passes, and no line of the TA's file reaches any output."""
    root = repo(tmp_path)
    (root / "kernels" / "vector_add.py").unlink()
    (root / "kernels" / "vector_add.py").symlink_to(secret)
    (root / "kernels" / "helper.py").symlink_to(secret)
    source = (root / "kernels" / "softmax.py").read_text()
    (root / "kernels" / "softmax.py").write_text(source + "\n\ndef _never_run():\n    from . import helper\n")
    out = tmp_path / "out"
    run = _check(root, *VA, *SM, *QUICK, "--json", str(out / "results.json"), "--html", str(out))
    assert run.returncode == 1, run.stdout + run.stderr
    assert run.results is not None and run.report is not None and "Traceback" not in run.stderr
    va = run.test("vector_add", "cannot be graded")
    assert va["status"] == "failed" and "kernels/vector_add.py leads outside the repository" in va["output"]
    assert run.test("softmax", "1x1 [float32]")["status"] == "passed"
    assert_no_leak(run.stdout, run.stderr, json.dumps(run.results), run.report)
    assert leaked_anywhere(out) == []


@pytest.mark.slow
def test_check_grader_toml_dotdot_and_absolute_modules_are_the_students_outcome(tmp_path, secret):
    root = repo(tmp_path)
    (root / "grader.toml").write_text(f'[assignments.vector_add]\nmodule = "../ta-private/answers.py"\n'
                                      f'[assignments.softmax]\nmodule = "{secret}"\n')
    run = _check(root, *VA, *SM, *QUICK, "--json", str(tmp_path / "out" / "results.json"), "--html", str(tmp_path / "out"))
    assert run.returncode == 1 and run.results is not None, run.stdout + run.stderr
    assert "leads outside the repository (..)" in run.test("vector_add", "cannot be graded")["output"]
    assert "is an absolute path" in run.test("softmax", "cannot be graded")["output"]
    assert run.results["score"] == 0
    assert_no_leak(run.stdout, run.stderr, json.dumps(run.results), run.report)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_check_survives_a_tree_of_fifos_sockets_devices_and_depth(tmp_path, secret):
    """vector_add's module is a FIFO (never opened: no hang); the repo holds a socket, a link to
    /dev/zero, a link out, a folder 1,200 deep and a never-run import of source the parser cannot
    take; softmax is graded as usual."""
    root = repo(tmp_path)
    (root / "kernels" / "vector_add.py").unlink()
    fifo(root / "kernels" / "vector_add.py")
    unix_socket(root / "kernels" / "sock.py")
    (root / "kernels" / "zero.py").symlink_to("/dev/zero")
    (root / "kernels" / "out.py").symlink_to(secret)
    deep_folder(root, "deep", 1200)
    (root / "kernels" / "expr.py").write_text("x = " + " + ".join(["1"] * 3000) + "\n")
    source = (root / "kernels" / "softmax.py").read_text()
    (root / "kernels" / "softmax.py").write_text(
        source + f"\n\ndef _never_run():\n    from {'.' * 32} import x\n    from . import expr, zero, sock, out\n")
    run = _check(root, *VA, *SM, *QUICK, "--json", str(tmp_path / "out" / "results.json"), "--html", str(tmp_path / "out"))
    assert run.returncode == 1 and run.results is not None, run.stdout + run.stderr
    assert "is not a regular file (a FIFO)" in run.test("vector_add", "cannot be graded")["output"]
    assert run.test("softmax", "1x1 [float32]")["status"] == "passed"
    softmax = run.results["extra_data"]["assignments"]["softmax"]
    notes = " ".join(softmax["notes"])
    assert "Not copied for grading: " in notes and "links that lead outside the repository" in notes
    assert "special files (FIFOs, sockets, devices)" in notes and "folders deeper than 64 levels" in notes
    assert any("nested too deeply for the scan to read" in w["what"] for w in softmax["integrity_warnings"])
    assert_no_leak(run.stdout, run.stderr, json.dumps(run.results), run.report)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["assignments-is-an-integer", "5000-nested-arrays", "not-utf8", "fifo", "link-out"])
def test_check_with_an_unreadable_grader_toml_says_so_in_one_line(tmp_path, secret, kind):
    root = repo(tmp_path)
    if kind == "fifo":
        fifo(root / "grader.toml")
    elif kind == "link-out":
        (root / "grader.toml").symlink_to(secret)
    else:
        (root / "grader.toml").write_bytes(TOML_FILES[kind][0])
    run = _check(root, *VA, *QUICK, "--json", str(tmp_path / "out" / "results.json"), "--html", str(tmp_path / "out"),
                 timeout=120)
    assert run.returncode == 2, run.stdout + run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: grader.toml") and "Traceback" not in run.stderr
    assert_no_leak(run.stdout, run.stderr)


@pytest.mark.slow
def test_check_never_follows_a_committed_output_folder(tmp_path, secret):
    """`.grader/` committed with report.html a link to a TA's file and a forged results.json:
    the TA's file is unchanged, the forged file is gone even when the check stops at once, and
    a full check writes its own files into a real folder."""
    root = repo(tmp_path)
    victim = tmp_path / "ta-private" / "victim.html"
    victim.write_text(SECRET)
    (root / ".grader").mkdir()
    (root / ".grader" / "report.html").symlink_to(victim)
    (root / ".grader" / ".gitignore").symlink_to(secret)
    (root / ".grader" / "results.json").write_text('{"score": 100, "forged": true}')
    stopped = _check(root, "-a", "nope", cwd=root, timeout=120)  # a check that stops before grading
    assert stopped.returncode == 2 and "unknown assignment" in stopped.stderr
    assert not (root / ".grader" / "results.json").exists() and not os.path.lexists(root / ".grader" / "report.html")
    run = _check(root, *VA, *QUICK, cwd=root)
    assert run.returncode == 0, run.stdout + run.stderr
    assert victim.read_text() == SECRET and SECRET in secret.read_text()  # nothing written through the links
    for name in ("report.html", "results.json", ".gitignore"):
        path = root / ".grader" / name
        assert path.is_file() and not path.is_symlink(), name
    results = json.loads((root / ".grader" / "results.json").read_text())
    assert "forged" not in results and results["tests"]
    assert_no_leak(run.stdout, run.stderr, (root / ".grader" / "report.html").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["link-to-folder", "file", "fifo"])
def test_check_replaces_an_output_folder_that_is_not_a_folder(tmp_path, kind):
    root = repo(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if kind == "link-to-folder":
        (root / ".grader").symlink_to(elsewhere)
    elif kind == "file":
        (root / ".grader").write_text("not a folder")
    else:
        fifo(root / ".grader")
    run = _check(root, *VA, *QUICK, cwd=root)
    assert run.returncode == 0, run.stdout + run.stderr
    assert (root / ".grader").is_dir() and not (root / ".grader").is_symlink()
    assert (root / ".grader" / "results.json").is_file() and os.listdir(elsewhere) == []


# -- as an ordinary user ---------------------------------------------------------------------------

def _as_nobody_works(tmp: Path) -> str:
    """'' where this Python and the grader can run as uid 65534 (conftest.as_nobody: a private
    mount namespace makes an interpreter under a closed home folder reachable); else why not."""
    if os.geteuid() != 0:
        return "not root: cannot switch to an ordinary user"
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), HOME=str(tmp))
    probe = subprocess.run(as_nobody(tmp, env, "-c", "import torch, triton, typer, grader.cli"), cwd=tmp,
                           capture_output=True, text=True, timeout=300)
    if probe.returncode != 0:
        return ("this Python's packages cannot be imported by an ordinary user here: "
                + (probe.stderr.strip().splitlines() or ["?"])[-1])
    return ""


@pytest.mark.slow
def test_check_as_an_ordinary_user_neither_reads_nor_writes_through_links(tmp_path, secret):
    """As uid 65534: a root-only TA file linked as the module and as .grader/report.html, and a
    grader.toml no one may read: one line each, nothing written through the link."""
    base = Path(tempfile.mkdtemp(prefix="grader-nobody-"))  # under /tmp: every folder above it is open to uid 65534
    base.chmod(0o755)
    try:
        _check_as_nobody(base, secret)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _check_as_nobody(base: Path, secret: Path) -> None:
    why = _as_nobody_works(base)
    if why:
        pytest.skip(why)
    root = repo(base)
    (root / ".grader").mkdir()
    (root / ".grader" / "report.html").symlink_to(secret)
    (root / "grader.toml").write_text("[assignments.vector_add]\n")
    (root / "grader.toml").chmod(0)
    subprocess.run(["chown", "-R", "65534:65534", str(root)], check=True)
    cache = base / "cache"
    cache.mkdir()
    os.chown(cache, 65534, 65534)
    # the course's secret file is the TA's (root's here): a course run by this user would be its own
    env = dict(os.environ, COLUMNS="200", PYTHONPATH=str(REPO_ROOT), HOME=str(cache), GRADER_CACHE_DIR=str(cache),
               GRADER_COURSE_SECRET="a-course-secret-of-this-user")
    cmd = as_nobody(root, env, "-m", "grader", "check", str(root), *VA, *QUICK)
    run = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 2 and "error: grader.toml cannot be read (Permission denied)" in run.stderr, run.stderr
    assert not os.path.lexists(root / ".grader" / "report.html")  # the link is gone, the TA's file untouched
    assert SECRET in secret.read_text() and secret.stat().st_uid == 0
    (root / "grader.toml").unlink()
    (root / "kernels" / "vector_add.py").unlink()
    (root / "kernels" / "vector_add.py").symlink_to(secret)
    os.lchown(root / "kernels" / "vector_add.py", 65534, 65534)
    run = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 1, run.stdout + run.stderr
    assert (root / ".grader" / "results.json").is_file(), run.stdout + run.stderr
    results = json.loads((root / ".grader" / "results.json").read_text())
    va = next(t for t in results["tests"] if t["name"] == "vector_add: cannot be graded")
    assert "leads outside the repository" in va["output"]
    assert_no_leak(run.stdout, run.stderr, json.dumps(results), (root / ".grader" / "report.html").read_text())


# -- grader grade, a class with hostile students beside a good one ----------------------------------

@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_batch_grades_hostile_students_as_students_and_the_good_one_intact(tmp_path, secret):
    """alice: good. mallory: a grader.toml syntax error (her mistake: graded, failed with the
    reason, never infra_error). trent: vector_add a committed link to the TA's file, a never-run
    helper import linked to it, and a 3,000-term expression the scan cannot parse. oscar:
    grader.toml `assignments = 5` and a folder 1,200 deep. sybil: a syntax error in vector_add,
    null bytes in softmax (the student's error, with the reason). Nothing of the TA's file reaches the
    class folder; alice's grade is what a good student's is."""
    root = tmp_path / "class"
    roster = make_class(root, {"alice": "good"})
    for name, setup in (("mallory", _mallory), ("trent", _trent), ("oscar", _oscar), ("sybil", _sybil)):
        student = build_submission(root / "repos" / name, "good")
        setup(student, secret)
        subprocess.run(["git", "init", "-q", "-b", "main"], cwd=student, check=True)
        from tests.classbuild import commit

        commit(student, "submission", "2025-01-10T12:00:00+00:00")
        roster.write_text(roster.read_text() + f"{name},repos/{name}\n")
    fetched = run_cli(["fetch", "--roster", str(roster), "--out", "ws"], root, timeout=300)
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    run = run_cli(["grade", "--lock", "ws/lock.json", "--out", "out", "--device", "cpu", "--jobs", "2", "-a", "vector_add",
                   "-a", "softmax", "--case", "n=1", "--case", "1x1", "--dtype", "float32", "--seed", "3"], root, timeout=1100)
    out = root / "out"
    assert run.returncode == 0, run.stdout + run.stderr
    assert "10 jobs graded, 0 infra errors" in run.stdout, run.stdout
    rows = {row["student"]: {unmarked(k): v for k, v in row.items()}  # a partial run's columns
            for row in csv.DictReader(io.StringIO((out / "grades.csv").read_text()))}
    assert (rows["alice"]["vector_add"], rows["alice"]["softmax"]) == ("0.13", "0.25")  # a good student's share, intact

    def test_of(student: str, assignment: str, name: str) -> dict:
        record = json.loads((out / "students" / student / "jobs" / f"{assignment}.json").read_text())
        assert record["status"] == "graded", record["error"]
        return next(t for t in record["result"]["tests"] if t["name"] == name)

    for assignment in ("vector_add", "softmax"):
        t = test_of("mallory", assignment, "cannot be graded")
        assert t["outcome"] == "failed" and t["message"].startswith("grader.toml is not valid TOML"), t
        t = test_of("oscar", assignment, "cannot be graded")
        assert "grader.toml: assignments must be a table" in t["message"], t
    assert "leads outside the repository" in test_of("trent", "vector_add", "cannot be graded")["message"]
    assert test_of("trent", "softmax", "1x1 [float32]")["outcome"] == "passed"
    # a module that does not import: one error that says why, not one per case
    assert test_of("sybil", "vector_add", "import")["outcome"] == "error"
    assert "SyntaxError" in test_of("sybil", "vector_add", "import")["message"]
    assert "null bytes" in test_of("sybil", "softmax", "import")["message"]
    assert rows["mallory"]["total"] == "0" and rows["sybil"]["total"] == "0" and rows["trent"]["softmax"] == "0.25"
    trent = (out / "students" / "trent" / "results.json").read_text()
    assert "nested too deeply for the scan to read" in trent
    assert leaked_anywhere(out) == [] and leaked_anywhere(root / "ws") == []
    assert_no_leak(run.stdout, run.stderr)


def _mallory(student: Path, secret: Path) -> None:
    (student / "grader.toml").write_text("[assignments.vector_add\nmodule=")


def _trent(student: Path, secret: Path) -> None:
    (student / "kernels" / "vector_add.py").unlink()
    (student / "kernels" / "vector_add.py").symlink_to(secret)
    (student / "kernels" / "helper.py").symlink_to(secret)
    (student / "kernels" / "expr.py").write_text("x = " + " + ".join(["1"] * 3000) + "\n")
    source = (student / "kernels" / "softmax.py").read_text()
    (student / "kernels" / "softmax.py").write_text(source + "\n\ndef _never_run():\n    from . import helper, expr\n")


def _sybil(student: Path, secret: Path) -> None:
    (student / "kernels" / "vector_add.py").write_text("def vector_add(:\n")
    with open(student / "kernels" / "softmax.py", "ab") as f:
        f.write(b"\nx = 1\x00\n")


def _oscar(student: Path, secret: Path) -> None:
    (student / "grader.toml").write_text("assignments = 5\n")
    deep_folder(student, "d", 1200)


# -- Gradescope's run_autograder: a flat upload's modules are looked for in the student's tree ------

@pytest.mark.timeout(120)
def test_gradescopes_module_search_neither_follows_nor_writes_through_links(tmp_path, secret):
    from grader.kit.gradescope import locate_modules

    upload = tmp_path / "submission"
    upload.mkdir()
    deep_folder(upload, "d", 1200)  # searched without recursion; too deep to be looked in
    (upload / "notes").symlink_to(secret.parent)  # a folder link out: not searched
    (secret.parent / "vector_add.py").write_text(f"# {SECRET}\n")
    (upload / "softmax.py").symlink_to(secret)  # a link is not the student's file
    (upload / "kernels").mkdir()
    fifo(upload / "kernels" / "layernorm.py")
    (upload / "grader.toml").symlink_to(secret.parent / "course.toml")  # written through, it would change a TA's file
    (secret.parent / "course.toml").write_text("")
    assert locate_modules(upload, ["vector_add", "softmax", "layernorm"]) == []  # grader.toml leads out: left to grader check
    (upload / "grader.toml").unlink()
    (upload / "vector_add.py").write_text("# the student's\n")
    assert locate_modules(upload, ["vector_add", "softmax", "layernorm"]) == [
        "vector_add: kernels/vector_add.py not found; grading vector_add.py"]
    assert (secret.parent / "course.toml").read_text() == "" and not (upload / "grader.toml").is_symlink()
    assert open_submission(upload).target(COURSE.get("vector_add"))[0] == "vector_add.py"
    assert_no_leak((upload / "grader.toml").read_text())


@pytest.mark.timeout(60)
def test_gradescopes_module_search_takes_any_grader_toml(tmp_path):
    from grader.kit.gradescope import locate_modules

    (tmp_path / "vector_add.py").write_text("# the student's\n")
    for content in (TOML_FILES["5000-nested-arrays"][0], b"assignments = 5\n", b"\xff\xfe"):
        (tmp_path / "grader.toml").write_bytes(content)
        assert locate_modules(tmp_path, ["vector_add"]) == []  # grader check says what is wrong with it
        assert (tmp_path / "grader.toml").read_bytes() == content


# -- a Ray batch: the submission travels as the private copy would hold it ---------------------------

@pytest.mark.timeout(120)
def test_a_submission_travels_to_a_node_without_what_leads_out(tmp_path, secret):
    from grader.batch.executors import _unpack, pack_repo

    root = repo(tmp_path)
    (root / "kernels" / "inside.py").symlink_to("vector_add.py")
    (root / "kernels" / "out.py").symlink_to(secret)  # a link out: the node's archive filter refuses it
    fifo(root / "kernels" / "pipe.py")
    deep_folder(root, "d", 1200)
    dest = tmp_path / "node"
    _unpack(pack_repo(root), dest)
    assert (dest / "kernels" / "inside.py").read_text() == (root / "kernels" / "vector_add.py").read_text()
    assert not os.path.lexists(dest / "kernels" / "out.py") and not os.path.lexists(dest / "kernels" / "pipe.py")
    assert leaked_anywhere(dest) == []


def test_a_course_secret_this_user_cannot_read_is_one_line_before_grading(tmp_path, monkeypatch):
    """A TA running the grader as a user who cannot read the course's secret (or a secret that is
    not text) gets one line that says which file and what to do, not a traceback mid-grade."""
    from pathlib import Path as _Path

    from grader import spec as specs_module
    from grader.judge.context import ContextError, resolve

    course = tmp_path / "course"
    (course / "assignments").mkdir(parents=True)
    secret = course / specs_module.SECRET_FILE
    graded = specs_module.Course(course)
    secret.write_bytes(b"\xff\xfe not text")
    with pytest.raises(ContextError, match="course-secret.txt cannot be read \\(not text\\).*GRADER_COURSE_SECRET"):
        resolve("cpu", 1, course=graded)
    secret.write_text("s3cret\n")
    real_read = _Path.read_text

    def refused(self, *args, **kwargs):
        if self == secret:
            raise PermissionError(13, "Permission denied", str(self))
        return real_read(self, *args, **kwargs)

    monkeypatch.setattr(_Path, "read_text", refused)
    with pytest.raises(ContextError, match="cannot be read \\(Permission denied\\): run as a user who can read it"):
        resolve("cpu", 1, course=graded)
    monkeypatch.setattr(_Path, "read_text", real_read)
    assert resolve("cpu", 1, course=graded).seed == 1 and graded.secret() == "s3cret"
