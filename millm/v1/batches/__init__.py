"""/v1/batches: OpenAI's Batch API over the same serving code as the synchronous routes."""
