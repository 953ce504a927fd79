"""Real-server test harness: tiny model builder, server launchers, OTLP receiver."""
