"""The house's rules, read off the source (function-level imports included): no import cycles, a
closed core that imports no engine, and a product that never imports the lab (docs/design.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import justitia.core

ROOT = Path(__file__).resolve().parents[1] / "justitia"
PRODUCT = (
    "justitia.core",
    "justitia.workload",
    "justitia.predictors",
    "justitia.agent",
    "justitia.defaults",
    "justitia.sim",
    "justitia.vllm",
    "justitia.engine",
    "justitia.backends",
    "justitia.server",
    "justitia.gateway",
)
# The house's floors, lowest first: a module imports only from its own floor or below (design.md).
LAYERS = (
    ("justitia.core",),
    ("justitia.defaults", "justitia.workload", "justitia.predictors"),
    ("justitia.agent",),
    ("justitia.sim", "justitia.vllm", "justitia.engine", "justitia.backends"),
    ("justitia.server",),
    ("justitia.gateway",),
    ("justitia.lab",),
    ("justitia.cli", "justitia.__main__"),
)
ENGINES = {
    "vllm",
    "fastapi",
    "uvicorn",
    "httpx",
    "ray",
    "torch",
    "transformers",
    "matplotlib",
    "rich",
    "sklearn",
    "pydantic",
    "starlette",
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _modules()


def _imports(name: str) -> list[tuple[str, list[str], int]]:
    """Every import in a module, anywhere in it: (module imported, names taken from it, line)."""
    tree = ast.parse(MODULES[name].read_text())
    package = name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, [], node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            out.append((base, [alias.name for alias in node.names], node.lineno))
    return out


def _targets(module: str, names: list[str]) -> set[str]:
    """The justitia modules an import loads: ``from a import b`` is module ``a.b`` when there is one."""
    found = {f"{module}.{n}" for n in names if f"{module}.{n}" in MODULES}
    if module in MODULES and (not names or len(found) < len(names)):
        found.add(module)
    return found


GRAPH = {
    name: {t for module, names, _ in _imports(name) for t in _targets(module, names) if t != name} for name in MODULES
}


def _in(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def test_there_are_no_import_cycles():
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(GRAPH[node]):
            if state.get(nxt) == 1:
                cycle = path[path.index(nxt) :] + [nxt]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(GRAPH):
        if node not in state:
            visit(node)


def test_the_core_imports_nothing_of_justitia_outside_it_and_no_engine():
    for name in MODULES:
        if not _in(name, ("justitia.core",)):
            continue
        for module, _, line in _imports(name):
            top = module.split(".")[0]
            assert not (top == "justitia" and not _in(module, ("justitia.core",))), f"{name}:{line} imports {module}"
            assert top not in ENGINES, f"{name}:{line} imports {module}: the core knows no engine"


def test_no_product_module_imports_the_lab_or_the_command_line():
    for name in MODULES:
        if _in(name, PRODUCT):
            bad = [t for t in GRAPH[name] if _in(t, ("justitia.lab", "justitia.cli"))]
            assert not bad, f"{name} imports {bad}: the product must not depend on the lab"


def _floor(name: str) -> int:
    for k, packages in enumerate(LAYERS):
        if _in(name, packages):
            return k
    raise AssertionError(f"{name} is on no floor of LAYERS: place it")


def test_every_import_goes_down_the_floors():
    for name in MODULES:
        if name == "justitia":
            continue
        for target in GRAPH[name]:
            assert _floor(target) <= _floor(name), (
                f"{name} (floor {_floor(name)}) imports {target} (floor {_floor(target)})"
            )


def test_the_floors_hold_the_arrows_they_guard():
    # a rule that sees no arrow cannot fail: these cross floors downwards and must stay visible
    assert "justitia.backends.base" in GRAPH["justitia.server.agents"]
    assert "justitia.backends.base" in GRAPH["justitia.backends.ray.replica"]
    assert "justitia.server.app" in GRAPH["justitia.gateway.app"]  # the front end stands on the server
    assert not any(_in(t, ("justitia.server",)) for m in MODULES if _in(m, ("justitia.backends",)) for t in GRAPH[m])


def test_outside_the_core_only_its_public_names_are_used():
    public = set(justitia.core.__all__)
    for name in MODULES:
        if _in(name, ("justitia.core",)):
            continue
        for module, names, line in _imports(name):
            if module == "justitia.core":
                assert set(names) <= public, f"{name}:{line} takes {set(names) - public} from the core"
            else:
                assert not _in(module, ("justitia.core",)), f"{name}:{line} reaches into {module}"


def test_the_rules_see_the_whole_package():
    # a check that sees nothing cannot fail: the graph must hold the modules and edges it guards
    assert {
        "justitia.core.scheduler",
        "justitia.sim.simulator",
        "justitia.vllm.plugin",
        "justitia.lab.bench",
        "justitia.server.agents",
        "justitia.agent",
    } <= set(MODULES)
    assert "justitia.core.scheduler" in GRAPH["justitia.core.book"]
    assert "justitia.agent" in GRAPH["justitia.sim.simulator"]
    assert any("justitia.lab.presets" in GRAPH[m] for m in MODULES if _in(m, ("justitia.cli",)))  # function-level


# ------------------------------------------------------------------ the core's verbs, and no others
REPO = ROOT.parent
CORE_VERBS_DOC = REPO / "docs" / "design.md"


def _documented_verbs() -> set[str]:
    """The verbs the contract table in docs/design.md lists (its first column, before any bracket)."""
    text = CORE_VERBS_DOC.read_text()
    table = text[text.index("## The core's contract") : text.index("`AgentBook` (justitia/core/book.py)")]
    verbs = set()
    for line in table.splitlines():
        if line.startswith("| `"):
            for cell in line.split("|")[1].split("/"):
                verbs.add(cell.strip().strip("`").split("(")[0])
    return verbs


PROTOCOL_VERBS = {"__len__": "len"}  # verbs an engine reaches through Python's protocols: ``len(core)``


def _public_members(cls) -> set[str]:
    return (
        {n for n in vars(cls) if not n.startswith("_")} - {"for_policy"}  # for_policy: a constructor
        | {verb for name, verb in PROTOCOL_VERBS.items() if name in vars(cls)}
    )


def _sources_outside_the_core():
    """Every Python file that drives the core: the product outside it, the lab and the tests."""
    tests = [p for p in (REPO / "tests").rglob("*.py") if "node_modules" not in p.parts]
    for path in sorted([*ROOT.rglob("*.py"), *tests]):
        if "justitia/core/" not in path.as_posix():
            yield path, ast.parse(path.read_text())


def _core_expression(node: ast.AST) -> bool:
    """Whether an expression names an ``AgentScheduler`` by this project's convention: ``core``,
    ``c`` in the core's tests, ``x.core``, ``cores[i]``."""
    if isinstance(node, ast.Name):
        return node.id in ("core", "cores")
    if isinstance(node, ast.Attribute):  # x.core, not the package justitia.core
        return node.attr == "core" and not (isinstance(node.value, ast.Name) and node.value.id == "justitia")
    if isinstance(node, ast.Subscript):
        return _core_expression(node.value)
    return False


