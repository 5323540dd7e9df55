"""Spark Structured Streaming jobs that keep every view fresh."""
