"""Steering evaluations (/api/evaluations, docs/evaluation.md; AxBench's method): candidates
swept over strengths, answers rated for the concept, the instruction and fluency."""
