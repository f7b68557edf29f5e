"""/v1/files: the JSONL files the Batch API reads and writes, as OpenAI's SDK uploads and reads
them."""
