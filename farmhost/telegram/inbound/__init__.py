"""Telegram inbound: long polling, one update at a time routed to an agent run, a command, a button or an offer."""
