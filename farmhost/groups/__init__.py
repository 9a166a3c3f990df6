"""Groups: validating, registering and removing chats bound to folders; the daemon's live registry of them."""
