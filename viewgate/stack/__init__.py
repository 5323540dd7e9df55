"""Local services for development and tests: Kafka (KRaft), Redis, and the jars Spark needs."""
