"""Message storage for MaxQ-Raft (installed as `maxq_raft.storage`).

The `SegmentStore` interface and its in-memory and RocksDB implementations arrive with the
storage issue; today queues keep their messages in memory.
"""
