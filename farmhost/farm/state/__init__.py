"""What the farm is and was: the collector and its files, alerts and their notices, telemetry, history, reports."""
