"""MaxQ-Raft: an AMQP 0-9-1 message broker whose metadata and queues are replicated with Raft."""

__version__ = "0.1.0"
