"""Every shell command and Python block of README.md and docs/*.md runs here, on generated data,
so a page cannot drift from the code (how a page declares its data, skips and scale-downs:
docs_pages.py and docs/architecture.md, "Docs that run").

One test per code block, named by its page and line (``test_block[docs/regression.md:48]``):
``python`` blocks run in one namespace per page, ``sh``/``bash``/``console`` blocks with bash,
both in the page's own temporary folder, in page order; ``text`` and ``json`` blocks are shown
only. A block that is not run says why in its page (a ``skip`` marker); a fence without a
language, a skip without a reason and a marker that points at nothing fail.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shlex
from pathlib import Path

import pytest

from docs_pages import Block, block_problems, console_script, parse_page
from docs_runner import ABSOLUTE_ROOTS, BlockFailed, EarlierFailed, PageRun, Workdir
from docs_setups import SETUPS
from stoker.pipeline.deps import has_cuda

REPO = Path(__file__).resolve().parents[2]
PAGES = [
    parse_page(REPO / n, n) for n in ["README.md", *sorted(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md"))]
]
BLOCKS = [b for page in PAGES for b in page.blocks if b.runs or block_problems(b)]


@pytest.fixture(scope="session")
def page_runs(tmp_path_factory, command_server):
    """One :class:`PageRun` per page, made when its first block runs."""
    folder, socket_path = command_server

    def shell_env(work: Workdir) -> dict:
        env = {k: v for k, v in os.environ.items() if k not in ("XDG_CACHE_HOME", "STOKER_CACHE_DIR")}
        env.update(HOME=str(work.home), PATH=f"{folder}{os.pathsep}{env.get('PATH', '')}", MPLBACKEND="Agg")
        if socket_path:
            env["STOKER_TEST_COMMAND_SERVER"] = socket_path
        return env

    runs: dict[str, PageRun] = {}

    def get(page) -> PageRun:
        if page.path not in runs:
            for done in runs.values():  # the tests come in page order: the others are done
                done.close()
            runs.clear()
            root = tmp_path_factory.mktemp(Path(page.path).stem)
            runs[page.path] = PageRun(page, root, setups=SETUPS, shell_env=shell_env, cuda=has_cuda())
        return runs[page.path]

    yield get
    for run in runs.values():
        run.close()


@pytest.mark.slow  # end to end: about 80 s for all the pages on 2 cores
@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.id)
def test_block(block: Block, page_runs):
    problems = block_problems(block)
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)
    if block.skip:
        pytest.skip(f"{block.id}: {block.skip}")
    page = next(p for p in PAGES if p.path == block.page)
    failure = not_run = None
    try:
        page_runs(page).run(block)
    except BlockFailed as e:
        failure = str(e)
    except EarlierFailed as e:
        not_run = str(e)
    if failure:
        pytest.fail(failure, pytrace=False)
    if not_run:
        pytest.skip(not_run)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.path)
def test_page_markers(page):
    """Markers that point at nothing, and setups that do not exist, fail their page."""
    problems = list(page.problems)
    named = page.setups + [name for block in page.blocks for name in block.before]
    problems += [
        f"{page.path}: no setup named {name!r} (docs_setups.py has {sorted(SETUPS)})"
        for name in named
        if name not in SETUPS
    ]
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)


def _help_examples() -> list:
    """Each line of each command's ``examples:`` (what ``stoker CMD --help`` shows) that runs it."""
    from stoker.tools.cli import COMMANDS

    found = []
    for name, module in COMMANDS.items():
        doc = importlib.import_module(module).__doc__ or ""
        lines = [line.strip() for line in doc.partition("examples:")[2].splitlines() if f"stoker {name}" in line]
        found += [pytest.param(name, line, id=f"{name}:{i}") for i, line in enumerate(lines)]
    return found


@pytest.mark.parametrize("command, line", _help_examples())
def test_help_examples_parse(command, line):
    """An example ``stoker CMD --help`` shows is a command line its parser takes (the commands
    themselves run on the pages, above)."""
    from stoker.tools.cli import get_args_parser

    words = shlex.split(line, comments=True)
    words = words[: words.index(">")] if ">" in words else words
    try:
        args = get_args_parser().parse_args(words[words.index(command) :])
    except SystemExit:
        pytest.fail(f"stoker {command} --help shows an example its parser refuses: {line}", pytrace=False)
    assert args.command == command


@pytest.mark.parametrize("path", sorted((REPO / "examples").glob("*.py")), ids=lambda p: p.name)
def test_example_imports(path):
    """Each recipe in examples/ imports (the tests of the integrations run them)."""
    spec = importlib.util.spec_from_file_location(f"stoker_docs_example_{path.stem}", path)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))


# ---- the runner's own rules, on pages written here ---------------------------------------------
def _page(tmp_path, text: str):
    (tmp_path / "page.md").write_text(text)
    return parse_page(tmp_path / "page.md", "page.md")


