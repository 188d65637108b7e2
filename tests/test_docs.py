"""The documents a user reads first stay short, findable and true to the code (issue 53): the
README's two commands open it, its table of `--model ponder` arguments is exactly
``PonderLM.__init__``'s, it names the folder results land in, no page under docs/ grows past
40 KB, and every relative link points at a file (and a heading) that exists."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from conftest import REPO

README = REPO / "README.md"
DOCS = REPO / "docs"
README_LIMIT = 15 * 1024  # bytes
PAGE_LIMIT = 40 * 1024  # bytes, as `find docs -name '*.md' -size +40k` counts
ARGS_HEADING = "## Model arguments of `--model ponder`"


def table_after(text: str, heading: str) -> list[list[str]]:
    """The cells of the first markdown table after ``heading`` (header and rule left out)."""
    start = text.index(heading)
    rows, seen = [], False
    for line in text[start:].splitlines()[1:]:
        if line.startswith("|"):
            seen = True
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif seen:
            break
    assert len(rows) > 2, f"no table after {heading!r}"
    return rows[2:]


def documented_args(text: str) -> list[str]:
    """The argument each row of the README's model-args table names (its first cell, one
    backticked name)."""
    names = []
    for cells in table_after(text, ARGS_HEADING):
        found = re.fullmatch(r"`([a-z_0-9]+)`", cells[0])
        assert found, f"a model-args row must name one arg in backticks: {cells[0]!r}"
        assert len(cells) == 3 and all(cells), f"a model-args row needs a meaning and a default: {cells}"
        names.append(found.group(1))
    return names


def ponder_args() -> set[str]:
    """``PonderLM.__init__``'s parameters and the answer stops it takes from its kwargs."""
    from lm_eval_ponder.evaluation.lm import PonderLM
    from lm_eval_ponder.generation.settings import ANSWER_STOPS

    params = inspect.signature(PonderLM.__init__).parameters.values()
    return {p.name for p in params if p.name != "self" and p.kind is not p.VAR_KEYWORD} | \
        set(ANSWER_STOPS)


def test_the_readme_table_is_exactly_the_model_args():
    """A row for every parameter of ``PonderLM.__init__`` (less ``self`` and ``**kwargs``, which
    go to HFLM, but with the answer stops it takes from them), and none for a parameter that is
    not there: the two cannot drift."""
    names = documented_args(README.read_text())
    assert len(names) == len(set(names)), "an arg has two rows"
    code = ponder_args()
    assert set(names) == code, (f"missing from the README: {sorted(code - set(names))}; "
                                f"not model args: {sorted(set(names) - code)}")


def test_a_missing_row_is_caught():
    """The comparison can fail: the README without one of its rows names one arg too few."""
    text = README.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `max_rows` |"))
    names = set(documented_args(text.replace(row + "\n", "")))
    assert ponder_args() - names == {"max_rows"}


def test_the_readme_is_short_and_opens_with_its_two_commands():
    text = README.read_text()
    assert len(text.encode()) <= README_LIMIT, f"README.md is {len(text.encode())} bytes"
    first = text.splitlines()[:15]
    main = [line for line in first if line.startswith("bash scripts/setup.sh")]
    assert main, "the set-up-and-run command is not in the first 15 lines"
    for part in ("lm_eval --model ponder", "--output_path", "--log_samples"):
        assert part in main[0], part
    assert "bash .ci/run" in first, "the test command is not in the first 15 lines"


def test_the_readme_names_the_folder_results_land_in():
    """Without ``pretrained=``, lm-eval's results folder is named after the embedded backbone
    (``evaluation.lmeval_output``): the README's path is that folder under its output path."""
    from lm_eval_ponder.backbone import EMBEDDED_MODEL, display_name

    text = README.read_text()
    main = next(line for line in text.splitlines() if line.startswith("bash scripts/setup.sh"))
    output = re.search(r"--output_path (\S+)", main).group(1)
    assert display_name(None) == EMBEDDED_MODEL
    assert f"`{output}/{EMBEDDED_MODEL}/results_" in text


def test_no_page_under_docs_passes_its_limit():
    large = {str(p.relative_to(REPO)): p.stat().st_size for p in DOCS.rglob("*.md")
             if p.stat().st_size > PAGE_LIMIT}
    assert not large, f"over {PAGE_LIMIT} bytes (split the page): {large}"


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", page.read_text(), re.M)}


def broken_links(pages: list[Path], root: Path = REPO) -> list[str]:
    """Every relative link ``[..](target#anchor)`` of ``pages`` whose file (or heading) is not
    there, named relative to ``root``; web links and code blocks are not followed."""
    broken = []
    for page in pages:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            where = (page.parent / path).resolve() if path else page
            if not where.exists():
                broken.append(f"{page.relative_to(root)}: {target}")
            elif anchor and where.suffix == ".md" and anchor not in anchors(where):
                broken.append(f"{page.relative_to(root)}: {target} (no such heading)")
    return broken


def doc_pages() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md")), REPO / "benchmarks" / "README.md",
            REPO / "studies" / "README.md"]


def test_every_relative_link_resolves():
    broken = broken_links(doc_pages())
    assert not broken, "\n".join(broken)