def test_the_core_has_exactly_the_verbs_its_contract_lists():
    from justitia.core.scheduler import AgentScheduler

    verbs = _public_members(AgentScheduler)
    assert verbs == _documented_verbs()
    assert len(verbs) <= 18  # a narrow contract (vLLM's RequestQueue has about ten): lookahead and about 16
    doc = justitia.core.scheduler.__doc__
    assert all(v in doc for v in verbs), [v for v in verbs if v not in doc]


def test_engines_call_only_the_verbs_and_only_the_skipping_stepper_looks_ahead():
    from justitia.core.scheduler import AgentScheduler

    verbs = _public_members(AgentScheduler)
    for path, tree in _sources_outside_the_core():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _core_expression(node.value):
                assert node.attr in verbs, f"{path}:{node.lineno} calls the core's '{node.attr}', not a verb"
                if node.attr == "lookahead":
                    assert "tests/" in path.as_posix() or path.name == "skipping.py", (
                        f"{path}:{node.lineno} looks ahead: only the skipping stepper may"
                    )


def test_no_private_name_of_the_core_is_read_outside_it():
    private = set()
    for path in (ROOT / "core").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
            ):
                private.add(node.attr)
    assert {"_policy", "_attained", "_infos", "_core"} <= private  # the walk sees the core's state
    for path, tree in _sources_outside_the_core():
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in private
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
            ):
                raise AssertionError(f"{path}:{node.lineno} reads '{node.attr}', a private name of the core")


# ------------------------------------------------------------------ a core that knows no engine
VLLM_FIELDS = (
    "num_computed_tokens",
    "num_output_placeholders",
    "is_prefill_chunk",
    "num_prompt_tokens",
    "num_scheduled_tokens",
    "num_tokens_with_spec",
    "ref_cnt",
    "block_id",
    "SchedulerOutput",
    "EngineCoreRequest",
    "SamplingParams",
)


def test_the_core_names_no_field_or_type_of_vllm():
    """vLLM's step accounting lives in ``justitia.vllm.accounting``: no file of the core names a field
    or a type of vLLM's (the identifiers, and the words of its docstrings and comments alike)."""
    found = [
        (path.name, field)
        for path in (ROOT / "core").rglob("*.py")
        for field in VLLM_FIELDS
        if field in path.read_text()
    ]
    assert not found, found
    # the rule sees what it guards: the plug-in's accounting names them
    assert "num_computed_tokens" in (ROOT / "vllm" / "accounting.py").read_text()


def test_a_long_product_file_says_why_it_is_one_file():
    """A product file well over the house's 400 lines says in its docstring why it is not split."""
    long = {
        name: len(path.read_text().splitlines())
        for name, path in MODULES.items()
        # 400 lines as the house wrote them before ruff format, which spreads a call's arguments over
        # lines: about 500 of its lines
        if _in(name, PRODUCT) and len(path.read_text().splitlines()) > 500
    }
    unexplained = [
        name
        for name in long
        if "longer than the house's 400 lines"
        not in " ".join((ast.get_docstring(ast.parse(MODULES[name].read_text())) or "").split())
    ]
    assert not unexplained, unexplained
    assert long  # the rule sees files it guards (today: the skipping stepper, the plug-in, online)


def test_the_product_and_the_bench_run_without_matplotlib(tmp_path):
    # matplotlib is the `plots` extra: with it hidden, every product module imports and a bench run
    # writes its results, skipping the plots with a note
    import subprocess
    import sys

    code = f"""
import sys
sys.modules["matplotlib"] = None  # an import of it raises ImportError
import justitia.cli, justitia.server.app, justitia.server.plugin, justitia.gateway.serve
from justitia.cli import main
assert main(["bench", "--agents", "4", "--policies", "fcfs,justitia", "--out", {str(tmp_path)!r}, "--no-progress"]) == 0
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "plots: skipped (matplotlib is not installed" in done.stderr
    assert (tmp_path / "results.json").is_file() and not list(tmp_path.glob("*.png"))
