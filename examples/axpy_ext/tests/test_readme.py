"""The README's "Use from a kernel library (Rust/PyO3)" section: its ```python block runs
as written against this extension (the Rust block is compiled by
`cargo test --doc --features python`)."""

import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[3] / "README.md"
SECTION = "## Use from a kernel library (Rust/PyO3)"


def section_blocks():
    text = README.read_text(encoding="utf-8")
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    return re.findall(r"```python\n(.*?)```", text[start : end if end != -1 else len(text)], flags=re.S)


def test_the_readme_python_block_runs():
    blocks = section_blocks()
    assert len(blocks) == 1
    exec(compile(blocks[0], f"README.md[{SECTION}]", "exec"), {"__name__": "__readme__"})
