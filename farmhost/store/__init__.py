"""SQLite persistence; the only package that writes SQL."""
