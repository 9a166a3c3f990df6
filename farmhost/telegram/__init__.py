"""Telegram bridge: outgoing message formatting and delivery."""
