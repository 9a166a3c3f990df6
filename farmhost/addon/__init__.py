"""farmhost as a Home Assistant add-on: its options, the Supervisor's answers, and the entry point that runs it."""
