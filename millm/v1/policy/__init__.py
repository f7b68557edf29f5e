"""The field policy over OpenAI bodies: which fields are honoured, ignored or refused, and the
JSON Schema subset structured output accepts."""
