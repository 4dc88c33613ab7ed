"""The documentation stays true to the code: every setting listed, every link alive, and
nothing in the repository cites documents that are not in it."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from proxy.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", ROOT / "bench" / "README.md", *sorted(DOCS.glob("*.md"))]

# [text](target) outside code: the target up to a space or the closing parenthesis.
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
_CODE = re.compile(r"`[^`\n]*`")
# Planning documents kept outside the repository, by name or by a path beside the clone. The
# brackets keep this file from matching itself.
_OUTSIDE = re.compile(r"\b([S]PEC|[R]ELIABILITY)(\.md)?\b|\.\./shared/|[/]work[/]shared")
SCANNED = ["proxy", "tests", "bench", "config", "docs", ".ci", "README.md", "Dockerfile", "pyproject.toml"]


def settings_keys() -> list[tuple[str, str]]:
    """(`section.key`, its environment variable) for every field of every settings section, and
    each top-level list (`hooks`) as itself."""
    keys = []
    for section in dataclasses.fields(Settings):
        section_type = type(getattr(Settings(), section.name))
        if not dataclasses.is_dataclass(section_type):
            keys.append((section.name, f"MEMPROXY_{section.name}".upper()))
            continue
        for item in dataclasses.fields(section_type):
            keys.append((f"{section.name}.{item.name}", f"MEMPROXY_{section.name}_{item.name}".upper()))
    return keys


def test_the_settings_walk_finds_every_section() -> None:
    keys = dict(settings_keys())
    assert {k.split(".")[0] for k in keys} == {f.name for f in dataclasses.fields(Settings)}
    assert keys["hooks"] == "MEMPROXY_HOOKS"
    assert keys["store.url"] == "MEMPROXY_STORE_URL"
    assert keys["memory_api.token"] == "MEMPROXY_MEMORY_API_TOKEN"


@pytest.mark.parametrize(("key", "variable"), settings_keys(), ids=[k for k, _ in settings_keys()])
def test_every_settings_key_is_in_the_configuration_page(key: str, variable: str) -> None:
    page = (DOCS / "configuration.md").read_text(encoding="utf-8")
    rows = [line for line in page.splitlines() if line.startswith(f"| `{key}` |")]
    assert rows, f"docs/configuration.md has no row for {key}: add it with its default, variable and meaning"
    assert f"`{variable}`" in rows[0], f"the row of {key} does not name {variable}"


def links(page: Path) -> list[str]:
    """The link targets of a Markdown page, code blocks and code spans left out."""
    text = _CODE.sub("", _FENCE.sub("", page.read_text(encoding="utf-8")))
    return _LINK.findall(text)


def anchors(page: Path) -> set[str]:
    """The anchors GitHub makes of a page's headings."""
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    found = set()
    for heading in re.findall(r"^#+ (.+)$", text, re.M):
        found.add(re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"))
    return found


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_points_at_a_file_that_exists(page: Path) -> None:
    broken = []
    for target in links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
            continue
        path_part, _, fragment = target.partition("#")
        linked = (page.parent / path_part).resolve() if path_part else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif fragment and linked.suffix == ".md" and fragment not in anchors(linked):
            broken.append(f"{target}: no heading makes #{fragment}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_link_check_sees_links_and_skips_code(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# A title\n[ok](#a-title) [gone](missing.md) `[code](nope.md)`\n"
                    "```\n[fenced](nope.md)\n```\n[web](https://example.com)\n", encoding="utf-8")
    assert links(page) == ["#a-title", "missing.md", "https://example.com"]
    assert anchors(page) == {"a-title"}


def repository_lines() -> list[tuple[str, str]]:
    """("path:line", text) of every text file in the scanned parts of the repository."""
    lines = []
    for name in SCANNED:
        top = ROOT / name
        for path in sorted(top.rglob("*") if top.is_dir() else [top]):
            if not path.is_file() or {"__pycache__", "node_modules"} & set(path.parts):
                continue
            try:
                text = path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue
            lines += [(f"{path.relative_to(ROOT)}:{n}", line) for n, line in enumerate(text.splitlines(), 1)]
    return lines


def test_nothing_cites_documents_outside_the_repository() -> None:
    found = [f"{where}: {line.strip()}" for where, line in repository_lines() if _OUTSIDE.search(line)]
    assert not found, ("say the reason itself, or point to a page under docs/:\n" + "\n".join(found))


def test_every_docs_page_the_code_names_exists() -> None:
    named = {(where, page) for where, line in repository_lines() for page in re.findall(r"\bdocs/[\w-]+\.md", line)}
    assert named, "the scan found no reference to docs/ at all"
    missing = sorted(f"{where}: {page}" for where, page in named if not (ROOT / page).is_file())
    assert not missing, "\n".join(missing)


@pytest.mark.parametrize("line", ["# {s} 4: at most 3 hits", "({r} 5.2 case 21)", "see {s}.md section 5", "{r} B11",
                                  "--data {up}/shared/data/locomo/dev.json", "{root}/shared/data/locomo"])
def test_the_citation_check_catches_the_usual_forms(line: str) -> None:
    # Spelt in pieces, so the scan of this file does not find them.
    assert _OUTSIDE.search(line.format(s="SP" + "EC", r="RELI" + "ABILITY", up="..", root="/work"))
    assert not _OUTSIDE.search("OPENAPI_SPEC = 1  # a spec of the API; reliability matters")


def test_every_module_path_in_the_docs_exists() -> None:
    """A module path a page names (`memory/retrieval/block.py`, `http/asgi.py`) is a file of the
    repository: a package move that leaves a page behind fails here."""
    files = [path.relative_to(ROOT).as_posix() for path in ROOT.rglob("*.py") if ".venv" not in path.parts]
    named = {(page.name, path) for page in PAGES if page.name != "changelog.md"
             for path in re.findall(r"`((?:\w+/)*(?:[a-z]\w*|__\w+__)\.py)`", page.read_text())
             if path != "proxy.py"}  # PyPI's package of that name, which the README warns of
    assert named, "the scan found no module path at all"
    missing = sorted(f"{page}: {path}" for page, path in named
                     if not any(file == path or file.endswith("/" + path) for file in files))
    assert not missing, "\n".join(missing)


def test_the_generator_of_the_lookalike_table_writes_the_table_proxy_reads() -> None:
    """tools/lookalikes.py (run by hand, with a package the tests lack) writes where proxy reads it."""
    source = (ROOT / "tools" / "lookalikes.py").read_text()
    found = re.search(r'^OUT = Path\(__file__\)\.resolve\(\)\.parent\.parent((?: / "[^"]+")+)$', source, re.M)
    assert found, "tools/lookalikes.py names its output differently: update this test"
    out = ROOT.joinpath(*re.findall(r'"([^"]+)"', found.group(1)))
    import proxy.redaction.lookalikes as table

    assert out.resolve() == Path(table.__file__).resolve()
