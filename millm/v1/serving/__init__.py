"""The OpenAI generation routes' service: Serving (serving.py); a body becomes checked fields
(tools, scoring, prechecks), prompts, an Admitted request (replies) and engine rows
(generation), and the engine's events become bodies (answers)."""
