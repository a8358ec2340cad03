"""The allocator: assigns items (journals, shards) to members (brokers, consumers) through
keyspace transactions, with one elected leader (the member with the lowest create revision)."""
