"""Static scan of a submission: what in its source a TA should look at.

The sandbox stops what a submission can do; this says what it tried to. It reads (never
imports) the assignment's module and every module of the repo that it imports, and lists
imports and calls that a GPU kernel has no use for: starting processes, the network,
native code through ctypes, the grader's or the reference's modules, the environment,
/proc, patching torch or the interpreter, code built at run time; and files in the repo
that would shadow a module the worker imports. Each finding is a warning for a TA, with
file, line and code, and never a verdict on its own: the score is unchanged.

The scan reads the student's files as data: only files inside the repo (links and relative
imports that climb out are not followed, `grader.repofiles`), regular files of bounded size,
a bounded number of them; a file it cannot parse (a syntax error, nesting too deep for the
parser) is skipped or named, and the tree is walked without recursion, so no source can
crash or stall it.

Beside the scan, the evidence of a run that the student's own Triton kernel did the work
(`OwnKernelCheck`, fed by every correctness call). The other integrity checks are stages of
their own: the bounds check's interpreter replay (grader.judge.grade.bounds_check) and the
timing's conduct findings (grader.judge.perf).
"""

from __future__ import annotations

import ast
import os
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from grader import repofiles
from grader.payloads import IntegrityPayload, Kind
from grader.results import Outcome, Severity, TestResult

if TYPE_CHECKING:
    from grader.judge.plan import PlannedCall
    from grader.spec import Assignment

MODULE_WARNINGS = {
    "subprocess": "starts other programs",
    "multiprocessing": "starts processes",
    "pty": "starts processes",
    "socket": "opens network connections",
    "http": "opens network connections",
    "urllib": "opens network connections",
    "requests": "opens network connections",
    "ssl": "opens network connections",
    "ftplib": "opens network connections",
    "smtplib": "opens network connections",
    "ctypes": "calls native code directly (it can patch or crash the process)",
    "cffi": "calls native code directly (it can patch or crash the process)",
    "grader": "imports the grader itself",
    "reference": "imports the reference solutions",
    "builtins": "reaches into Python's built-ins",
    "signal": "handles signals (a timeout is a signal)",
    "gc": "walks the interpreter's objects (the worker's own included)",
}
CALL_WARNINGS = {
    "os.system": "starts other programs", "os.popen": "starts other programs",
    "os.posix_spawn": "starts other programs",
    "os.posix_spawnp": "starts other programs", "os.fork": "starts processes", "os.forkpty": "starts processes",
    "os.kill": "sends signals to processes", "os.killpg": "sends signals to processes",
    "os.setsid": "detaches from its process group", "os.setpgrp": "detaches from its process group",
    "os._exit": "ends the worker process", "os.abort": "ends the worker process",
    "os.getenv": "reads environment variables", "os.getenvb": "reads environment variables",
    "sys._getframe": "inspects the caller's frames (the worker's own)", "sys.settrace": "traces the interpreter",
    "sys.setprofile": "traces the interpreter", "importlib.reload": "reloads modules",
    "torch.ops.load_library": "loads native code", "torch.utils.cpp_extension.load": "compiles and loads native code",
    "torch.utils.cpp_extension.load_inline": "compiles and loads native code",
    "exec": "runs code built at run time (the scan cannot see it)",
    "eval": "runs code built at run time (the scan cannot see it)",
    "compile": "builds code at run time (the scan cannot see it)", "__import__": "imports a module named at run time",
    "importlib.import_module": "imports a module named at run time", "setattr": "sets an attribute by name",
}
PREFIX_CALL_WARNINGS = {"os.exec": "replaces the process with another program", "os.spawn": "starts other programs"}
ATTRIBUTE_WARNINGS = {"os.environ": "reads environment variables", "os.environb": "reads environment variables",
                      "sys.modules": "reaches into loaded modules (the worker's own)",
                      "sys.argv": "reads the worker's command line"}
