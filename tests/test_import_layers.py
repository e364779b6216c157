"""The house's building code: which package may import which, read from every module's imports (ast).

ARCHITECTURE.md draws the same layers. A module may import ds_acco modules of a lower layer or of
its own package; only ``ds_acco.deepspeed`` imports deepspeed; no circles, anywhere; ``examples``
never imports ``benchmarks``, and the library imports neither. Every import counts, also one
inside a function or under ``TYPE_CHECKING``: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LAYERS = {
    "ds_acco.errors": 0,
    "ds_acco.numerics": 1, "ds_acco.config": 1, "ds_acco.telemetry": 1,
    "ds_acco.layout": 2, "ds_acco.comm": 2, "ds_acco.optim": 2, "ds_acco.checkpoint": 2,
    "ds_acco.rounds": 3, "ds_acco.streaming": 3,
    "ds_acco.plain": 4, "ds_acco.deepspeed": 4, "ds_acco.fsdp": 4, "ds_acco.reference": 4,
    "ds_acco": 5, "ds_acco.run": 5,
}
MAX_LINES, MAX_MODULES = 450, 12


def unit(module: str) -> str:
    """The entry of LAYERS a module belongs to (its package, or itself at the top)."""
    parts = module.split(".")
    for n in (2, 1):
        if ".".join(parts[:n]) in LAYERS:
            return ".".join(parts[:n])
    return parts[0]


def modules(root: Path, tops=("ds_acco", "benchmarks", "examples")) -> dict[str, Path]:
    found = {}
    for top in tops:
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root).with_suffix("")
            name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
            found[name] = path
    return found


def imports(name: str, path: Path) -> list[tuple[int, str]]:
    """(line, what is imported) for every import statement in the file, relative ones resolved: a module,
    or ``module.name`` for ``from module import name`` (:func:`resolve` tells a submodule from a name)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            out += [(node.lineno, f"{base}.{a.name}") for a in node.names]
    return out


def resolve(target: str, known: dict[str, Path]) -> str | None:
    """The module of the repository that ``target`` (a module, or ``module.name``) refers to."""
    while target and target not in known:
        target = target.rpartition(".")[0]
    return target or None


def violations(root: Path) -> list[str]:
    known = modules(root)
    graph: dict[str, set[str]] = {m: set() for m in known}
    found = []
    for name, path in known.items():
        where = f"{path.relative_to(root)}"
        seen = set()
        for line, target in imports(name, path):
            top = target.split(".")[0]
            if top == "deepspeed" and not name.startswith("ds_acco.deepspeed"):
                if name.startswith("ds_acco") and (line, top) not in seen:
                    seen.add((line, top))
                    found.append(f"{where}:{line} imports deepspeed; only ds_acco.deepspeed may")
                continue
            dep = resolve(target, known)
            if dep is None or dep == name or (line, dep) in seen:
                continue
            seen.add((line, dep))
            graph[name].add(dep)
            if name.startswith("ds_acco") and not dep.startswith("ds_acco"):
                found.append(f"{where}:{line} imports {dep}; the library imports neither examples nor benchmarks")
            elif name.startswith("examples") and dep.startswith("benchmarks"):
                found.append(f"{where}:{line} imports {dep}; examples never import benchmarks")
            elif name.startswith("ds_acco") and unit(dep) != unit(name) and LAYERS[unit(dep)] >= LAYERS[unit(name)]:
                found.append(f"{where}:{line} imports {dep} (layer {LAYERS[unit(dep)]}, {unit(dep)}) from layer "
                             f"{LAYERS[unit(name)]} ({unit(name)}); a layer imports only lower layers")
    found += [f"import circle: {' -> '.join(c + [c[0]])}" for c in circles(graph)]
    return found


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each in a stable order."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
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
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_every_module_keeps_to_its_layer_and_no_circle_exists():
    assert violations(REPO) == []
    assert set(LAYERS) <= set(modules(REPO)), "a layer in LAYERS names no module: keep the table true"


def test_no_module_too_long_and_no_folder_too_full():
    long = {str(p.relative_to(REPO)): n for p in modules(REPO).values()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    folders: dict[Path, int] = {}
    for p in modules(REPO).values():
        folders[p.parent] = folders.get(p.parent, 0) + 1
    full = {str(d.relative_to(REPO)): n for d, n in folders.items() if n > MAX_MODULES}
    assert long == {} and full == {}, f"over {MAX_LINES} lines: {long}; over {MAX_MODULES} modules: {full}"


def test_the_checker_names_a_wrong_import_and_a_circle(tmp_path):
    """The code must be able to fail: a front end reaching sideways, a core reaching up, and a circle."""
    files = {
        "ds_acco/__init__.py": "", "ds_acco/errors.py": "",
        "ds_acco/rounds/__init__.py": "", "ds_acco/rounds/engine.py": "from ds_acco.deepspeed.engine import X\n",
        "ds_acco/deepspeed/__init__.py": "", "ds_acco/deepspeed/engine.py": "import deepspeed\nX = 1\n",
        "ds_acco/fsdp/__init__.py": "", "ds_acco/fsdp/a.py": "from ds_acco.deepspeed import engine\n",
        "ds_acco/layout/__init__.py": "", "ds_acco/layout/a.py": "from .b import Y\nimport deepspeed\n",
        "ds_acco/layout/b.py": "def f():\n    from ds_acco.layout.a import Z\nY = 1\n",
        "examples/__init__.py": "", "examples/run.py": "import benchmarks.sweep\n",
        "benchmarks/__init__.py": "", "benchmarks/sweep.py": "",
    }
    for rel, text in files.items():
        os.makedirs((tmp_path / rel).parent, exist_ok=True)
        (tmp_path / rel).write_text(text)
    found = "\n".join(violations(tmp_path))
    assert "ds_acco/rounds/engine.py:1 imports ds_acco.deepspeed.engine (layer 4" in found
    assert "ds_acco/fsdp/a.py:1 imports ds_acco.deepspeed.engine (layer 4, ds_acco.deepspeed) from layer 4" in found
    assert "ds_acco/layout/a.py:2 imports deepspeed; only ds_acco.deepspeed may" in found
    assert "examples/run.py:1 imports benchmarks.sweep; examples never import benchmarks" in found
    assert "import circle: ds_acco.layout.a -> ds_acco.layout.b -> ds_acco.layout.a" in found
    assert "ds_acco/deepspeed/engine.py" not in found


def test_test_modules_never_import_each_other():
    """A test module imported by another runs its module-level code (and pytest may collect its tests) twice;
    what tests share lives in tests/helpers.py and the *_workers.py and *_workloads.py modules."""
    tests = modules(REPO, tops=("tests",))
    found = [f"{path.relative_to(REPO)}:{line} imports {dep}"
             for name, path in tests.items()
             for line, target in imports(name, path)
             if (dep := resolve(target, tests)) and dep != name and dep.rpartition(".")[2].startswith("test_")]
    assert found == [], "\n".join(found)
