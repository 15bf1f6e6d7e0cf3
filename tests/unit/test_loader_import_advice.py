"""What a failed import of a Workflow source advises: a module of the project beside the
source, imported by its bare name, was answered "install it ...: python -m pip install
helpers" (a stranger's package of that name, maybe); a relative import in a single-file
entry only "Fix the module". Real files, the real loader."""

from __future__ import annotations

from pathlib import Path

import pytest

from intloom.authoring.loader import load_workflows
from intloom.project import Config

pytestmark = pytest.mark.timeout(60)

SOURCE = '''
import intloom
{imports}

wf = intloom.Workflow("w", version="1")
s = wf.stage("s")


@s.step("a", routes={{"ok": intloom.COMPLETE}})
def a(ctx) -> str:
    return "ok"
'''


def _problem(root: Path, imports: str) -> str:
    (root / "flows" / "sub").mkdir(parents=True)
    (root / "flows" / "sub" / "helpers.py").write_text("LABEL = 'x'\n")
    (root / "flows" / "sub" / "w.py").write_text(SOURCE.format(imports=imports))
    result = load_workflows(root, Config(workflows=("flows/sub/w.py",), port=None))
    [(_source, problem)] = result.problems
    return problem.message


def test_a_module_beside_the_source_is_named_with_the_import_that_finds_it(
        tmp_path: Path) -> None:
    said = _problem(tmp_path / "proj", "from helpers import LABEL")
    assert "No module named 'helpers'" in said, said
    assert ("flows/sub/helpers.py is beside flows/sub/w.py, but a Workflow's modules are "
            "imported from the project's root") in said, said
    assert "import it as flows.sub.helpers (from flows.sub.helpers import ..." in said, said
    assert "pip install" not in said, said


def test_a_relative_import_in_a_single_file_entry_says_how_to_import_instead(
        tmp_path: Path) -> None:
    said = _problem(tmp_path / "proj", "from .helpers import LABEL")
    assert "flows/sub/w.py is imported as a single file" in said, said
    assert "(from flows.sub.x import ...)" in said, said


def test_a_module_found_nowhere_in_the_project_is_still_a_package_to_install(
        tmp_path: Path) -> None:
    said = _problem(tmp_path / "proj", "import no_such_module_anywhere_here")
    assert "install it for the Python the host runs" in said, said


def test_workflows_kept_only_in_a_list_are_named(tmp_path: Path) -> None:
    """Workflows made and kept only in a list said "defines no intloom.Workflow at module
    level", which sent the author looking for one that was not there."""
    root = tmp_path / "proj"
    (root / "flows").mkdir(parents=True)
    (root / "flows" / "many.py").write_text(
        "import intloom\n\n\n"
        "def make(name: str) -> intloom.Workflow:\n"
        "    wf = intloom.Workflow(name, version='1')\n"
        "    wf.stage('s').step('a', routes={'ok': intloom.COMPLETE})(lambda ctx: 'ok')\n"
        "    return wf\n\n\n"
        "ALL = [make('one'), make('two')]\n")
    result = load_workflows(root, Config(workflows=("flows/many.py",), port=None))
    [(_source, problem)] = result.problems
    assert problem.message.startswith(
        "flows/many.py defines no intloom.Workflow at module level: ALL holds Workflows "
        "'one', 'two', which are not bound to names of their own. Bind each to a name"), \
        problem.message


LAZY = '''
import intloom


class _Unconfigured(Exception):
    pass


class Lazy:
    """A lazy proxy, as Django's settings before they are configured: even its __class__
    raises."""

    @property  # type: ignore[misc]
    def __class__(self):
        raise _Unconfigured("settings are not configured")


class Listed(list):
    def __iter__(self):
        raise _Unconfigured("not iterable yet")


class Mapped(dict):
    def values(self):
        raise _Unconfigured("no values yet")


settings = Lazy()
HELD = [Lazy()]
LISTED = Listed([Lazy()])
MAPPED = Mapped(a=Lazy())
globals()[1] = Lazy()  # a name that is not a str
{workflow}
'''


@pytest.mark.parametrize("with_workflow", [True, False])
def test_a_global_whose_class_attribute_raises_does_not_fail_its_source(
        tmp_path: Path, with_workflow: bool) -> None:
    """A module-level lazy proxy (Django's unconfigured ``settings``) whose ``__class__``
    raises failed the whole source with "checking its Workflows raised ...": every global
    was checked with isinstance, which reads ``__class__``."""
    root = tmp_path / "proj"
    (root / "flows").mkdir(parents=True)
    workflow = ("wf = intloom.Workflow('w', version='1')\n"
                "wf.stage('s').step('a', routes={'ok': intloom.COMPLETE})(lambda ctx: 'ok')\n")
    (root / "flows" / "lazy.py").write_text(
        LAZY.format(workflow=workflow if with_workflow else ""))
    result = load_workflows(root, Config(workflows=("flows/lazy.py",), port=None))
    if with_workflow:
        assert result.problems == [] and list(result.workflows) == ["w"], result.problems
        return
    [(_source, problem)] = result.problems
    assert problem.code == "WORKFLOW_LOAD_FAILED", problem
    assert problem.message.startswith(
        "flows/lazy.py defines no intloom.Workflow at module level. Bind each to a name"), \
        problem.message


