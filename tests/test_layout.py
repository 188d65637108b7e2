"""The package layout follows the data path, with no import circle and no private name crossing
a module boundary (issue: "A layout that shows the data path"). Parsed with ``ast``: nothing is
imported, so the test also covers modules that need optional heavy dependencies."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "lm_eval_ponder"
# The stages in the order of their imports: a stage imports only earlier stages and foundations.
STAGES = ("engine", "steering", "pondering", "generation", "evaluation", "scoring", "training",
          "reporting")
# Top-level modules below every stage: they import no stage.
FOUNDATIONS = {"backbone", "flops", "errors", "files", "resources", "hooks", "allocator", "data",
               "registry", "portable", "typed"}
# Top-level modules that only re-export documented entry points and import paths.
SHIMS = {"train", "steer", "report", "suite", "stats"}
# The console script (``lm-eval-ponder COMMAND``): above every stage, as the shims, but with code
# of its own, the dispatch to the commands' mains (which it imports by name, once named).
CONSOLE = {"cli"}


def module_name(path: Path, pkg: Path = PKG) -> str:
    parts = list(path.relative_to(pkg.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def modules(pkg: Path = PKG) -> dict[str, ast.Module]:
    return {module_name(p, pkg): ast.parse(p.read_text(), str(p))
            for p in sorted(pkg.rglob("*.py"))}


def imports(tree: ast.Module, known: set[str]) -> list[tuple[str, list[str]]]:
    """(imported module, names taken from it) for every import of the package, at any depth."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names if a.name.startswith("lm_eval_ponder")]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lm_eval_ponder"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                out.append((sub, []) if sub in known else (node.module, [alias.name]))
    return out


def import_graph(pkg: Path = PKG) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (anywhere in it: lazy imports count)."""
    mods = modules(pkg)
    known = set(mods)
    return {m: {target for target, _ in imports(tree, known) if target in known and target != m}
            for m, tree in mods.items()}


def level(module: str) -> int:
    """Where a module sits: 0 the package root and the foundations, 1.. the stages in ``STAGES``
    order, above them the shims and the console script (entry points, which may reach any
    stage)."""
    parts = module.split(".")[1:]
    if not parts or parts[0] in FOUNDATIONS:
        return 0
    if parts[0] in STAGES:
        return 1 + STAGES.index(parts[0])
    if parts[0] in SHIMS | CONSOLE:
        return 1 + len(STAGES)
    raise AssertionError(f"{module} is neither a foundation, a stage nor a shim")


def back_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a later stage (or of a shim) by an earlier one: ``a -> b`` with
    ``level(b) > level(a)``. A stage may import itself, earlier stages and the foundations."""
    return [f"{m} (level {level(m)}) imports {t} (level {level(t)})"
            for m in sorted(graph) for t in sorted(graph[m]) if level(t) > level(m)]


def test_stages_are_subpackages():
    for stage in STAGES:
        assert (PKG / stage / "__init__.py").is_file(), stage
    subpackages = {p.parent.name for p in PKG.glob("*/__init__.py")}
    assert subpackages == set(STAGES), f"a subpackage outside STAGES: {sorted(subpackages)}"


def test_stages_import_only_earlier_stages():
    """The order of ``STAGES`` is the order of the imports (docs/design.md numbers them so)."""
    graph = import_graph()
    assert not back_imports(graph), "\n".join(back_imports(graph))


