"""The pipeline example: Spark Structured Streaming and a pygazette consumer over journals."""
