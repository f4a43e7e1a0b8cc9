"""Errors the broker raises while performing a client's method.

`ChannelError` is a soft error (RabbitMQ closes the channel); `HardError` closes the whole
connection. Both carry the AMQP reply code and RabbitMQ's text; the session turns them into
channel.close / connection.close naming the method that failed.
"""


class ChannelError(Exception):
    def __init__(self, reply_code: int, reply_text: str) -> None:
        super().__init__(reply_code, reply_text)
        self.reply_code = reply_code
        self.reply_text = reply_text


class HardError(ChannelError):
    pass


class AccessRefused(ChannelError):
    """403 from a permission check (server/authorization.py), made before the method changed
    anything: on a cluster member it waits for a metadata barrier first (a permission just set
    through another member is then here too), as RabbitMQ, which caches no refusal, would let it in."""


class MetadataBehind(Exception):
    """A lookup found nothing, and this cluster member may not have applied yet what a client
    saw committed through another member: the method runs again after a metadata barrier
    (server/metadata_sync.py). Raised before the method changed anything."""
