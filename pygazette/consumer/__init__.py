"""The consumer framework: applications, shards, transactions, stores, recovery logs."""
