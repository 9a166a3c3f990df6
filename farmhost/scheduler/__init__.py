"""Scheduled tasks: schedule specs and when they run."""
