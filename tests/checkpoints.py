"""The tests' tiny checkpoints, built once a session.

``build`` writes the random-weight checkpoints (``service.tools.testmodel``) that the local
backend's tests share; tests/conftest.py offers them as the session fixture ``models``. They
are read only: a test that changes a checkpoint works on its own copy.
"""

from __future__ import annotations

from pathlib import Path


def build(root: Path) -> dict[str, Path]:
    """The shared checkpoints under ``root``: one per family (Marian: en-de), and a Marian
    en-ja."""
    from service.tools.testmodel import make_test_model

    return {
        "nllb": make_test_model("nllb", root / "nllb"),
        "m2m100": make_test_model("m2m100", root / "m2m100"),
        "marian": make_test_model("marian", root / "marian-en-de"),
        "marian-en-ja": make_test_model("marian", root / "marian-en-ja", target_lang="ja"),
    }
