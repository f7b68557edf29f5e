"""The OpenAI generation routes: Serving (serving.py) is the facade; a body becomes checked
fields (structured, tools, scoring, prechecks), prompts (prompts), an Admitted request
(replies) and engine rows (generation), and the engine's events become bodies (answers).
Upper tier."""
