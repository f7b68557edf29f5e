"""A GGUF file's header is parsed once while the file is unchanged, by millm and, during a
conversion, by transformers: gguf-py walks a vocabulary value by value (seconds for Gemma 3's
262k tokens), and one load used to walk it four or five times."""

import os

import gguf
import numpy as np

from millm.engine.gguf_meta import HEADERS_KEPT, reader, readers_shared


def write_gguf(path, vocabulary: int = 8):
    """A small GGUF file: a vocabulary and one float32 tensor."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_token_list([f"t{i}" for i in range(vocabulary)])
    writer.add_tensor("output.weight", np.arange(12, dtype=np.float32).reshape(3, 4))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_the_same_file_is_parsed_once_and_a_changed_one_again(tmp_path):
    path = write_gguf(tmp_path / "a.gguf")
    first = reader(path)
    assert reader(path) is first
    assert [t.name for t in first.tensors] == ["output.weight"]
    assert first.fields["tokenizer.ggml.tokens"].contents()[:3] == ["t0", "t1", "t2"]
    changed = write_gguf(tmp_path / "changed.gguf", vocabulary=5)
    os.replace(changed, path)  # a new file under the old name: another size and mtime
    os.utime(path, ns=(10**18, 10**18))
    again = reader(path)
    assert again is not first and len(again.fields["tokenizer.ggml.tokens"].contents()) == 5


def test_only_the_last_headers_are_kept(tmp_path):
    paths = [write_gguf(tmp_path / f"{i}.gguf") for i in range(HEADERS_KEPT + 1)]
    first = reader(paths[0])
    for path in paths[1:]:
        reader(path)
    assert reader(paths[0]) is not first  # dropped when the others came after it


def test_transformers_reads_the_kept_header_while_a_conversion_runs(tmp_path):
    path = write_gguf(tmp_path / "b.gguf")
    kept = reader(path)
    with readers_shared():
        with readers_shared():  # two conversions at once
            assert gguf.GGUFReader(str(path)) is kept
        assert gguf.GGUFReader(str(path)) is kept
    plain = gguf.GGUFReader(str(path))
    assert plain is not kept and type(plain).__name__ == "GGUFReader"
    assert (
        plain.fields["tokenizer.ggml.tokens"].contents()
        == kept.fields["tokenizer.ggml.tokens"].contents()
    )
