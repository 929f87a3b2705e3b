"""The code's shape, checked from its source (AST only: nothing is run, each test takes well under a second).

- A declared lifecycle: experiments/ never probes a strategy (or a step's compute) with hasattr/getattr for a
  member: what the pipeline calls is declared, with a default, in strategies/base.py (StrategyConfig, Strategy)
  or experiments/pipeline/compute.py (Compute), and called directly.
- No import cycles, between files or between packages, and DESIGN.md's direction (see test_no_import_cycles).
- make test-fast is chosen by marker.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import sys
import textwrap
from pathlib import Path

from experiments.pipeline.compute import Compute
from strategies.base import Strategy, StrategyConfig

ROOT = Path(__file__).resolve().parent.parent

# Variable names the pipeline gives a strategy's config or runtime, or a step's compute: any literal probe of one
# of these is a probe of the contract, whatever the member's name.
CONTRACT_NAMES = {"config", "strategy", "runtime", "runtimes", "compute", "wrapped", "inner"}


def _subclasses(cls) -> set[type]:
    out = set()
    for sub in cls.__subclasses__():
        out |= {sub} | _subclasses(sub)
    return out


def _members_in_source(cls) -> set[str]:
    """Methods, class attributes and `self.x = ...` attributes of one class, read from its source."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return set(vars(cls))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out.add(node.target.id)
        elif isinstance(node, ast.Assign):
            out |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            out |= {t.attr for t in targets if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                    and t.value.id == "self"}
    return out


def declared_members() -> set[str]:
    """What strategies/base.py and the Compute contract declare (their runtime's attributes included)."""
    out = set()
    for cls in (StrategyConfig, Strategy, Compute):
        out |= set(dir(cls)) | _members_in_source(cls)
    return out


def strategy_members() -> set[str]:
    """Every member any strategy class defines (built-in strategies, their wrappers and runtimes)."""
    for module in sorted((ROOT / "strategies").glob("*.py")):  # every strategy module, wrappers included
        importlib.import_module(f"strategies.{module.stem}")
    out = set()
    for base in (StrategyConfig, Strategy):
        for cls in _subclasses(base):
            if cls.__module__.startswith("strategies."):
                out |= _members_in_source(cls)
    return out


def probes(source: str) -> list[tuple[int, str, str]]:
    """(line, object, member) of every hasattr/getattr with a literal member name in `source`."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("hasattr", "getattr")
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)):
            out.append((node.lineno, ast.unparse(node.args[0]), node.args[1].value))
    return sorted(out)


def contract_probes(source: str, where: str, declared: set[str], members: set[str]) -> list[str]:
    """Why each probe in `source` breaks the declared lifecycle: a member some strategy defines and base.py does
    not declare, or any probe of a variable that holds a strategy or compute (declared members are called)."""
    found = []
    for line, obj, member in probes(source):
        last = obj.rpartition(".")[2]
        if member in members and member not in declared:
            found.append(f"{where}:{line}: probes {obj}.{member}, a strategy member strategies/base.py does not "
                         f"declare: declare it there with a default and call it")
        elif last in CONTRACT_NAMES:
            found.append(f"{where}:{line}: probes {obj}.{member}: "
                         + ("declared: call it" if member in declared else
                            "declare it (strategies/base.py, or experiments/pipeline/compute.py) and call it"))
    return found


def test_the_pipeline_calls_only_declared_strategy_members():
    declared, members = declared_members(), strategy_members()
    found = []
    for path in sorted((ROOT / "experiments").rglob("*.py")):
        found += contract_probes(path.read_text(), path.relative_to(ROOT).as_posix(), declared, members)
    assert not found, "\n".join(found)


def test_a_probe_of_an_undeclared_or_declared_strategy_member_is_named():
    declared, members = declared_members(), strategy_members()
    assert {"start", "set_shapes", "asynchronous", "step_traffic", "unwrapped", "phase_s"} <= declared
    assert "outer" in members and "outer" not in declared  # local SGD's runtime: its DiLoCo optimizer
    source = ("def f(config, runtime, net, args):\n"
              "    runtime.outer if hasattr(runtime.helper, 'outer') else None\n"  # undeclared, any object
              "    getattr(config, 'asynchronous', False)\n"  # declared: call it
              "    getattr(runtime, 'brand_new', None)\n"  # a strategy variable: declare what you call
              "    getattr(net, 'hook_state', None), getattr(args, 'describe')\n")  # not a strategy: fine
    found = contract_probes(source, "x.py", declared, members)
    assert [f.split(": probes ")[1].split(",")[0].split(":")[0] for f in found] == \
        ["runtime.helper.outer", "config.asynchronous", "runtime.brand_new"], found
    assert "does not declare" in found[0] and "declared: call it" in found[1] and "declare it" in found[2]


def test_the_fast_tier_is_chosen_by_marker():
    """A new test is fast unless marked slow, ray, netns, simgrid, timing or gpu: make test-fast's marker
    expression says so, and every one of those markers is registered (pytest -m on an unknown one selects none).
    The three bugs of tests/mutations.py once caught only by timing tests (pool-counters-carry-over,
    async-push-not-scaled-by-n, ssp-bound-one-step-loose) are caught by fast tests that order events without a
    clock (make mutations checks it)."""
    import re
    import tomllib

    fast = re.search(r"^FAST_MARKERS := (.+)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert {m.removeprefix("not ").strip() for m in fast.split(" and ")} == \
        {"ray", "netns", "gpu", "slow", "simgrid", "timing"}, fast
    registered = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    assert {"ray", "netns", "gpu", "slow", "simgrid", "simgrid_fast", "timing"} <= \
        {m.split(":")[0] for m in registered}


def test_the_reduced_validation_matrix_is_in_the_fast_tier():
    """make test-fast's marker expression keeps the tests marked simgrid_fast (the reduced validation matrix) and
    leaves out those marked simgrid; the matrix's tests carry simgrid_fast, not simgrid."""
    import re

    from _pytest.mark.expression import Expression

    fast = Expression.compile(re.search(r"^FAST_MARKERS := (.+)$", (ROOT / "Makefile").read_text(), re.M).group(1))
    assert fast.evaluate(lambda marker: marker == "simgrid_fast")
    assert not fast.evaluate(lambda marker: marker in {"simgrid", "simgrid_fast"})
    from tests.experiments import test_validate

    for test in (test_validate.test_model_agrees_with_simgrid_alpha_beta,
                 test_validate.test_the_reduced_matrix_lists_what_simgrid_cannot_run_with_the_reason):
        markers = {mark.name for mark in test.pytestmark}
        assert "simgrid_fast" in markers and "simgrid" not in markers, (test.__name__, markers)


