"""Where a committed batch goes: Redis (hot rows), the change feed, Delta (durable)."""
