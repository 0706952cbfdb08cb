"""Benchmark harness comparing gitspout with C git's git-http-backend.

Everything here uses only the Python standard library.  See bench/README.md.
"""
