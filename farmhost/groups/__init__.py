"""Groups: validating, registering and removing chats bound to workspace folders."""
