"""The code's shape, checked from its source (AST only: nothing is run, each test takes well under a second).

- A declared lifecycle: experiments/ never probes a strategy (or a step's compute) with hasattr/getattr for a
  member: what the pipeline calls is declared, with a default, in strategies/base.py (StrategyConfig, Strategy)
  or experiments/pipeline/compute.py (Compute), and called directly.
"""

from __future__ import annotations

import ast
import importlib
import inspect
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


def test_the_fast_tier_is_chosen_by_marker_and_leaves_out_the_issues_five():
    """A new test is fast unless marked slow, ray, netns, simgrid or timing (gpu too): make test-fast's marker
    expression says so, and every one of those markers is registered (pytest -m on an unknown one selects none)."""
    import re
    import tomllib

    fast = re.search(r"^FAST_MARKERS := (.+)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert {m.removeprefix("not ").strip() for m in fast.split(" and ")} == \
        {"ray", "netns", "gpu", "slow", "simgrid", "timing"}, fast
    registered = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    assert {"ray", "netns", "gpu", "slow", "simgrid", "timing"} <= {m.split(":")[0] for m in registered}
