"""The `viewgate` command: sets up and runs the local stack, the engine and the gateway."""
