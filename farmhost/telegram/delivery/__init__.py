"""Telegram outbound: the durable outbox delivered in order per chat, as HTML with a plain fallback, with retries."""