def test_a_planted_back_import_is_reported(tmp_path):
    """The order test can fail: a copy of the package with ``pondering -> reporting`` (the import
    that once passed every layout test) and ``steering -> evaluation`` planted is refused, and
    so is the same arrow in a synthetic graph."""
    import shutil

    copy = tmp_path / "lm_eval_ponder"
    shutil.copytree(PKG, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert not back_imports(import_graph(copy))
    hook = copy / "pondering" / "hook.py"
    planted = "\n\ndef planted():\n    from lm_eval_ponder.reporting import report\n"
    hook.write_text(hook.read_text() + planted)
    cli = copy / "steering" / "cli.py"
    cli.write_text(cli.read_text() + "\nfrom lm_eval_ponder.evaluation.lm import PonderLM\n")
    found = back_imports(import_graph(copy))
    assert found == [
        "lm_eval_ponder.pondering.hook (level 3) imports lm_eval_ponder.reporting.report (level 8)",
        "lm_eval_ponder.steering.cli (level 2) imports lm_eval_ponder.evaluation.lm (level 5)"]
    assert back_imports({"lm_eval_ponder.training.loop": {"lm_eval_ponder.evaluation.lm"},
                         "lm_eval_ponder.evaluation.lm": {"lm_eval_ponder.training.loop"},
                         "lm_eval_ponder.data": {"lm_eval_ponder.steering.vector"},
                         "lm_eval_ponder.steering.cli": {"lm_eval_ponder.steer"}}) == [
        "lm_eval_ponder.data (level 0) imports lm_eval_ponder.steering.vector (level 2)",
        "lm_eval_ponder.evaluation.lm (level 5) imports lm_eval_ponder.training.loop (level 7)",
        "lm_eval_ponder.steering.cli (level 2) imports lm_eval_ponder.steer (level 9)"]


# Top-level modules beside the package, above all of it: each may import the package, none is
# imported by it (issue 74: the autoload and ``evaluation.lmeval_patches`` imported each other).
TOP_LEVEL = ("lm_eval_ponder_autoload",)


def top_level_imports(pkg: Path = PKG) -> list[str]:
    """Every import of a top-level module by a package module, at any depth."""
    found = []
    for name, tree in modules(pkg).items():
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            found += [f"{name} imports {n}" for n in names if n.split(".")[0] in TOP_LEVEL]
    return found


def test_the_top_level_modules_are_imported_by_no_package_module():
    assert top_level_imports() == [], top_level_imports()


# Issue 74: outside ``evaluation/`` no function takes the lm-eval model; the trainer (and any
# later stage) takes the ``generation.generator.SteeredGenerator`` it builds. One module may
# name ``PonderLM``: the trainer's ``load_backbone``, which loads the backbone through it
# (HFLM's loading, device and dtype rules, chat template) and keeps only its generator.
BUILDS_THE_MODEL = {"lm_eval_ponder.training.loop"}


def lm_eval_model_uses(pkg: Path = PKG) -> list[str]:
    """Outside ``evaluation/``: every function (or lambda) with a parameter named ``lm`` or
    annotated ``PonderLM``, and every import of ``evaluation.lm`` or ``PonderLM`` outside
    ``BUILDS_THE_MODEL``, at any depth."""
    found = []
    for name, tree in modules(pkg).items():
        if name.split(".")[1:2] == ["evaluation"]:
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                args = node.args
                found += [f"{name}.{getattr(node, 'name', '<lambda>')}({a.arg})"
                          for a in (*args.posonlyargs, *args.args, *args.kwonlyargs,
                                    args.vararg, args.kwarg)
                          if a is not None and (a.arg == "lm" or "PonderLM" in (
                              ast.unparse(a.annotation) if a.annotation else ""))]
            elif name not in BUILDS_THE_MODEL and imports_the_lm_eval_model(node):
                found.append(f"{name} imports PonderLM")
    return found


def imports_the_lm_eval_model(node: ast.AST) -> bool:
    if isinstance(node, ast.Import):
        return any(a.name == "lm_eval_ponder.evaluation.lm" for a in node.names)
    if not isinstance(node, ast.ImportFrom):
        return False
    names = {a.name for a in node.names}
    return node.module == "lm_eval_ponder.evaluation.lm" or "PonderLM" in names or (
        node.module == "lm_eval_ponder.evaluation" and "lm" in names)


def test_no_function_outside_evaluation_takes_the_lm_eval_model():
    assert lm_eval_model_uses() == [], lm_eval_model_uses()


def test_a_planted_use_of_the_lm_eval_model_is_reported(tmp_path):
    import shutil

    copy = tmp_path / "lm_eval_ponder"
    shutil.copytree(PKG, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert lm_eval_model_uses(copy) == []
    plants = {"training/rollouts.py": "def planted(lm, cfg):\n    return lm\n",
              "training/online.py": "def planted(model: 'PonderLM'):\n    return model\n",
              "reporting/report.py": "f = lambda lm: lm\n",
              "training/loop.py": "def planted(model: PonderLM | None):\n    return model\n",
              "training/grpo.py": "def planted():\n    from lm_eval_ponder.evaluation import lm\n",
              "steering/cli.py": "from lm_eval_ponder.evaluation.lm import PonderLM\n"}
    for path, text in plants.items():
        (copy / path).write_text((copy / path).read_text() + "\n\n" + text)
    assert sorted(lm_eval_model_uses(copy)) == [
        "lm_eval_ponder.reporting.report.<lambda>(lm)",
        "lm_eval_ponder.steering.cli imports PonderLM",
        "lm_eval_ponder.training.grpo imports PonderLM",
        "lm_eval_ponder.training.loop.planted(model)",
        "lm_eval_ponder.training.online.planted(model)",
        "lm_eval_ponder.training.rollouts.planted(lm)"]


def test_a_planted_import_of_the_autoload_is_reported(tmp_path):
    import shutil

    copy = tmp_path / "lm_eval_ponder"
    shutil.copytree(PKG, copy, ignore=shutil.ignore_patterns("__pycache__"))
    patches = copy / "evaluation" / "lmeval_patches.py"
    patches.write_text(patches.read_text() + "\n\ndef f():\n    from lm_eval_ponder_autoload "
                       "import tasks_dir\n")
    assert top_level_imports(copy) == [
        "lm_eval_ponder.evaluation.lmeval_patches imports lm_eval_ponder_autoload"]


def modules_without_lm_eval(folder: Path) -> list[str]:
    """The modules of ``folder`` that import nothing of lm-eval, at any depth."""
    return sorted(path.name for path in folder.glob("*.py")
                  if path.name != "__init__.py" and not lm_eval_imports_of(path))


def lm_eval_imports_of(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        names += [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
    return [n for n in names if n == "lm_eval" or n.startswith("lm_eval.")]


def test_evaluation_holds_only_what_reads_lm_eval():
    """Issue 74: ``evaluation/`` is the lm-eval adapter; generation that the trainer needs too
    (batching, pricing, accounting, progress, the early exit, the model args) is the
    ``generation`` stage, which imports no lm-eval."""
    assert modules_without_lm_eval(PKG / "evaluation") == []
    assert lm_eval_imports(PKG / "generation") == []


def test_a_module_without_lm_eval_in_evaluation_is_reported(tmp_path):
    (tmp_path / "lm.py").write_text("def f():\n    from lm_eval.api.model import LM\n")
    (tmp_path / "pricing.py").write_text("import torch\n")
    assert modules_without_lm_eval(tmp_path) == ["pricing.py"]


def test_the_engine_imports_no_lm_eval():
    """The generation engine is its own stage (issue 53): lm-eval's ``LM`` API is the adapter's
    business (``evaluation.lm``), so the engine can serve any caller and stays importable
    without lm-eval's task machinery. Parsed: every import at any depth counts."""
    found = lm_eval_imports(PKG / "engine")
    assert found == [], found


def test_an_lm_eval_import_in_the_engine_is_reported(tmp_path):
    engine = tmp_path / "engine"
    engine.mkdir()
    (engine / "loop.py").write_text("def f():\n    from lm_eval.models.utils import Collator\n")
    (engine / "rows.py").write_text("import torch\n")
    assert lm_eval_imports(engine) == ["loop.py: lm_eval.models.utils"]


def lm_eval_imports(folder: Path) -> list[str]:
    return [f"{path.relative_to(folder)}: {name}" for path in sorted(folder.rglob("*.py"))
            for name in lm_eval_imports_of(path)]


def test_no_import_circle():
    graph = import_graph()
    # importing a module imports its package first: lm_eval_ponder.training.loop -> training
    # is not an edge we care about, so only module-to-module edges are followed.
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                raise AssertionError("import circle: " + " -> ".join(path[path.index(n):] + [n]))
            if n not in state:
                visit(n)
        path.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_no_private_name_crosses_a_module():
    mods = modules()
    known = set(mods)
    offences = []
    for m, tree in mods.items():
        aliases = {}
        for target, names in imports(tree, known):
            offences += [f"{m} imports {target}.{n}" for n in names
                         if n.startswith("_") and not n.startswith("__")]
        for node in ast.walk(tree):  # module objects bound to a name, then ``name._private``
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lm_eval_ponder"):
                for a in node.names:
                    if f"{node.module}.{a.name}" in known:
                        aliases[a.asname or a.name] = f"{node.module}.{a.name}"
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname and a.name in known:
                        aliases[a.asname] = a.name
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                offences.append(f"{m} uses {aliases[node.value.id]}.{node.attr}")
    assert not offences, "\n".join(offences)


def test_top_level_holds_foundations_and_entry_points_only():
    top = {p.stem for p in PKG.glob("*.py")} - {"__init__"}
    foundations = FOUNDATIONS
    assert top <= foundations | SHIMS | CONSOLE, sorted(top - foundations - SHIMS - CONSOLE)
    for shim in SHIMS & top:  # a shim re-exports; it defines nothing of its own
        tree = ast.parse((PKG / f"{shim}.py").read_text())
        defined = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
        assert not defined, f"{shim}.py defines {defined}: code belongs in a stage subpackage"


def test_foundations_do_not_import_stages():
    """Shared foundations sit below every stage: they never import a stage."""
    mods = modules()
    known = set(mods)
    for name in sorted(FOUNDATIONS):
        m = f"lm_eval_ponder.{name}"
        if m not in mods:
            continue
        bad = [t for t, _ in imports(mods[m], known)
               if any(t.startswith(f"lm_eval_ponder.{s}") for s in STAGES)]
        assert not bad, f"{m} imports {bad}"


def defined_names(path: Path) -> set[str]:
    """The names a module binds at its top level: definitions, assignments, imports."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def dangling(dotted: str, pkg: Path = PKG) -> bool:
    """Whether ``lm_eval_ponder.a.b[.name]`` names no module (or no top-level name of one)."""
    here = pkg
    parts = dotted.split(".")[1:]
    for i, part in enumerate(parts):
        if (here / part / "__init__.py").is_file():
            here = here / part
        elif (here / f"{part}.py").is_file():
            rest = parts[i + 1:]
            return bool(rest) and rest[0] not in defined_names(here / f"{part}.py")
        else:
            return part not in defined_names(here / "__init__.py")
    return False


def test_named_modules_exist():
    """Every dotted ``lm_eval_ponder.*`` name in the package, the task bindings, the autoload
    module, the README, the pages directly under docs/ and the design pages names a module (or
    a name in one) that exists: the layout moves left ``lm_eval_ponder.tasklib`` and
    ``lm_eval_ponder.extraction`` behind."""
    root = PKG.parent
    texts = [root / "README.md", *sorted(root.glob("docs/*.md")), *sorted(root.glob("docs/design/*.md")),
             root / "lm_eval_ponder_autoload.py", *sorted(root.glob("tasks/*/*.py")),
             *sorted(PKG.rglob("*.py"))]
    stale = [f"{path.relative_to(root)}: {name}" for path in texts
             for name in re.findall(r"lm_eval_ponder(?:\.[A-Za-z_]\w*)+", path.read_text())
             if not name.endswith(".pth") and dangling(name)]
    assert not stale, "\n".join(stale)


def test_named_modules_exist_fails_on_a_moved_module():
    assert dangling("lm_eval_ponder.tasklib") and dangling("lm_eval_ponder.stats.Nothing")
    assert not dangling("lm_eval_ponder.scoring.tasklib")
    assert not dangling("lm_eval_ponder.stats.GenerationText")  # re-exported by an import
    assert not dangling("lm_eval_ponder.evaluation.lm.PonderLM")


# The engine's one door (issue 67): outside ``engine/``, code imports the engine from
# ``lm_eval_ponder.engine`` alone, neither ``engine.loop`` nor ``from engine import loop``.
# Tests are white-box and may reach a module to patch it; so may ``cache_append.py``, whose
# A/B swaps the engine's cache layer for transformers' own.
REPO = PKG.parent
DOOR_FOLDERS = ("lm_eval_ponder", "benchmarks", "studies", "scripts")
INSIDE = (PKG / "engine",)
SWAPS_AN_INTERNAL = {REPO / "benchmarks" / "cache_append.py"}


def engine_submodule_imports(paths: list[Path]) -> list[str]:
    submodules = {p.stem for p in (PKG / "engine").glob("*.py")} - {"__init__"}
    out = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "lm_eval_ponder.engine":
                names = [f"{node.module}.{a.name}" for a in node.names if a.name in submodules]
            elif isinstance(node, (ast.ImportFrom, ast.Import)):
                names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                    [a.name for a in node.names]
            else:
                continue
            out += [f"{path.relative_to(path.parents[1])}:{node.lineno} imports {name}"
                    for name in names if name.startswith("lm_eval_ponder.engine.")]
    return out


def test_nothing_outside_the_engine_imports_its_submodules():
    paths = [p for folder in DOOR_FOLDERS for p in sorted((REPO / folder).rglob("*.py"))
             if not any(inside in p.parents for inside in INSIDE) and p not in SWAPS_AN_INTERNAL]
    assert engine_submodule_imports(paths) == []


def test_a_submodule_import_is_reported(tmp_path):
    (tmp_path / "pkg").mkdir()
    planted = tmp_path / "pkg" / "m.py"
    planted.write_text("from lm_eval_ponder.engine.loop import generate_rows\n"
                       "from lm_eval_ponder.engine import LoopConfig, rows\n")
    assert engine_submodule_imports([planted]) == [
        "pkg/m.py:1 imports lm_eval_ponder.engine.loop",
        "pkg/m.py:2 imports lm_eval_ponder.engine.rows"]


# the hops every generation request takes before the engine (issue 67: four hops, where
# lm-eval's vLLM backend has one; 100 lines of code in five hops before)
REQUEST_PATH = [("evaluation/lm.py", "PonderLM", "generate_until"),
                ("generation/generator.py", "SteeredGenerator", "generate_texts"),
                ("generation/generator.py", "SteeredGenerator", "generate_batch"),
                ("generation/batch.py", "BatchStep", "run")]
REQUEST_PATH_LINES = 70


def code_lines(source: str, cls: str, name: str) -> int:
    """Lines of code of method ``cls.name`` in ``source``: no blank lines, comments or
    docstrings (what a newcomer reads to follow a request)."""
    tree = ast.parse(source)
    klass = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    fn = next(n for n in klass.body if isinstance(n, ast.FunctionDef) and n.name == name)
    skip: set[int] = set()
    for node in ast.walk(fn):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and body and \
                isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            skip |= set(range(body[0].lineno, body[0].end_lineno + 1))
    lines = source.splitlines()
    return sum(1 for n in range(fn.lineno, fn.end_lineno + 1)
               if n not in skip and lines[n - 1].strip()
               and not lines[n - 1].strip().startswith("#"))


def test_the_request_path_reads_in_one_screen():
    counts = {f"{cls}.{name}": code_lines((PKG / path).read_text(), cls, name)
              for path, cls, name in REQUEST_PATH}
    assert sum(counts.values()) <= REQUEST_PATH_LINES, counts


def test_code_lines_count_code_only():
    source = ('class A:\n    def f(self):\n        """Doc\n        string."""\n'
              '        # a comment\n\n        x = 1\n        return x\n')
    assert code_lines(source, "A", "f") == 3  # def, x = 1, return