def test_a_fence_without_a_language_and_an_unknown_one_fail(tmp_path):
    page = _page(tmp_path, "```\nstoker pack a b\n```\n\n```yaml\na: 1\n```\n\n```text\nshown\n```\n")
    plain, yaml, text = page.blocks
    assert "without a language" in block_problems(plain)[0]
    assert "'yaml'" in block_problems(yaml)[0]
    assert block_problems(text) == [] and not text.runs


def test_skips_need_a_reason_and_markers_a_block(tmp_path):
    page = _page(
        tmp_path,
        "<!-- docs-test: skip: needs a GPU -->\n\n```sh\nnvidia-smi\n```\n\n"
        "<!-- docs-test: skip: -->\n```python\nx = 1\n```\n\n"
        "<!-- docs-test: skip: why -->\nprose\n\n<!-- docs-test: setup: ages -->\n<!-- docs-test: nonsense -->\n"
        "<!-- docs-test: replace: 'a' -> 'b': why -->\n",
    )
    gpu, python = page.blocks
    assert gpu.skip == "needs a GPU" and block_problems(gpu) == []
    assert "needs a reason" in block_problems(python)[0]
    assert page.setups == ["ages"]
    assert [p.split(": ", 1)[1] for p in page.problems] == [
        "the skip marker points at no code block (prose follows it)",
        "unknown docs-test marker 'nonsense' (setup, skip, replace or before)",
        "the replace marker points at no code block (the page ends)",
    ]


def test_replace_markers_rewrite_the_block_and_must_match(tmp_path):
    page = _page(
        tmp_path,
        "<!-- docs-test: replace: \"--epochs 30\" -> \"--epochs 1\", 'crop=224' -> 'crop=32': hours on a CPU -->\n"
        '```sh\nstoker train /fast/x --epochs 30\n```\n\n<!-- docs-test: replace: "a" -> "b" -->\n```sh\na\n```\n',
    )
    block, unreasoned = page.blocks
    assert block.replace == [("--epochs 30", "--epochs 1"), ("crop=224", "crop=32")]
    assert block.replace_reason == "hours on a CPU"
    assert block_problems(block) == [
        "page.md:2: replace: 'crop=224' is not in the block (the page changed: update the marker)"
    ]
    assert "write replace markers as" in block_problems(unreasoned)[0]
    run = PageRun(page, tmp_path / "run", setups={}, shell_env=lambda w: {}, cuda=False)
    assert run.rewrite(block) == f"stoker train {tmp_path / 'run'}/fast/x --epochs 1\n"


def test_a_console_block_runs_its_prompt_lines(tmp_path):
    page = _page(tmp_path, "```console\n$ stoker --version\nstoker 0.2.0\n$ echo done\ndone\n```\n")
    (block,) = page.blocks
    assert block.runs and console_script(block.text) == "stoker --version\necho done\n"


def test_absolute_paths_and_the_cuda_device_are_rewritten(tmp_path):
    page = _page(
        tmp_path,
        '```python\nLoader("/fast/inet/train", device="cuda").cuda(); x.cuda(non_blocking=True)\n'
        'p = "~/data/x", "s3://b/data/x", "runs/data/x", "/home/x"\n```\n'
        "```sh\nstoker train /data/x --device cuda\n```\n",
    )
    python, shell = page.blocks
    on_cpu = PageRun(page, tmp_path / "w", setups={}, shell_env=lambda w: {}, cuda=False)
    root = tmp_path / "w"
    assert on_cpu.rewrite(python) == (
        f'Loader("{root}/fast/inet/train", device="cpu").to("cpu"); x.to("cpu", non_blocking=True)\n'
        'p = "~/data/x", "s3://b/data/x", "runs/data/x", "/home/x"\n'
    )
    assert on_cpu.rewrite(shell) == f"stoker train {root}/data/x --device cpu\n"
    on_gpu = PageRun(page, root, setups={}, shell_env=lambda w: {}, cuda=True)
    assert on_gpu.rewrite(shell) == f"stoker train {root}/data/x --device cuda\n"
    assert set(ABSOLUTE_ROOTS) >= {"fast", "data", "tmp"}


def test_a_reader_a_page_registers_is_gone_after_the_page(tmp_path):
    from stoker.tools.pack.sources import reader_names

    page = _page(
        tmp_path,
        "```python\nfrom stoker.tools.pack.sources import FileReader, register_reader\n\n"
        "@register_reader\nclass PageReader(FileReader):\n    name = 'docs-page-reader'\n```\n",
    )
    run = PageRun(page, tmp_path / "run", setups={}, shell_env=lambda w: {}, cuda=False)
    run.run(page.blocks[0])
    assert "docs-page-reader" in reader_names()
    run.close()
    assert "docs-page-reader" not in reader_names() and "parquet" in reader_names()
