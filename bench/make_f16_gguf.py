"""Write an F16 GGUF holding exactly the demo model's dequantised weights, for the llama.cpp column.

The demo ships a Q4_1 file; millm runs its dequantised weights. To compare engines on the same
weights, every tensor is dequantised and stored as F16 (F32 tensors such as norms stay F32),
and all metadata is copied with general.file_type set to MOSTLY_F16.

    .venv/bin/python bench/make_f16_gguf.py OUT.gguf [SOURCE.gguf]
"""

from __future__ import annotations

import sys
from pathlib import Path

import gguf
import numpy as np

SKIP_KEYS = {
    "GGUF.version",
    "GGUF.tensor_count",
    "GGUF.kv_count",
    "general.architecture",
    "general.file_type",
}


def copy_metadata(reader: gguf.GGUFReader, writer: gguf.GGUFWriter) -> None:
    """Every key/value of the source except those the writer sets itself."""
    for key, field in reader.fields.items():
        if key in SKIP_KEYS:
            continue
        main_type = field.types[0]
        sub_type = field.types[-1] if main_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), main_type, sub_type=sub_type)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)


def convert(source: Path, target: Path) -> None:
    """Dequantise every tensor of `source` into an F16 (norms F32) GGUF at `target`."""
    reader = gguf.GGUFReader(str(source))
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(target), arch)
    copy_metadata(reader, writer)
    for tensor in reader.tensors:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        # 1-D tensors (norm weights) stay F32 as llama.cpp's own converter keeps them.
        values = values.astype(np.float32 if values.ndim == 1 else np.float16)
        writer.add_tensor(tensor.name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    if len(sys.argv) > 2:
        source = Path(sys.argv[2])
    else:
        from millm.engine.sources import demo_source

        demo = demo_source()
        source = demo.directory / demo.gguf_file
    convert(source, Path(sys.argv[1]))
    print(f"wrote {sys.argv[1]} from {source}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
