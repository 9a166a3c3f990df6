"""Telegram: inbound routing, agent replies, the durable outbox and its delivery (docs/telegram.md)."""
