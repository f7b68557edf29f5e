"""What a GGUF file's header says about its weights."""

from __future__ import annotations

from pathlib import Path


def gguf_file_type(path: Path) -> str | None:
    """The quantization named by a GGUF file's general.file_type (e.g. Q4_1), if recorded."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    field_ = reader.fields.get("general.file_type")
    if field_ is None:
        return None
    value = int(field_.contents())
    try:
        name = gguf.LlamaFileType(value).name
    except ValueError:
        return None
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")
