"""The OpenAI surface (/v1 and its neighbours): chat, completions, embeddings and scoring
(serving/: routes, protocol, service), models, Responses, the tokenizer routes, the field policy,
and the HTTP vocabulary every route shares (http/); objects.py holds the response bodies."""
