"""/v1/responses said as a chat request and answered back in the Responses API's shape;
ResponsesApi (api.py) is the facade. Upper tier: it calls serving."""
