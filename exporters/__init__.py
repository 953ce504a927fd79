"""Metric names, data model, parsers and collectors: the lowest layer of inferwatch.

This package imports no other inferwatch package and does no network I/O.
"""
