"""The sidecar: reverse proxy, scrapers, schedulers and the command line. Nothing imports this package."""
