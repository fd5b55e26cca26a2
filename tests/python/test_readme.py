"""The README's "Use from a kernel library (Python)" section: its ```python blocks run
as written (on the emulated driver in CI when run with `-m cuda`, on the CPU path
otherwise)."""

import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"
SECTION = "## Use from a kernel library (Python)"


def section_blocks():
    text = README.read_text(encoding="utf-8")
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    body = text[start : end if end != -1 else len(text)]
    return re.findall(r"```python\n(.*?)```", body, flags=re.S)


def test_the_section_has_python_blocks():
    assert len(section_blocks()) >= 1


@pytest.mark.parametrize("block", range(len(section_blocks())))
def test_readme_kernel_library_snippet_runs(block, capsys):
    code = section_blocks()[block]
    exec(compile(code, f"README.md[{SECTION}][{block}]", "exec"), {"__name__": "__readme__"})
    out = capsys.readouterr().out
    assert "tensor([[2., 2., 2.]," in out


@pytest.mark.cuda
@pytest.mark.parametrize("block", range(len(section_blocks())))
def test_readme_kernel_library_snippet_runs_on_a_gpu(block, capsys):
    import devtensor

    assert devtensor.is_available()
    code = section_blocks()[block]
    exec(compile(code, f"README.md[{SECTION}][{block}]", "exec"), {"__name__": "__readme__"})
    out = capsys.readouterr().out
    assert " ms" in out and "device='cuda:0'" in out
