"""What every route shares: its app's parts (deps), JSON bodies read strictly (json_body),
X-miLLM-* headers (RFC 8941), replies and SSE framing, errors in OpenAI's shape."""
