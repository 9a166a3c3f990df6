"""Lovelace dashboards staged by agents: YAML model, patch operations, content policy, files, actions, screenshots."""
