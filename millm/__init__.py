"""millm: an OpenAI-compatible inference server that lets you see and steer a model's SAE
features."""

__version__ = "0.1.0"
