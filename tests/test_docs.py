"""The documentation's links work: every relative link and image in README.md, docs/*.md, the benchmark logs
and configs/README.md names a file of the repository, and every #anchor names a heading of its page; every path
and Python name of the project that these pages and CONTRIBUTING.md cite in code spans exists; the README stays
a front page."""

import ast
import re
from pathlib import Path

import pytest

from tests._tools import REPO as _REPO

REPO = Path(_REPO)
PAGES = sorted([REPO / "README.md", REPO / "configs" / "README.md", *(REPO / "docs").glob("*.md")])
LOGS = sorted((REPO / "docs" / "benchmarks").glob("*.md"))  # dated: their links work, their citations may age
# [text](target) and ![alt](target); the target ends at the first space (a title may follow) or ")".
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)[^)]*\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")


def anchors(page: Path) -> set[str]:
    """GitHub's heading ids: lower case, punctuation other than '-' and '_' dropped, spaces as '-'."""
    text = FENCE.sub("", page.read_text())
    heads = re.findall(r"^#{1,6}\s+(.*?)\s*#*\s*$", text, flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in heads}


def links(page: Path) -> list[str]:
    text = INLINE_CODE.sub("", FENCE.sub("", page.read_text()))
    return LINK.findall(text)


@pytest.mark.parametrize("page", PAGES + LOGS, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_and_anchors_resolve(page):
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ...
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: {dest} does not exist")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading '#{anchor}' in {dest.relative_to(REPO)}")
    assert not broken, f"broken links in {page.relative_to(REPO)}:\n" + "\n".join(broken)


def test_link_checker_sees_links_and_anchors():
    """The parser finds the README's links to every docs page (so an empty match cannot pass the test above)."""
    found = {t.partition("#")[0] for t in links(REPO / "README.md")}
    pages = {f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")}
    assert pages <= found, f"docs pages the README does not link: {sorted(pages - found)}"
    assert "the-demo-and-the-test-suite" in anchors(REPO / "docs" / "measuring.md")


def test_readme_is_a_front_page():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) < 250, f"README.md has {len(lines)} lines: move details into a docs/ page"
    # .ci/run runs exactly the README's test command
    command = "bash tools/setup_env.sh && .venv/bin/python -m pytest -q -n 2"
    assert command in lines
    assert command in (REPO / ".ci" / "run").read_text().splitlines()


# --- cited paths and names -----------------------------------------------------------------------------------
CITING = sorted([*PAGES, REPO / "CONTRIBUTING.md"])
ROOMS = ("backbones", "tasks", "perf", "tools", "configs", "tests", "docs", ".ci")
PACKAGES = ("backbones", "tasks", "perf")
PLACEHOLDER = re.compile(r"[<>*{}$]")  # backbones/<family>.py, docs/benchmarks/*.md, $OUT/...: not one file
COMMANDS = re.compile(r"^```(?:bash|python)$(.*?)^```", re.M | re.S)  # not an untagged block: a sample text
FILE_NAME = re.compile(r"[\w.-]+\.(?:py|md|sh|cfg|toml)")
# `backbones.create`, `tasks.config.keys.ConfigError`, `backbones.ops.table.attention`
PYTHON_NAME = re.compile(r"(?:backbones|tasks|perf)(?:\.\w+)+")


def repository_files(root: Path = REPO) -> set[str]:
    """The names of the files the docs may cite by name alone: the root's files and those of the rooms."""
    found = {p.name for p in root.iterdir() if p.is_file()}
    for room in ROOMS:
        found |= {p.name for p in (root / room).rglob("*") if p.is_file()}
    return found


