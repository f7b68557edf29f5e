"""/v1/responses said as a chat request and answered back in the Responses API's shape, and
stored responses."""
