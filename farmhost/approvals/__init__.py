"""Approval in the chat of control actions the farm profile's rules put under approval."""
