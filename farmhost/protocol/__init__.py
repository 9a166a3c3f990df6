"""The IPC wire format: request models, the result envelope and the closed code sets."""