def module_file(dotted: str, root: Path = REPO) -> Path | None:
    for candidate in (root / (dotted.replace(".", "/") + ".py"), root / dotted.replace(".", "/") / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _bound(body: list[ast.stmt]) -> dict[str, ast.AST]:
    """The names a module or class body binds at its own level (inside if / try blocks too)."""
    out = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                out |= {n.id: node for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out |= {(a.asname or a.name).split(".")[0]: node for a in node.names}
        elif isinstance(node, (ast.If, ast.Try)):
            for block in (node.body, node.orelse, *(h.body for h in getattr(node, "handlers", ()))):
                out |= _bound(block)
    return out


def python_name_exists(name: str, root: Path = REPO) -> bool:
    """Whether ``name`` (``package.module.attr...``) is a module of the project or a name its source binds: read
    from the source, nothing imported."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):  # the longest prefix that is a module
        if path := module_file(".".join(parts[:i]), root):
            break
    else:
        return False
    scope: ast.AST = ast.parse(path.read_text())
    for attr in parts[i:]:
        if not isinstance(scope, (ast.Module, ast.ClassDef)):
            return True  # an attribute of a value: past what the source tells
        found = _bound(scope.body)
        if attr not in found:
            return False
        scope = found[attr]
    return True


def _citations(text: str) -> list[tuple[str, str]]:
    """(kind, token) of what a page cites: repository paths in code spans and command blocks, file names and
    project Python names in code spans. A file named after a possessive ("mmdet's `analyze_results.py`") is
    another project's."""
    out = []
    for block in COMMANDS.findall(text):
        out += [("path", t) for t in re.split(r"[\s=]+", block)]
    body = FENCE.sub("", text)
    for span in re.finditer(r"`([^`\n]+)`", body):
        theirs = re.search(r"\w's\s*$", body[: span.start()])
        for token in re.split(r"[\s,;()\[\]=:'\"]+", span.group(1)):
            token = token.strip(".")
            if "/" in token:
                out.append(("path", token))
            elif FILE_NAME.fullmatch(token) and not theirs:
                out.append(("file", token))
            elif PYTHON_NAME.fullmatch(token):
                out.append(("name", token))
    return out


def missing_citations(text: str, root: Path = REPO) -> tuple[int, list[str]]:
    """(how many citations were checked, those that name nothing of the repository)."""
    files, checked, missing = repository_files(root), 0, []
    for kind, token in _citations(text):
        token = token.rstrip(").,;:")
        if kind == "path":
            if token.split("/")[0] not in ROOMS or PLACEHOLDER.search(token):
                continue  # work_dirs/..., another repository's path, a pattern
            stem, dot, attr = token.rpartition(".")
            exists = (root / token).exists() or bool(
                dot and (root / f"{stem}.py").is_file() and python_name_exists(f"{stem.replace('/', '.')}.{attr}", root)
            )  # tests/_tools.load_tool: a module's path and one of its names
        elif kind == "file":
            exists = token in files
        else:
            exists = python_name_exists(token, root)
        checked += 1
        if not exists:
            missing.append(f"{kind} `{token}`")
    return checked, missing


@pytest.mark.parametrize("page", CITING, ids=lambda p: str(p.relative_to(REPO)))
def test_cited_paths_and_names_exist(page):
    _, missing = missing_citations(page.read_text())
    assert not missing, (
        f"{page.relative_to(REPO)} cites what the repository does not hold (rename the citation, or write a "
        f"placeholder such as <name>):\n" + "\n".join(missing)
    )


def test_citation_checker_sees_paths_names_and_misses():
    checked = sum(missing_citations(p.read_text())[0] for p in CITING)
    assert checked > 300, f"only {checked} citations found: the parser no longer reads the pages"
    sample = (
        "`tools/train.py`, `tools/nope.py`, `backbones.create`, `backbones.nope`, `tasks.config.keys.ConfigError`, "
        "`backbones.ops.table.attention`, `backbones.ops.table.row_local`, `stvit.py`, `nope.py`, "
        "mmdet's `analyze_results.py`, "
        "`tests/_tools.load_tool`, `_base_.pop`, `work_dirs/x.pth`, `backbones/<family>.py`\n"
        "```bash\npython tools/gone.py\n```\n"
    )
    checked, missing = missing_citations(sample)
    assert missing == [
        "path `tools/gone.py`",
        "path `tools/nope.py`",
        "name `backbones.nope`",
        "name `backbones.ops.table.row_local`",
        "file `nope.py`",
    ]
    assert checked == 11
