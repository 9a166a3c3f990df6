"""Control safety: the profile's actuator rules and policy, the gate, approvals, effects, automatic off, the stop."""
