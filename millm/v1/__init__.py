"""The OpenAI surface (/v1 and its neighbours): chat and completions (routes.py, protocol.py,
objects.py, serving/), models, Responses, the tokenizer routes, the field policy, and the HTTP
vocabulary every route shares (http/)."""