PATCHED_MODULES = {"torch", "triton", "numpy", "safetensors", "grader", "builtins", "os", "sys", "math", "importlib"}
STRING_WARNINGS = {"/proc": "reads /proc (other processes, the grader's command line)",
                   "results.json": "names the results file",
                   "reference/": "names the reference folder", "GRADER_": "names a grader setting"}
MAX_FILES = 500  # modules of the repo scanned for one assignment
MAX_FINDINGS = 200
SHADOWED = ("grader", "torch", "triton", "numpy", "safetensors", "sitecustomize", "usercustomize")


@dataclass(frozen=True)
class SourceFinding:
    file: str
    line: int
    code: str
    what: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.code}: {self.what}"

    def to_dict(self) -> dict:
        return asdict(self)


def scan_submission(root: Path, module: str) -> list[SourceFinding]:
    """Findings in `module` (a path relative to `root`) and the repo's modules it imports."""
    root = Path(repofiles.real_root(root))
    findings: list[SourceFinding] = []
    for name in SHADOWED:
        for candidate in (name, f"{name}.py"):
            if os.path.lexists(root / candidate):  # its name is the finding: nothing is followed or read
                kind = "folder" if (root / candidate).is_dir() and not (root / candidate).is_symlink() else "file"
                findings.append(SourceFinding(candidate, 0, f"the {kind} {candidate}",
                                              f"shadows the module {name} that the worker imports"))
    todo = [module]
    seen: set[Path] = set()
    while todo and len(seen) < MAX_FILES:
        try:
            path = repofiles.regular_file(root, todo.pop())
        except repofiles.RepoFileError:
            continue  # out of the repo, or not a file: never read
        if path is None or path in seen:
            continue
        seen.add(path)
        rel = str(path.relative_to(root))
        try:
            source = repofiles.read_text(root, rel)
            tree = repofiles.parse_python(source, filename=rel)
        except (SyntaxError, ValueError, OSError, repofiles.RepoFileError):
            continue  # the worker reports a syntax error with the student's line; nothing to scan
        except (RecursionError, MemoryError):
            findings.append(SourceFinding(rel, 0, "",
                                          "nested too deeply for the scan to read (the scan cannot see it)"))
            continue
        scanner = _Scanner(rel, source)
        scanner.scan(tree)
        findings += scanner.findings
        todo += [str(p.relative_to(root)) for p in _local_modules(root, path, scanner.imports) if p not in seen]
    found = sorted(set(findings), key=lambda f: (f.file, f.line, f.what))
    if len(found) > MAX_FINDINGS:
        found = found[:MAX_FINDINGS] + [SourceFinding("", 0, "",
                                                      f"and {len(found) - MAX_FINDINGS} more findings, not listed")]
    return found


def summary(findings: list[SourceFinding], limit: int = 4) -> str:
    shown = "; ".join(map(str, findings[:limit])) + (f"; and {len(findings) - limit} more" if len(findings) > limit
                                                     else "")
    return f"Static scan, for a TA to review (not a verdict, the score is unchanged): {shown}"


def _local_modules(root: Path, path: Path, imports: list[tuple[str, int, list[str]]]) -> list[Path]:
    """Files of the repo that these imports name (absolute from the root, or relative); a
    relative import that climbs above the repo, or a name that is not a module name, names
    nothing of the repo."""
    found = []
    depth = len(path.relative_to(root).parts) - 1  # folders between the root and the file
    for module, level, names in imports:
        if level - 1 > depth:
            continue  # `from ....x import y` above the repo: not the repo's
        base = root if level == 0 else path.parents[level - 1]
        parts = module.split(".") if module else []
        if not all(p.isidentifier() for p in parts):
            continue  # importlib.import_module("../../x") names no module of the repo
        for dotted in [parts] + [parts + [n] for n in names if n.isidentifier()]:
            if not dotted:
                continue
            target = base.joinpath(*dotted)
            for p in (target.with_suffix(".py"), target / "__init__.py"):
                try:
                    real = repofiles.regular_file(root, p.relative_to(root))
                except repofiles.RepoFileError:
                    continue
                if real is not None:
                    found.append(real)
    return found


