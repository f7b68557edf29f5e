"""Steering evaluations (AxBench's method): a concept, instructions and candidates swept over
strengths; answers rated for the concept, the instruction and fluency, their harmonic mean and
perplexity (settings.py resolves the candidates, scales.py words the ratings, judges.py asks the
model or a remote judge, run.py is the job, book.py keeps the results)."""
