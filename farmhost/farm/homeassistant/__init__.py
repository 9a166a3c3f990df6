"""The Home Assistant client side: REST and WebSocket client, typed errors, transport glue, the live view of states."""
