"""``inferwatch prelaunch``: the launch checklist run against a deployment, one verdict per line.

``checklist`` holds the items and writes checklist.md/json; ``jitter`` is the delaying proxy; ``prefix``
the shared-prefix load and vLLM's prefix-cache counters; ``baseline`` saves and compares the profile;
``items`` runs each line of the checklist with the load-test, drill and warm-up code.
"""
