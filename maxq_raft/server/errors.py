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


class MetadataBehind(Exception):
    """A lookup found nothing, and this cluster member may not have applied yet what a client
    saw committed through another member: the method runs again after a metadata barrier
    (server/metadata_sync.py). Raised before the method changed anything."""
