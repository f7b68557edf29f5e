"""Reads through attached SAEs that change nothing stored: inspect, contrast, compare,
explain a vector, the unsteered judge. Discovery (facade.py) is the facade. Upper tier."""
