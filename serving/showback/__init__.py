"""Showback: usage and cost by tenant and cost pool over a period, as report.md, report.csv, report.json and PNGs.

``report`` builds the document from usage rows and writes it, ``plots`` draws it, ``sources``
reads the rows from Prometheus or from a sidecar (``sidecar`` is that sidecar's endpoint), and
``schedule`` writes reports on a cron schedule inside ``serve``.
"""
