"""What a server's start imports: the heavy field libraries wait until a job uses them."""

import subprocess
import sys


def test_the_app_imports_without_sae_lens_or_transformer_lens():
    # SAELens brings TransformerLens: about 3.5 s that every start would pay for a training or a
    # grade it may never run (interp/dictionary_training.py imports it where a training needs it).
    code = (
        "import sys, millm.server.app; "
        "print(sorted(m for m in ('sae_lens', 'transformer_lens') if m in sys.modules))"
    )
    found = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert found.stdout.strip() == "[]"