# -- imports -----------------------------------------------------------------------------------------------------

PACKAGES = ("strategies", "workloads", "experiments", "reports")

# File cycles known and left this round, each with why and the fix; the test fails on any other cycle, and on one of
# these once it is gone (remove it here then).
KNOWN_FILE_CYCLES: dict = {}


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every first-party module: dotted name -> file (a package is its __init__.py)."""
    out = {}
    for package in PACKAGES:
        for path in (root / package).rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports(name: str, source: str, is_package: bool, known) -> set[str]:
    """The first-party modules `source` imports anywhere (module level, inside functions, under TYPE_CHECKING):
    `from a.b import c` is a.b.c where that is a module, else a.b; `import a.b.c` is the longest known prefix."""
    def longest(dotted: str) -> str | None:
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out |= {longest(a.name) for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package up level - 1 packages
                package = name if is_package else name.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}" if base else package
            out |= {f"{base}.{a.name}" if f"{base}.{a.name}" in known else longest(base) for a in node.names}
    return out - {None, name}


@functools.cache  # parsed once per session: two tests read it
def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    known = modules(root)
    return {name: imports(name, path.read_text(), path.name == "__init__.py", known) for name, path in known.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted: every cycle lies in one."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(found)


def package_of(module: str, path: Path) -> str:
    """A module's package node: the folder it is in (strategies.transport, experiments.pipeline, ...), except a
    package's __main__.py, the program's entry point, which is a node of its own above everything."""
    if path.name == "__main__.py":
        return module
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def package_graph(graph: dict[str, set[str]], root: Path = ROOT) -> dict[str, set[str]]:
    known = modules(root)
    out: dict[str, set[str]] = {}
    for module, targets in graph.items():
        a = package_of(module, known[module])
        out.setdefault(a, set()).update(b for t in targets if (b := package_of(t, known[t])) != a)
    return out


def test_no_import_cycles_between_files_or_packages():
    """Every import is counted, at module level or inside a function (an import hidden in a function is how the
    cycles this test broke were kept: it only delays the cycle).

    Packages are enforced at the granularity of folders: each folder with an __init__.py (strategies,
    strategies.transport, experiments.pipeline, experiments.cli, reports, ...) is one node holding the modules
    directly in it. That is the unit a reader and a plug-in author see, and the one DESIGN.md draws its arrows
    between (experiments -> workloads, strategies; reports -> strategies and the results it reads;
    strategies.transport beneath the strategies). Finer (files) is the file test; coarser (the four top-level
    packages) cannot hold: the command line in experiments/cli builds the report, and the report reads the
    results format in experiments/results, an arrow DESIGN.md asks for (experiments.cli -> reports ->
    experiments.results is a chain, not a cycle). A package's __main__.py, the entry point nothing imports, is
    a node of its own."""
    graph = import_graph()
    file_cycles = cycles(graph)
    unknown = [c for c in file_cycles if frozenset(c) not in KNOWN_FILE_CYCLES]
    gone = [sorted(k) for k in KNOWN_FILE_CYCLES if sorted(k) not in file_cycles]
    assert not unknown, "import cycles between files: " + "; ".join(" <-> ".join(c) for c in unknown)
    assert not gone, f"no longer cycles, remove them from KNOWN_FILE_CYCLES: {gone}"
    package_cycles = cycles(package_graph(graph))
    assert not package_cycles, "import cycles between packages: " + "; ".join(" <-> ".join(c)
                                                                            for c in package_cycles)


def test_imports_follow_the_design_direction():
    """strategies and workloads import neither experiments nor reports; the transport (strategies.transport)
    imports nothing of the strategies above it; reports reads experiments only through experiments.results."""
    graph = import_graph()
    wrong = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            top, target_top = module.split(".")[0], target.split(".")[0]
            if top in ("strategies", "workloads") and target_top in ("experiments", "reports"):
                wrong.append(f"{module} -> {target}")
            elif module.startswith("strategies.transport") and target_top == "strategies" \
                    and not target.startswith("strategies.transport"):
                wrong.append(f"{module} -> {target} (the transport imports the package above it)")
            elif top == "reports" and target_top == "experiments" and not target.startswith("experiments.results"):
                wrong.append(f"{module} -> {target} (reports reads experiments' results only)")
    assert not wrong, "imports against DESIGN.md's direction:\n" + "\n".join(wrong)


def test_a_cycle_hidden_in_a_function_is_found_and_named(tmp_path):
    for name, text in {"strategies/__init__.py": "", "strategies/a.py": "from strategies.b import x\n",
                       "strategies/b.py": "def f():\n    from strategies import a\n",
                       "strategies/c.py": "from . import a\n",
                       "workloads/__init__.py": "", "experiments/__init__.py": "",
                       "reports/__init__.py": "import experiments.pipeline\n",
                       "experiments/pipeline/__init__.py": "", "experiments/pipeline/m.py": "import reports\n"}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    graph = import_graph(tmp_path)
    assert graph["strategies.c"] == {"strategies.a"}
    assert cycles(graph) == [["strategies.a", "strategies.b"]]
    assert cycles(package_graph(graph, tmp_path)) == [["experiments.pipeline", "reports"]]


# -- sizes -------------------------------------------------------------------------------------------------------

MAX_FILE_LINES, MAX_FUNCTION_LINES = 500, 80
# Left over the limits this round (each being changed on another branch at the same time), with the seam to cut:
# the test fails on any other file or function over its limit, and on one of these once it fits (remove it here).
KNOWN_LONG_FILES = {
}
KNOWN_LONG_FUNCTIONS = {
}


def test_no_file_over_500_lines_and_no_function_over_80():
    long_files, long_functions = {}, {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            where, text = path.relative_to(ROOT).as_posix(), path.read_text()
            if text.count("\n") > MAX_FILE_LINES:
                long_files[where] = text.count("\n")
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES:
                    long_functions[f"{where}::{node.name}"] = node.end_lineno - node.lineno + 1
    assert not set(long_files) - set(KNOWN_LONG_FILES), \
        f"files over {MAX_FILE_LINES} lines: { {k: v for k, v in long_files.items() if k not in KNOWN_LONG_FILES} }"
    assert not set(long_functions) - set(KNOWN_LONG_FUNCTIONS), \
        (f"functions over {MAX_FUNCTION_LINES} lines: "
         f"{ {k: v for k, v in long_functions.items() if k not in KNOWN_LONG_FUNCTIONS} }")
    fitted = (set(KNOWN_LONG_FILES) - set(long_files)) | (set(KNOWN_LONG_FUNCTIONS) - set(long_functions))
    assert not fitted, f"within the limits now, remove them from the known lists: {sorted(fitted)}"