@pytest.mark.parametrize(("decorator", "said"), [
    ("@s.step", 'Declare a Step as @stage.step("name", routes={"outcome": "next_step"})'),
    ('@s.step("a")', 'Declare a Step as @stage.step("name", routes={"outcome": "next_step"})'),
    ("@s.init()", "Write @stage.init without parentheses, above def init(ctx) -> State"),
])
def test_an_intloom_decorator_written_the_wrong_way_says_how_it_is_written(
        tmp_path: Path, decorator: str, said: str) -> None:
    """A bare @stage.step or an @stage.init() failed with Python's TypeError about a missing
    argument, and "Fix the module"."""
    root = tmp_path / "proj"
    (root / "flows").mkdir(parents=True)
    (root / "flows" / "w.py").write_text(
        "import intloom\n\nwf = intloom.Workflow('w', version='1')\ns = wf.stage('s')\n\n\n"
        f"{decorator}\ndef a(ctx):\n    return 'ok'\n")
    result = load_workflows(root, Config(workflows=("flows/w.py",), port=None))
    [(_source, problem)] = result.problems
    assert "TypeError: Stage." in problem.message and "(line 7 of flows/w.py)" in \
        problem.message, problem.message
    assert f"). {said}" in problem.message, problem.message
    assert problem.message.endswith(". Then restart the host."), problem.message


def test_a_module_beside_the_source_in_a_directory_no_package_can_name(tmp_path: Path) -> None:
    """``my-flows/helpers.py`` beside ``my-flows/w.py``: "import it as my-flows.helpers" was
    no Python. It says the directory is no package name, and the ways out."""
    root = tmp_path / "proj"
    (root / "my-flows").mkdir(parents=True)
    (root / "my-flows" / "helpers.py").write_text("LABEL = 'x'\n")
    (root / "my-flows" / "w.py").write_text(SOURCE.format(imports="from helpers import LABEL"))
    result = load_workflows(root, Config(workflows=("my-flows/w.py",), port=None))
    [(_source, problem)] = result.problems
    said = problem.message
    assert "and my-flows/ is no Python package name: rename the directory" in said, said
    assert "my-flows.helpers" not in said and "pip install" not in said, said


def test_a_package_that_imports_itself_by_its_own_name_is_told_to_import_relatively(
        tmp_path: Path) -> None:
    """A package entry whose module imports it by its own name (``from mypkg import main``):
    the package is loaded under a private name, so that import ran a second copy of it, and
    the load failed with a fact that read as false, "Stage 'main': the Stage has no Step"
    (its Step was declared on the copy's Stage). It works in plain Python."""
    import sys
    import uuid

    name = f"selfpkg{uuid.uuid4().hex[:8]}"
    root = tmp_path / "proj"
    package = root / name
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(
        "import intloom\n\nwf = intloom.Workflow('w', version='1')\nmain = wf.stage('main')\n"
        f"import {name}.steps\n")
    (package / "steps.py").write_text(
        f"import intloom\nfrom {name} import main\n\n\n"
        "@main.step('go', routes={'ok': intloom.COMPLETE})\ndef go(ctx) -> str:\n"
        "    return 'ok'\n")
    try:
        result = load_workflows(root, Config(workflows=(name,), port=None))
        [(_source, problem)] = result.problems
    finally:
        for module in [m for m in sys.modules if m == name or m.startswith(f"{name}.")]:
            del sys.modules[module]
    assert problem.code == "WORKFLOW_DEFINITION_INVALID", problem
    assert problem.message.endswith(
        f"A module of {name}/ imports the package by its own name (import {name}, from "
        f"{name}.x import y): intloom loads a package entry under a private name, so that "
        "import ran a second copy of the package, whose Stages and classes are not the "
        "loaded ones. Import within the package relatively (from . import x, from .x import "
        "y)."), problem.message


def test_a_package_another_source_imports_by_its_name_is_not_told_it_imports_itself(
        tmp_path: Path) -> None:
    """Another source may import a package entry's module by its name (the project root is
    on the path): the package's own mistake was then blamed on an import of itself it never
    made ("A module of flows/ imports the package by its own name")."""
    import sys
    import uuid

    name = f"flows{uuid.uuid4().hex[:8]}"
    root = tmp_path / "proj"
    package = root / name
    package.mkdir(parents=True)
    (package / "shared.py").write_text("LIMIT = 3\n")
    (package / "__init__.py").write_text(
        "import intloom\n\nwf = intloom.Workflow('w', version='1')\nmain = wf.stage('main')\n"
        "\n\n@main.step('go', routes={'ok': 'nowhere'})\ndef go(ctx) -> str:\n"
        "    return 'ok'\n")
    (root / "other.py").write_text(
        SOURCE.format(imports=f"from {name}.shared import LIMIT").replace('"w"', '"other"'))
    try:
        result = load_workflows(root, Config(workflows=("other.py", name), port=None))
    finally:
        for module in [m for m in sys.modules if m == name or m.startswith(f"{name}.")]:
            del sys.modules[module]
    [(_source, problem)] = result.problems
    assert "nowhere" in problem.message, problem.message
    assert "imports the package by its own name" not in problem.message, problem.message
