"""The OpenAI wire vocabulary the API and the service share: request bodies, response bodies,
the field policy over them, and the JSON Schema rules the served schema states. Pure: nothing
here touches the model, the store or HTTP."""