class _Scanner(ast.NodeVisitor):
    def __init__(self, file: str, source: str) -> None:
        self.file, self.lines = file, source.splitlines()
        self.aliases: dict[str, str] = {}  # local name -> dotted name it was imported as
        self.imports: list[tuple[str, int, list[str]]] = []
        self.findings: list[SourceFinding] = []

    def scan(self, tree: ast.AST) -> None:
        """Visit every node in source order, with an explicit stack: an expression of thousands
        of terms is as deep as it is long, and recursion would run out."""
        stack = [tree]
        while stack:
            node = stack.pop()
            visitor = getattr(self, f"visit_{type(node).__name__}", None)
            if visitor is not None:
                visitor(node)
            stack.extend(reversed(list(ast.iter_child_nodes(node))))

    def _add(self, node: ast.AST, what: str) -> None:
        line = getattr(node, "lineno", 0)
        code = self.lines[line - 1].strip() if 0 < line <= len(self.lines) else ""
        self.findings.append(SourceFinding(self.file, line, code[:120], what))

    def _module(self, node: ast.AST, dotted: str) -> None:
        top = dotted.split(".")[0]
        if dotted.startswith("http.") or top in MODULE_WARNINGS:
            self._add(node, MODULE_WARNINGS.get(top, "opens network connections"))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._module(node, alias.name)
            self.aliases[alias.asname
                         or alias.name.split(".")[0]] = alias.name if alias.asname else alias.name.split(".")[0]
            self.imports.append((alias.name, 0, []))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level == 0 and node.module:
            self._module(node, node.module)
        for alias in node.names:
            self.aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}" if node.module else alias.name
        self.imports.append((node.module or "", node.level, [a.name for a in node.names]))

    def _dotted(self, node: ast.AST) -> str | None:
        """`o.path.join` -> "os.path.join" when `o` is `import os as o`; None if not a name chain."""
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        parts.append(self.aliases.get(node.id, node.id))
        return ".".join(reversed(parts))

    def visit_Call(self, node: ast.Call) -> None:
        name = self._dotted(node.func)
        if name:
            what = CALL_WARNINGS.get(name) or next((w for p, w in PREFIX_CALL_WARNINGS.items() if name.startswith(p)),
                                                   None)
            if (name in ("importlib.import_module", "__import__") and node.args
                    and isinstance(node.args[0], ast.Constant)):
                target = str(node.args[0].value)
                self._module(node, target)  # a name in plain sight: judged like an import
                self.imports.append((target, 0, []))
                what = None
            elif name == "setattr" and node.args:
                base = self._dotted(node.args[0])
                what = (f"sets an attribute of {base} by name (patching it?)"
                        if base and base.split(".")[0] in PATCHED_MODULES else None)
            if what:
                self._add(node, what)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        name = self._dotted(node)
        if name in ATTRIBUTE_WARNINGS:
            self._add(node, ATTRIBUTE_WARNINGS[name])

    def visit_Name(self, node: ast.Name) -> None:
        name = self.aliases.get(node.id)
        if name in ATTRIBUTE_WARNINGS:  # from os import environ
            self._add(node, ATTRIBUTE_WARNINGS[name])

    def _patched(self, target: ast.AST) -> None:
        stack = [target]
        while stack:
            node = stack.pop()
            if isinstance(node, ast.Attribute):
                name = self._dotted(node)
                if name and name.split(".")[0] in PATCHED_MODULES:
                    self._add(node, f"replaces {name} (monkeypatching)")
            elif isinstance(node, (ast.Tuple, ast.List)):
                stack.extend(reversed(node.elts))

    def visit_Assign(self, node: ast.Assign) -> None:
        for t in node.targets:
            self._patched(t)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._patched(node.target)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str):
            for needle, what in STRING_WARNINGS.items():
                if needle in node.value:
                    self._add(node, what)


# -- a run's evidence: the student's own kernel did the work ---------------------------------------

