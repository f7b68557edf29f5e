"""/tokenize, /detokenize and /tokenizer_info."""
