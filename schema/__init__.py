"""The view catalog and the storage contract shared by the engine and the gateway.

Nothing in here imports the engine or the gateway; both import from here.
"""