def trivial_result(saved: dict, inputs: dict) -> bool:
    """A result that proves nothing about a kernel: empty, all zeros, or a copy of an input (a
    dropout at p=1 or p=0, say). Returning it without a launch is a legitimate shortcut."""
    import torch

    outputs = [v for k, v in saved.items() if k == "output" or k.startswith("output.")]
    given = [v for v in inputs.values() if isinstance(v, torch.Tensor)]

    def trivial(out: torch.Tensor) -> bool:
        return (out.numel() == 0 or not bool(out.any())
                or any(g.shape == out.shape and g.dtype == out.dtype and torch.equal(g.cpu(), out) for g in given))

    return bool(outputs) and all(trivial(o) for o in outputs)


class OwnKernelCheck:
    """Evidence that the student's own Triton kernel did the work: which aten ops the call
    dispatched (a forbidden one means torch computed the answer: conclusive) and how many kernels
    launched (a right result with no launch is for a TA to review, and costs only those cases;
    a trivial result, all zeros or a copy of an input, proves nothing either way)."""

    def __init__(self, spec: Assignment) -> None:
        self.spec = spec
        self.forbidden: dict[str, list[str]] = {}
        self.no_kernel: list = []
        self.kernels: Counter[str] = Counter()
        self.observed = 0
        self.all_trivial = True

    def observe(self, call: PlannedCall, reply: dict, passed: bool, trivial: bool = False) -> None:
        self.observed += 1
        self.all_trivial = self.all_trivial and trivial
        self.kernels.update(reply["launches"])
        for op in sorted(set(reply["ops"]) & self.spec.forbidden_ops):
            self.forbidden.setdefault(op, []).append(call.id)
        if passed and not reply["launches"] and not trivial:
            self.no_kernel.append(call)

    def test(self) -> TestResult:
        name = "uses its own Triton kernel"
        if not self.observed:
            return TestResult(self.spec.name, Kind.INTEGRITY, name, Outcome.SKIPPED,
                              "no call completed, so nothing to inspect")
        launched = dict(self.kernels)
        if self.forbidden:
            evidence = [f"torch computed the result: {op} ran inside {self.spec.function}() in {few(ids)}"
                        for op, ids in self.forbidden.items()]
            return TestResult(self.spec.name, Kind.INTEGRITY, name, Outcome.FLAGGED, "; ".join(evidence),
                              details=IntegrityPayload(kernels_launched=launched, evidence=evidence),
                              severity=Severity.CONCLUSIVE)
        if self.no_kernel:
            evidence = [f"no Triton kernel was launched in {few([c.id for c in self.no_kernel])}, yet the result was "
                        f"right"]
            concerns = [c.test_name for c in self.no_kernel]
            return TestResult(self.spec.name, Kind.INTEGRITY, name, Outcome.FLAGGED, evidence[0],
                              details=IntegrityPayload(kernels_launched=launched, evidence=evidence, concerns=concerns),
                              severity=Severity.REVIEW)
        if not self.kernels:  # nothing ran: there is nothing to vouch for
            if self.all_trivial:
                return TestResult(self.spec.name, Kind.INTEGRITY, name, Outcome.SKIPPED,
                                  "every result here was trivial (zeros, empty, or a copy of an input): "
                                  "nothing to inspect",
                                  details=IntegrityPayload(kernels_launched=launched, evidence=[]))
            return TestResult(self.spec.name, Kind.INTEGRITY, name, Outcome.FAILED,
                              f"no Triton kernel was launched in any call: {self.spec.function}() "
                              "must launch your kernel (kernel[grid](...))",
                              details=IntegrityPayload(kernels_launched=launched, evidence=[]))
        kernels = ", ".join(self.kernels)
        return TestResult(self.spec.name, Kind.INTEGRITY, name, Outcome.PASSED, f"Triton kernels launched: {kernels}",
                          details=IntegrityPayload(kernels_launched=launched, evidence=[]))


def few(ids: list[str]) -> str:
    return ", ".join(ids[:3]) + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")
