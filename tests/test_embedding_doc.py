"""docs/embedding.md: its Python blocks run as written, in order, from the repository's root."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_embedding_doc_code_runs(monkeypatch):
    pytest.importorskip("torch")
    text = (ROOT / "docs" / "embedding.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= 3
    monkeypatch.chdir(ROOT)
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, "docs/embedding.md", "exec"), namespace)  # noqa: S102 - the doc's own examples
