"""The Python package's shape: modules that import one way, and metadata pip can install from."""
import ast
import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "nntile_torch"


def _module_name(path):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path, modules):
    """nntile_torch modules that `path` imports, anywhere in it (function-level imports too)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from X import y` imports X.y when that is a module, else X
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        found.update(t for t in targets if t in modules and t != name)
    return found


def test_no_import_cycles_in_the_package():
    """Layers that read one way: no module of nntile_torch imports, even lazily inside a function, one that
    imports it back (tensor.py imported functional.py inside __torch_function__, functional.py imports tensor.py;
    F.cross_entropy on tiles is registered by functional.py now)."""
    files = sorted(PACKAGE.rglob("*.py"))
    modules = {_module_name(f) for f in files}
    graph = {_module_name(f): _imports(f, modules) for f in files}
    # A submodule importing its own package's __init__ (`from .. import config` resolves to the module) is fine;
    # the package __init__ importing everything is what a package does. Cycles among modules are not.
    state, cycles = {}, []

    def visit(m, path):
        state[m] = "open"
        for n in sorted(graph[m]):
            if n == "nntile_torch" or m == "nntile_torch":
                continue
            if state.get(n) == "open":
                cycles.append(path[path.index(n):] + [n])
            elif n not in state:
                visit(n, path + [n])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def _private_tile_uses(path):
    """(line, what) for each use in `path` of a TileTensor's private fields (._tiles, ._view, ._dense_cache), a raw
    _C.TileTensor(...) construction or tensor.py's handler tables."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr in ("_tiles", "_view", "_dense_cache", "_HANDLERS"):
            found.append((node.lineno, node.attr))
        elif isinstance(node, ast.Name) and node.id in ("_HANDLERS", "FUNCTIONS", "_TILE_DTYPES", "_DTYPES"):
            found.append((node.lineno, node.id))
        elif isinstance(node, ast.alias) and node.name in ("_HANDLERS", "FUNCTIONS", "_TILE_DTYPES", "_DTYPES"):
            found.append((getattr(node, "lineno", 0), node.name))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "TileTensor" \
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "_C":
            found.append((node.lineno, "_C.TileTensor(...)"))
    return found


def test_only_tensor_py_touches_the_tiles_private_parts():
    """Outside tensor.py the C++ tiles are reached through TileTensor's public API (t.tiles, t.tiles_dtype,
    new_tiles, tiles_like, same_tiling, dtype_of: torch dtypes at the seam) and the torch functions and aten ops run
    as tile tasks are registered with register_tile_function / register_tile_op, not written into its tables."""
    uses = {str(f.relative_to(ROOT)): u for f in sorted(PACKAGE.rglob("*.py")) if f.name != "tensor.py"
            for u in [_private_tile_uses(f)] if u}
    assert not uses, uses


def test_the_seam_check_sees_what_it_forbids(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from .tensor import FUNCTIONS\nx._tiles\nt = _C.TileTensor([1], [1], 'float32', '')\n")
    assert [w for _, w in _private_tile_uses(bad)] == ["FUNCTIONS", "_tiles", "_C.TileTensor(...)"]


def _nntile_attributes(path):
    """(line, name) for each `_nntile_*` attribute that `path` writes or reads by name on an object."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_nntile_"):
            found.append((node.lineno, node.attr))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("_nntile_"):
            found.append((node.lineno, node.value))  # getattr(x, "_nntile_...")
    return found


def test_no_private_attributes_on_the_users_objects_but_the_parameters_state(tmp_path):
    """What nntile_torch keeps about a user's model, modules, optimizers and tensors lives in its owner records
    (owners.py; param.ParamState for a parameter, reached by its one attribute _nntile_state), not in _nntile_*
    attributes set across modules."""
    uses = {str(f.relative_to(ROOT)): u for f in sorted(PACKAGE.rglob("*.py"))
            for u in [[x for x in _nntile_attributes(f) if not (f.name == "param.py" and x[1] == "_nntile_state")]]
            if u}
    assert not uses, uses
    bad = tmp_path / "bad.py"  # the check sees what it forbids
    bad.write_text("model._nntile_report = 1\ngetattr(model, '_nntile_streamer', None)\n")
    assert [n for _, n in _nntile_attributes(bad)] == ["_nntile_report", "_nntile_streamer"]


# The package's own modules (nntile_torch.runtime, ...) by the names modules import them as.
_MODULE_NAMES = {p.stem for p in PACKAGE.rglob("*.py")} - {"__init__"}


def _private_names_used_across_modules(path):
    """(line, name) for each private name (`_x`) that `path` imports from another nntile_torch module or reads as
    `module._x` off one: each module's private parts are its own (the compiled _C and the nn package's _init module
    excepted)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level > 0:
            found += [(node.lineno, a.name) for a in node.names
                      if a.name.startswith("_") and a.name not in ("_C", "_init")]
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in _MODULE_NAMES
              and node.value.id != path.stem and node.attr.startswith("_") and not node.attr.startswith("__")):
            found.append((node.lineno, f"{node.value.id}.{node.attr}"))
    return found


def test_no_module_uses_another_modules_private_names(tmp_path):
    bad = {str(p.relative_to(ROOT)): f for p in sorted(PACKAGE.rglob("*.py"))
           if (f := _private_names_used_across_modules(p))}
    assert bad == {}, bad
    probe = tmp_path / "probe.py"
    probe.write_text("from .tensor import _add, TileTensor\nfrom . import _C\nruntime._host_limit\nprobe._mine\n")
    assert [w for _, w in _private_names_used_across_modules(probe)] == ["_add", "runtime._host_limit"]


def test_pyproject_declares_what_pip_needs():
    """pip install . reads the name, version, Python and the in-tree backend from pyproject.toml; the backend
    exposes the PEP 517 and PEP 660 hooks (wheel and editable)."""
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project, build = meta["project"], meta["build-system"]
    assert project["name"] == "nntile_torch" and project["version"] and project["requires-python"] == ">=3.10"
    assert "dependencies" in project["dynamic"]  # setup.py: torch==<the one compiled against>, tqdm
    assert not any(r.split("=")[0].split(">")[0].strip() == "torch" for r in build["requires"])
    backend = ROOT / build["backend-path"][0] / (build["build-backend"] + ".py")
    hooks = {n.name for n in ast.walk(ast.parse(backend.read_text())) if isinstance(n, ast.alias)}
    assert {"build_wheel", "build_editable", "prepare_metadata_for_build_wheel",
            "get_requires_for_build_editable"} <= hooks
    setup = (ROOT / "setup.py").read_text()
    assert '"tqdm"' in setup and "torch_requirement()" in setup