def test_a_broken_link_is_caught(tmp_path):
    """The check can fail: a missing file and a missing heading are reported, a good link, a
    web link and a link inside a code block are not."""
    page = tmp_path / "page.md"
    (tmp_path / "there.md").write_text("# A heading, with `code`\n")
    page.write_text("[ok](there.md) [ok](there.md#a-heading-with-code) [web](https://x.org/y)\n"
                    "[gone](nothere.md) [bad anchor](there.md#nothing)\n```\n[in code](nothing.md)\n```\n")
    assert broken_links([page], tmp_path) == [
        "page.md: nothere.md", "page.md: there.md#nothing (no such heading)"]


def listed_scripts(readme: Path) -> set[str]:
    """The scripts a folder's README lists: the first cell of each row of its table."""
    lines = readme.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| script |"))
    names = set()
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        names.add(re.fullmatch(r"`([\w.]+)`", line.strip("|").split("|")[0].strip()).group(1))
    return names


def test_each_script_folder_lists_its_scripts():
    """benchmarks/README.md and studies/README.md have a row for every script in their folder
    (the question it answers, its command, kept or historical) and none for a script that is
    gone."""
    for folder in ("benchmarks", "studies"):
        here = REPO / folder
        scripts = {p.name for p in here.iterdir() if p.suffix in (".py", ".sh")}
        listed = listed_scripts(here / "README.md")
        assert listed == scripts, (f"{folder}/README.md lacks {sorted(scripts - listed)}, "
                                   f"lists missing {sorted(listed - scripts)}")


def test_committed_cards_name_no_path_of_the_machine_that_wrote_them():
    """Issue 65: the shipped controller's card named ``/root/.cache/...`` and ``/work/main/...``;
    a card travels with its controller, and such paths say nothing to its reader."""
    absolute = re.compile(r"(?<![\w$.~])/(?:root|home|work|tmp|usr|opt|mnt|var)/")
    for card in sorted((REPO / "controllers").rglob("card.md")):
        found = absolute.findall(card.read_text())
        assert not found, f"{card.relative_to(REPO)} names a machine path ({found[0]}...)"


def test_committed_results_say_how_their_flops_are_priced():
    """Issue 65: every committed lm-eval results JSON carries the FLOPs pricing stamp (a run
    since issue 52 was priced so as it ran; an older one was re-priced by a migration since
    retired, docs/results/flops.md)."""
    from lm_eval_ponder.flops import FLOPS_PRICING

    files = sorted((REPO / "results").rglob("results_*.json"))
    assert files
    stamps = (f'"flops_pricing":"{FLOPS_PRICING}"', f'"ponder_flops_pricing":"{FLOPS_PRICING}"')
    unstamped = [f for f in files
                 if not any(s in f.read_text().replace('": "', '":"') for s in stamps)]
    assert not unstamped, f"{len(unstamped)} results without flops_pricing, e.g. {unstamped[0]}"


# A file named in code (``docs/results/x.md``, ``benchmarks/x.py``) must exist: a docstring that
# cites a file the repository no longer has sends a reader nowhere (issue 67: NOTES.md was cited
# in four docstrings after it left). Not files of this repository: the benchmark data's
# (under $LM_EVAL_PONDER_DATA), FractionalReason's, and placeholders.
FILE_REFERENCE = re.compile(  # not a shell variable's ($out/x.json, ${DOC:-x.md})
    r"(?<![\w./$:{-])((?:\w[\w.-]*/)+[\w.-]+\.(?:py|md|sh|json|yaml|txt|toml))")
NOT_OURS = {"gsm8k/train.json", "gsm8k/test.json", "math500/test.json", "gpqa/diamond.json",
            "tasks/base.py", "utils/tools.py", "utils/pca.py", "results/x/results_1.json",
            "out/heldout.json", "out/final.json", "out/name.json", "out/name.md",
            "device/kit/stash.sh", "device/kit/run.sh"}


def dangling_references(paths: list[Path], root: Path = REPO) -> list[str]:
    out = []
    for path in paths:
        text = path.read_text()
        for match in FILE_REFERENCE.finditer(text):
            ref = match.group(1)
            if ref in NOT_OURS or ref.startswith("../shared/"):
                continue
            if not any((base / ref).exists() for base in (REPO, REPO / "lm_eval_ponder",
                                                          path.parent)):
                out.append(f"{path.relative_to(root)}:{text[:match.start()].count(chr(10)) + 1}"
                           f" names {ref}")
    return out


def test_every_file_the_code_names_exists():
    code = [p for folder in ("lm_eval_ponder", "benchmarks", "studies", "scripts")
            for p in sorted((REPO / folder).rglob("*")) if p.suffix in (".py", ".sh")]
    assert dangling_references(code) == []


def test_a_dangling_reference_is_caught(tmp_path):
    text = '"""Measured in docs/NOTES-gone.md and benchmarks/gone.py, not in $out/x.json."""'
    (tmp_path / "m.py").write_text(text)
    found = dangling_references([tmp_path / "m.py"], root=tmp_path)
    assert [f.split(" names ")[1] for f in found] == ["docs/NOTES-gone.md", "benchmarks/gone.py"]
