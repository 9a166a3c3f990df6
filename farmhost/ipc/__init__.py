"""The file protocol with sandboxed agents: watch, claim, validate, authorise, execute once, answer."""
