"""The lab's capabilities, one folder each, named as its route prefix and its docs page: its routes
(routes.py), its wire models (protocol.py), its service (service.py) and its jobs."""
