"""No import circle among fair_calib's modules: every import statement (module level or inside
a function) is an edge, and the graph must have no cycle. And imports go downward only: each
package (or first-level module) of fair_calib sits in one layer of LAYERS (docs/design.md,
"Layers"), and imports only itself and the layers below its own."""
import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "fair_calib"

# Top to bottom; a unit is a package or first-level module of fair_calib (docs/design.md).
# The command lines run the stages (by name, fair_calib/cli/main.py: SUBCOMMANDS) after the
# checks; the stages trust their checked settings and import no check; the machinery imports
# no stage. Units of one layer do not import each other.
LAYERS = [
    ["cli"],                                   # entry points: python -m fair_calib.cli
    ["budget"],                                # census and cost of a config's DAG
    ["checks"],                                # the config's checks (Snakefile, cli)
    ["report"],                                # tables, figures (read the stages' files)
    ["diagnostics", "calibrate", "evaluate"],  # stages (downstream first)
    ["prior"],
    ["probe"],
    ["data"],
    ["methods"],                               # the libraries the stages run
    ["decoding", "quant"],
    ["models"],
    ["jobs"],                                  # job machinery
    ["names"],                                 # the names the config is checked against
]


def module_names() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        parts = path.relative_to(PKG.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imported(node, name: str, is_package: bool, modules) -> list[str]:
    """The fair_calib modules an import statement of module ``name`` names (a ``from m import
    x`` names ``m.x`` where that is a module, else ``m``)."""
    if isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            pkg = name.split(".") if is_package else name.split(".")[:-1]
            pkg = pkg[:len(pkg) - node.level + 1]
            base = ".".join(pkg + ([node.module] if node.module else []))
        targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                   for a in node.names]
    out = []
    for t in targets:
        while t not in modules and "." in t:
            t = t.rsplit(".", 1)[0]
        if t in modules and t != name:
            out.append(t)
    return out


def import_graph() -> dict[str, set[str]]:
    modules = module_names()
    graph = {}
    for name, path in modules.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                deps.update(imported(node, name, path.name == "__init__.py", modules))
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module, and self-loops."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph[v]:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_fair_calib_has_no_import_circle():
    graph = import_graph()
    assert "fair_calib.budget.census" in graph["fair_calib.budget.cost"]     # cost prices a census
    assert "fair_calib.budget.cost" not in graph["fair_calib.budget.census"]
    assert cycles(graph) == []


def unit(module: str) -> str:
    """The package or first-level module of fair_calib that ``module`` belongs to."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_unit_has_a_layer():
    layered = [u for layer in LAYERS for u in layer]
    assert len(layered) == len(set(layered))
    assert {unit(m) for m in module_names()} - {""} == set(layered)


def test_imports_go_downward_only():
    level = {u: i for i, layer in enumerate(LAYERS) for u in layer}
    level[""] = len(LAYERS)        # fair_calib/__init__.py: imports nothing of its own
    upward = sorted(f"{m} -> {d}" for m, deps in import_graph().items() for d in deps
                    if unit(d) != unit(m) and level[unit(d)] <= level[unit(m)])
    assert upward == []
