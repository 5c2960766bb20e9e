"""The packages import each other without cycles, counting imports inside functions too (a
lazy import that only dodges a cycle still is one)."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "freetoken_kernels", "ftw", "freetoken_cli")


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for f in (ROOT / package).rglob("*.py"):
            parts = f.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return found


def imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the package modules it imports anywhere in its file."""
    def known(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, f in mods.items():
        targets = set()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                targets |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        graph[name] = {t for t in map(known, targets) if t and t != name}
    return graph


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (its modules in order, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                return path[path.index(t):] + [t]
            if t not in state and (found := visit(t)):
                return found
        state[m] = 2
        path.pop()
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_no_import_cycles():
    found = cycle(imports(modules()))
    assert found is None, " -> ".join(found)


def test_cycle_finder():
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None


def test_no_other_installed_distribution_has_our_package_names():
    """Another distribution's top-level package of the same name shadows ours or is shadowed by it,
    and installing one overwrites the other's files (transformers 5.25 brought the hub's `kernels`,
    which our kernel package was called until then)."""
    from importlib.metadata import packages_distributions
    owners = packages_distributions()
    clashes = {p: sorted(set(owners.get(p, ())) - {"freetoken"}) for p in PACKAGES}
    assert not any(clashes.values()), clashes


def test_loading_a_model_on_the_cpu_does_not_import_dynamo(tiny_model):
    """torch._dynamo (~900 modules, seconds at a cold start) stays out of a load: building the model
    on the meta device once pulled it in through the embedding's random init."""
    import subprocess
    import sys
    ftw = tiny_model("qwen3_moe")[2]
    code = ("import sys; from engine.config import EngineConfig; from engine.loader import load_runner; "
            f"load_runner(EngineConfig(model={str(ftw)!r}, device='cpu'), {str(ftw)!r}); "
            "assert 'torch._dynamo' not in sys.modules, 'torch._dynamo imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
