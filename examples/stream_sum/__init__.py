"""Gazette's stream-sum example on pygazette.

- `messages`: Gazette's `stream_sum.Chunk` and `stream_sum.Sum`, as Go's encoding/json
  writes them, and their journals and mappings;
- `crc64`: the CRC-64 (ECMA) of Go's `hash/crc64`;
- `summer`: the consumer Application (`--app examples.stream_sum.summer:Summer`);
- `chunker`: generates streams of chunks and verifies every final sum exactly once;
- `journalspace.yaml`, `shards.yaml`: its journals and shards.

The example is also an integration test: the chunker fails if a sum is missing, wrong, late
or duplicated.
"""
